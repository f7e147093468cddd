//! The discounted ledger `R` of the predictable mode (spec §3 rule 4): a
//! sampled example charged at its actual clipped norm instead of its
//! threshold. `R_i = R^thr_i - D_i`, with `D_i` the sum of its discounts
//! `rho_t(alpha; v_{b_i}) - rho_t(alpha; v_{min(b_i, bucket(g_i))})` at the
//! steps (shuffled: the epochs) where it was processed below its threshold.
//! `R` depends on the example's hidden sampling bits, so it feeds the
//! estimate only: never a guarantee, an ex-post bound, the filter or a
//! release, which all read `R^thr`.
//!
//! Kept as counts per `(segment, threshold level, charged level)`, sparse
//! (only examples ever processed below their threshold have an entry), so a
//! step adds `O(batch)` and memory grows with the distinct levels an example
//! was processed at, not with the steps.

use super::levels::LevelCount;
use super::Ledger;
use crate::accounting::table::RdpTable;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Steps (or epochs) at which an example was charged at level `to` in the
/// discounted ledger while its threshold was at level `from > to`, under the
/// level history's segment `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(super) struct Discount {
    segment: u32,
    from: u32,
    to: u32,
    count: u64,
}

/// Every example's discounts (empty outside the predictable mode).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Discounts {
    of: HashMap<u32, Vec<Discount>>,
}

impl Discounts {
    /// Example `i` was processed at level `to` below its threshold level `from`
    /// under segment `segment`.
    pub(super) fn add(&mut self, i: usize, segment: u32, from: u32, to: u32) {
        let list = self.of.entry(i as u32).or_default();
        match list
            .iter_mut()
            .find(|d| d.segment == segment && d.from == from && d.to == to)
        {
            Some(d) => d.count += 1,
            None => list.push(Discount {
                segment,
                from,
                to,
                count: 1,
            }),
        }
    }

    /// `rdp -= D_i` (each order at least 0): turns example `i`'s threshold
    /// ledger into its discounted ledger. `tables[s]` is segment `s`'s table.
    pub(super) fn subtract(&self, i: usize, tables: &[Arc<RdpTable>], rdp: &mut [f64]) {
        let Some(list) = self.of.get(&(i as u32)) else {
            return;
        };
        for d in list {
            let Some(table) = tables.get(d.segment as usize) else {
                continue;
            };
            let (high, low) = (table.row(d.from), table.row(d.to));
            let c = d.count as f64;
            for ((o, &h), &l) in rdp.iter_mut().zip(high).zip(low) {
                *o -= c * (h - l);
            }
        }
        for o in rdp.iter_mut() {
            *o = o.max(0.0);
        }
    }

    /// Turns example `i`'s steps per (segment, threshold level) into its
    /// discounted history: each discounted step moves from its threshold level
    /// to the level it was charged at (level 0 costs nothing and is dropped).
    /// What the PLD estimate composes, so that it reads the same ledger as
    /// the RDP estimate. `counts` stays sorted by (segment, level).
    pub(super) fn shift_counts(&self, i: usize, counts: &mut Vec<LevelCount>) {
        let Some(list) = self.of.get(&(i as u32)) else {
            return;
        };
        for d in list {
            if let Some(c) = counts
                .iter_mut()
                .find(|c| (c.segment, c.level) == (d.segment, d.from))
            {
                c.steps = c.steps.saturating_sub(d.count);
            }
            if d.to == 0 {
                continue;
            }
            match counts
                .iter_mut()
                .find(|c| (c.segment, c.level) == (d.segment, d.to))
            {
                Some(c) => c.steps += d.count,
                None => counts.push(LevelCount {
                    segment: d.segment,
                    level: d.to,
                    steps: d.count,
                }),
            }
        }
        counts.retain(|c| c.steps > 0);
        counts.sort_unstable_by_key(|c| (c.segment, c.level));
    }

    /// Whether an image fits a ledger of `n` examples with `segments` history
    /// segments and levels up to `top`.
    pub(super) fn fits(&self, n: usize, segments: usize, top: u32) -> bool {
        self.of.iter().all(|(&i, list)| {
            (i as usize) < n
                && list
                    .iter()
                    .all(|d| (d.segment as usize) < segments && d.to < d.from && d.from <= top)
        })
    }

    /// Heap bytes held (an estimate: about 48 bytes a map entry).
    pub(super) fn bytes(&self) -> usize {
        self.of
            .values()
            .map(|l| 48 + l.capacity() * std::mem::size_of::<Discount>())
            .sum()
    }
}

impl Ledger {
    /// Predictable mode: note the discounts of the processed examples of
    /// `batches` (each at its reported norm, below its threshold), under
    /// history segment `segment`. `O(batch)`.
    pub(super) fn note_discounts(&mut self, batches: &[(&[u64], &[f64])], segment: u32) {
        for (ids, norms) in batches {
            for (&id, &g) in ids.iter().zip(norms.iter()) {
                let i = id as usize;
                let (b, kg) = (self.bucket[i], self.grid.bucket_of(g));
                if kg < b {
                    self.discounts.add(i, segment, b, kg);
                }
            }
        }
    }

    /// Whether example `i` was ever processed below its threshold.
    pub(super) fn has_discounts(&self, i: usize) -> bool {
        self.discounts.of.contains_key(&(i as u32))
    }

    /// Example `i`'s discounted ledger `R` from its threshold ledger `rdp`
    /// (releases included), for its estimate; `None` when it has no discount.
    pub(super) fn discounted(&self, i: usize, rdp: &[f64]) -> Option<Vec<f64>> {
        if !self.has_discounts(i) {
            return None;
        }
        let mut out = rdp.to_vec();
        self.discounts.subtract(i, &self.seg_tables, &mut out);
        Some(out)
    }
}

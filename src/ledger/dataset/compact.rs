//! An example's RDP from its compact form: the one evaluation behind
//! every per-example query, the individual filter's checks, releases and views.
//!
//! # The compact form
//! The ledger keeps no dense RDP row per example. An example's RDP at step `t` is
//! - its closed level counts (`levels.rs`): for each `(segment, level)` it left,
//!   `count x tables[segment].row(level)`, summed and rounded up
//!   ([`LevelHistory::settled_into`]), plus
//! - Poisson: its open run at its bucket `b` from `run_start` to `t`, through the
//!   prefix sums, `P(t)[b] - P(run_start)[b]` (`prefix.rs`): `O(#orders)` however
//!   many steps and changes of hyperparameters the run spans, plus
//! - the releases (one dataset-wide offset, added by the callers).
//!
//! An example still charged only at the top bucket (`ALL_TOP`) has no closed
//! counts and is evaluated as `P(t)[K]`, the worst case's own expression, so the
//! two agree bit for bit; in shuffle mode, an example charged only at the top
//! under one setting is summed charge by charge, as the worst case sums its
//! epochs. A retired example's open run is closed at retirement.
//!
//! # Why it is exact
//! Step `t` charges example `i` at `v_{min(b_i, bucket(g_i))}` (spec §3.3); between
//! two changes of `b_i` every step charges it at `b_i`, so the charges are exactly
//! the closed runs plus the open one, and each closed run's steps of one segment
//! share one table row: the dense row the ledger used to keep, summed step by step,
//! is `sum count x row` in exact arithmetic. The floating sum of `k` non-negative
//! products is within `(k + 1) 2^-53` (relative) of the exact one; the rounding up
//! by `1 + (k + 3) 2^-52` puts it at or above the exact sum and within about
//! `1e-15 k` of it, against the 1e-9 the reference tests allow.
//! Counts are integers, so closing a run (on a move, a retirement or a
//! compaction) adds no rounding at all: the compact form does not drift with the
//! number of steps, unlike a dense row that adds a table row per report.

use super::columns::{ALL_TOP, RETIRED};
use super::levels::LevelHistory;
use crate::accounting::table::RdpTable;
use crate::ledger::prefix::PrefixSums;
use std::sync::Arc;

/// The step at which an example's RDP is read, and through which segment.
#[derive(Debug, Clone, Copy)]
pub(super) enum At {
    /// The live ledger at step `t` (its current step).
    Now(u64),
    /// A view at step `t`: as the ledger computed it before any step `t` began.
    Before(u64),
}

/// What evaluating an example needs: its history, the segments' tables, and
/// (Poisson) the prefix sums. Borrowed field by field, so that the step loop can
/// evaluate while it holds the filter and the prefix sums.
#[derive(Clone, Copy)]
pub(super) struct Eval<'a> {
    pub(super) levels: &'a LevelHistory,
    /// `tables[s]`: the per-bucket table of the history's segment `s`.
    pub(super) tables: &'a [Arc<RdpTable>],
    /// `None` in shuffle mode (charges are all closed at processing).
    pub(super) prefix: Option<&'a PrefixSums>,
    pub(super) top: u32,
}

/// Most charges a shuffled example charged only at the top bucket is summed
/// charge by charge (one per epoch: a run has far fewer).
const SHUFFLED_TOP_SEQUENTIAL: u64 = 1 << 16;

impl Eval<'_> {
    /// Shuffle mode: the top bucket's row and the count of an example charged
    /// only there, under one setting. Its RDP is then summed charge by charge, in
    /// the order the worst case sums its epochs' charges, so that the two agree
    /// bit for bit when the example was charged at every epoch's top (as a dense
    /// row summed per charge did).
    #[inline]
    pub(super) fn shuffled_top_only(&self, i: usize) -> Option<(&[f64], u64)> {
        let (segment, level, count) = self.levels.single_entry(i)?;
        (level == self.top && count <= SHUFFLED_TOP_SEQUENTIAL)
            .then(|| (self.tables[segment as usize].row(level), count))
    }

    /// `out =` example `i`'s own RDP (releases not included) at `at`, given its
    /// threshold bucket and flags.
    #[inline]
    pub(super) fn own_into(&self, i: usize, bucket: u32, flags: u8, at: At, out: &mut [f64]) {
        let Some(prefix) = self.prefix else {
            if let Some((row, count)) = self.shuffled_top_only(i) {
                out.fill(0.0);
                for _ in 0..count {
                    for (o, &r) in out.iter_mut().zip(row) {
                        *o += r;
                    }
                }
            } else {
                self.levels.settled_into(i, self.tables, out);
            }
            return;
        };
        let (st, now) = match at {
            At::Now(t) => (prefix.index_of(t), t),
            At::Before(t) => (prefix.index_before(t), t),
        };
        if flags & ALL_TOP != 0 && flags & RETIRED == 0 {
            prefix.prefix_in(st, now, self.top, out);
            return;
        }
        self.levels.settled_into(i, self.tables, out);
        if flags & RETIRED == 0 {
            prefix.difference_in(st, self.levels.run_start(i), now, bucket, out);
        }
    }

    /// Example `i`'s own RDP at order `j` at step `now` (the filter's order).
    #[inline]
    pub(super) fn own_at(&self, i: usize, bucket: u32, flags: u8, now: u64, j: usize) -> f64 {
        let Some(prefix) = self.prefix else {
            if let Some((row, count)) = self.shuffled_top_only(i) {
                let mut sum = 0.0;
                for _ in 0..count {
                    sum += row[j];
                }
                return sum;
            }
            return self.levels.settled_at(i, self.tables, j);
        };
        if flags & ALL_TOP != 0 && flags & RETIRED == 0 {
            return prefix.prefix_at(now, self.top, j);
        }
        let settled = self.levels.settled_at(i, self.tables, j);
        if flags & RETIRED != 0 {
            settled
        } else {
            settled + prefix.difference_at(self.levels.run_start(i), now, bucket, j)
        }
    }
}

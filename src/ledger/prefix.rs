//! Per-bucket prefix sums over steps (spec §3, "Cost").
//!
//! `P(t)[k][alpha] = sum_{s<t} rho_s(alpha; v_k)` is piecewise linear in `t`: within a
//! run of steps with the same hyperparameters it grows by the same table row every
//! step. We keep one [`Segment`] per run, `P(t) = base + (t - start) row`, so that the
//! accrual of an example over any interval of steps at a fixed threshold costs
//! `O(#orders)` (plus a binary search over segments when the interval spans a
//! change of hyperparameters), whatever the number of steps.

use crate::accounting::table::{RdpTable, StepMechanism};
use std::sync::Arc;

/// A run of steps `start..` sharing one per-bucket RDP table.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    /// First step of the run.
    pub(crate) start: u64,
    /// The hyperparameters of every step in the run.
    pub(crate) mechanism: StepMechanism,
    /// RDP of one step of the run, per bucket and order.
    pub(crate) table: Arc<RdpTable>,
    /// `P(start)`, `(K+1) × #orders`, row-major by bucket.
    base: Vec<f64>,
}

/// The segments of one dataset, in order of `start`.
#[derive(Debug, Clone)]
pub(crate) struct PrefixSums {
    orders: usize,
    buckets: usize,
    segments: Vec<Segment>,
}

impl PrefixSums {
    /// Prefix sums starting at step 0 with `mechanism`.
    pub(crate) fn new(
        mechanism: StepMechanism,
        table: Arc<RdpTable>,
        buckets: usize,
        orders: usize,
    ) -> Self {
        Self {
            orders,
            buckets,
            segments: vec![Segment {
                start: 0,
                mechanism,
                table,
                base: vec![0.0; buckets * orders],
            }],
        }
    }

    /// The segment of the latest step (the one new steps extend).
    pub(crate) fn current(&self) -> &Segment {
        // Never empty: created with one segment, compaction keeps the last.
        &self.segments[self.segments.len() - 1]
    }

    /// Each segment as `(start, mechanism, base)`, for a snapshot: the tables
    /// are not stored (they are recomputed, or taken from the cache, on load).
    pub(crate) fn image(&self) -> Vec<(u64, StepMechanism, Vec<f64>)> {
        self.segments
            .iter()
            .map(|s| (s.start, s.mechanism, s.base.clone()))
            .collect()
    }

    /// Prefix sums rebuilt from [`PrefixSums::image`]; `table` gives each
    /// mechanism's table. `None` when the image is not well formed (no segment,
    /// starts not increasing, a base of the wrong size).
    pub(crate) fn from_image(
        image: Vec<(u64, StepMechanism, Vec<f64>)>,
        buckets: usize,
        orders: usize,
        mut table: impl FnMut(StepMechanism) -> Arc<RdpTable>,
    ) -> Option<Self> {
        if image.is_empty()
            || image.windows(2).any(|w| w[0].0 >= w[1].0)
            || image.iter().any(|s| s.2.len() != buckets * orders)
        {
            return None;
        }
        let segments = image
            .into_iter()
            .map(|(start, mechanism, base)| Segment {
                start,
                mechanism,
                table: table(mechanism),
                base,
            })
            .collect();
        Some(Self {
            orders,
            buckets,
            segments,
        })
    }

    /// Number of segments held.
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }

    /// Heap bytes of the bases (tables are shared through the cache).
    pub(crate) fn bytes(&self) -> usize {
        self.segments.len() * (self.buckets * self.orders * 8 + std::mem::size_of::<Segment>())
    }

    /// Make step `t` (the next step; no step `>= t` is accounted yet) use `mechanism`.
    /// Starts a new segment when the hyperparameters change; a segment in which no
    /// step was applied yet is simply re-labelled.
    pub(crate) fn begin_step(&mut self, t: u64, mechanism: StepMechanism, table: Arc<RdpTable>) {
        let last = self.segments.len() - 1;
        let cur = &mut self.segments[last];
        if cur.mechanism == mechanism {
            return;
        }
        if cur.start >= t {
            cur.mechanism = mechanism;
            cur.table = table;
            return;
        }
        let mut base = vec![0.0; self.buckets * self.orders];
        for k in 0..self.buckets {
            self.prefix_into(
                t,
                k as u32,
                &mut base[k * self.orders..(k + 1) * self.orders],
            );
        }
        self.segments.push(Segment {
            start: t,
            mechanism,
            table,
            base,
        });
    }

    /// Index of the segment holding step `s` (the last one starting at or before it).
    #[inline]
    pub(crate) fn index_of(&self, s: u64) -> usize {
        self.segments
            .partition_point(|seg| seg.start <= s)
            .saturating_sub(1)
    }

    /// `out = P(t)[k]`. The worst case and every example charged only at the top
    /// bucket use this same expression, so they agree bit for bit.
    pub(crate) fn prefix_into(&self, t: u64, k: u32, out: &mut [f64]) {
        self.prefix_in(self.index_of(t), t, k, out);
    }

    /// Index of the segment that held step `t - 1` (segment 0 for `t = 0`): the
    /// one through which `P(t)` was computed before any step `t` was begun. A
    /// view of the ledger at step `t` reads through it, so that a segment begun
    /// at `t` later (new hyperparameters) changes none of its values, not even
    /// their rounding.
    #[inline]
    pub(crate) fn index_before(&self, t: u64) -> usize {
        self.segments
            .partition_point(|seg| seg.start < t)
            .saturating_sub(1)
    }

    /// [`PrefixSums::prefix_into`] through segment `st` (which holds `t`).
    #[inline]
    pub(crate) fn prefix_in(&self, st: usize, t: u64, k: u32, out: &mut [f64]) {
        let seg = &self.segments[st];
        let m = self.orders;
        let base = &seg.base[k as usize * m..(k as usize + 1) * m];
        let row = seg.table.row(k);
        let d = t.saturating_sub(seg.start) as f64;
        for ((o, &b), &r) in out.iter_mut().zip(base).zip(row) {
            *o = b + d * r;
        }
    }

    /// `acc += P(t)[k] - P(since)[k]` for `since <= t` with `P(t)` through segment
    /// `st`: what an example at bucket `k` accrued over steps `since..t`.
    #[inline]
    pub(crate) fn difference_in(&self, st: usize, since: u64, t: u64, k: u32, acc: &mut [f64]) {
        let seg_t = &self.segments[st];
        let row_t = seg_t.table.row(k);
        if since >= seg_t.start {
            // One segment: no cancellation between large bases.
            let d = t.saturating_sub(since) as f64;
            for (a, &r) in acc.iter_mut().zip(row_t) {
                *a += d * r;
            }
            return;
        }
        let seg_s = &self.segments[self.index_of(since)];
        let m = self.orders;
        let range = k as usize * m..(k as usize + 1) * m;
        let (base_t, base_s) = (&seg_t.base[range.clone()], &seg_s.base[range]);
        let row_s = seg_s.table.row(k);
        let dt = t.saturating_sub(seg_t.start) as f64;
        let ds = since.saturating_sub(seg_s.start) as f64;
        for j in 0..m.min(acc.len()) {
            acc[j] += (base_t[j] - (base_s[j] + ds * row_s[j])) + dt * row_t[j];
        }
    }

    /// `P(t)[k][j] - P(since)[k][j]` at one order (the filter's order).
    pub(crate) fn difference_at(&self, since: u64, t: u64, k: u32, j: usize) -> f64 {
        let seg_t = &self.segments[self.index_of(t)];
        let r_t = seg_t.table.row(k)[j];
        if since >= seg_t.start {
            return t.saturating_sub(since) as f64 * r_t;
        }
        let seg_s = &self.segments[self.index_of(since)];
        let idx = k as usize * self.orders + j;
        let p_s =
            seg_s.base[idx] + since.saturating_sub(seg_s.start) as f64 * seg_s.table.row(k)[j];
        (seg_t.base[idx] - p_s) + t.saturating_sub(seg_t.start) as f64 * r_t
    }

    /// `P(t)[k][j]` at one order.
    pub(crate) fn prefix_at(&self, t: u64, k: u32, j: usize) -> f64 {
        let seg = &self.segments[self.index_of(t)];
        seg.base[k as usize * self.orders + j]
            + t.saturating_sub(seg.start) as f64 * seg.table.row(k)[j]
    }

    /// Drop every segment but the current one. The caller must first have settled
    /// every example so that no `since` precedes the current segment.
    pub(crate) fn drop_old_segments(&mut self) {
        let last = self.segments.len() - 1;
        self.segments.drain(..last);
        self.segments.shrink_to_fit();
    }
}

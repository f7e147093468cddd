//! Each example's count of steps per (hyperparameter segment, grid level): the
//! input of its PLD estimate (spec §8).
//!
//! Why one file of about 550 lines: the packed count format below and every
//! read and write of it (encoding, closing an open run, an example's counts)
//! must agree bit for bit, so they are kept where they are read together.
//!
//! # What is counted
//! Step `t` charges example `i` at grid level `k` (spec §3.3): its bucket `b_i`
//! when it is not in the batch, `min(b_i, bucket(g_i))` when it is. The estimate
//! composes, per distinct `(q, sigma)` (a *segment*) and level `k > 0`, the PLD of
//! `SGM(q, sigma*C/v_k)` raised to the number of such steps. Level 0 costs nothing
//! and is not counted. Shuffle mode charges only at processing, one Gaussian
//! (`q = 1`) at the processed level.
//!
//! # Representation: open run + sparse closed counts
//! Between two changes of `b_i` every step charges `i` at `b_i` (a report with
//! `bucket(g_i) = b_i` is charged there too), so in Poisson mode the counts
//! change only when the bucket changes, as the RDP accrual (`prefix.rs`). Per
//! example we keep
//! - `run_start[i]`: the first step of its *open run* at `b_i` (8 bytes), and
//! - `counts[i]`: the closed runs as a sparse list of packed
//!   `(segment, level) -> count` entries (4 bytes each, one per distinct pair
//!   visited; empty, without allocation, for an example never moved off `C`).
//!
//! The list is the example's whole record: its RDP is evaluated from
//! it (`compact.rs`), so it is kept at the information's size. The dataset's
//! distinct `(segment, level)` pairs are numbered once (`pairs`), and an entry is
//! one `u32`: a 19-bit pair id and a 12-bit count (*narrow*, bit 31 clear), or,
//! for a count past 4,095 or a pair id past 2^19, two words (*wide*: bit 31 set
//! with a 31-bit pair id, then a 32-bit count; larger counts spill into repeated
//! wide entries, which readers sum).
//!
//! A report that moves the bucket closes the open run: `[run_start, t)` when the
//! new bucket is lower (step `t` itself is charged at the new level), `[run_start,
//! t + 1)` when it is higher (step `t` was charged at the old one). The run is
//! split over the dataset's segment runs (`runs`, one entry per change of
//! hyperparameters), usually one. A report that keeps the bucket costs nothing,
//! so a step stays `O(batch)`. The list is bounded by segments × levels visited,
//! not by the number of steps or reports.
//!
//! Queries add the open run `[run_start, now)` at the current bucket to the
//! closed counts. A retired example's bucket is 0, so its open run counts nothing.
//!
//! # Limits (fail closed)
//! A pair key holds a 17-bit level (the grid has at most 100,000 buckets) and a
//! 15-bit segment. Past 32,768 distinct segments a bare history withdraws the
//! estimate (`unavailable` says why), never silently truncated; the ledger
//! refuses such a step instead (`has_room_for`), since its RDP depends on the
//! counts.
//!
//! Serialisable (serde) so that ledger snapshots can carry it verbatim.
//!
//! Why one file of about 550 lines of code (the rest are its unit tests):
//! the run-length counts, their pair keys and their limits are one data
//! structure whose invariants every method keeps; `compact.rs` already holds
//! its compaction.

use crate::accounting::table::RdpTable;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Bits of a packed entry's key given to the level.
const LEVEL_BITS: u32 = 17;
/// Most distinct segments a dataset may have for its estimates.
pub const MAX_SEGMENTS: usize = 1 << (32 - LEVEL_BITS);
/// Allocator overhead counted per non-empty list (header and rounding).
const ALLOCATION_OVERHEAD: u64 = 16;

/// One distinct setting of the hyperparameters that a PLD level depends on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SegmentParams {
    /// Poisson sampling rate (1 in shuffle mode: a Gaussian charge).
    pub sampling_rate: f64,
    /// Noise multiplier `sigma` (noise std `sigma * C`).
    pub noise_multiplier: f64,
}

impl SegmentParams {
    /// The parameters of a step's mechanism (a shuffled step is a Gaussian, `q = 1`).
    pub(crate) fn of(mechanism: crate::accounting::table::StepMechanism) -> Self {
        use crate::accounting::table::StepMechanism;
        match mechanism {
            StepMechanism::Poisson { q, sigma } => Self {
                sampling_rate: q,
                noise_multiplier: sigma,
            },
            StepMechanism::Gaussian { sigma } => Self {
                sampling_rate: 1.0,
                noise_multiplier: sigma,
            },
        }
    }
}

/// A count of steps at one (segment, level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelCount {
    /// Index into [`LevelHistory::segments`].
    pub segment: u32,
    /// Grid level `k > 0` (threshold `v_k`).
    pub level: u32,
    /// Number of steps charged there.
    pub steps: u64,
}

/// Per-example counts of steps per (segment, level); see the module docs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LevelHistory {
    /// Distinct hyperparameters seen, indexed by segment id.
    segments: Vec<SegmentParams>,
    /// Poisson: `(first step, segment id)` of each run of equal hyperparameters.
    runs: Vec<(u64, u32)>,
    /// Poisson: per example, the first step of its open run at its bucket
    /// (empty in shuffle mode).
    #[serde(with = "super::flat::u64s")]
    run_start: Vec<u64>,
    /// Distinct `(segment, level)` pairs, by pair id: `segment << 17 | level`.
    pairs: Vec<u32>,
    /// Pair id of each key in `pairs` (rebuilt from it after a load).
    #[serde(skip)]
    pair_ids: HashMap<u32, u32>,
    /// Per example, packed closed counts (see "Representation").
    #[serde(with = "super::flat::u32_lists")]
    counts: Vec<Box<[u32]>>,
    /// Words of entries held over all examples (memory accounting).
    entries: u64,
    /// Examples with a non-empty list (memory accounting).
    lists: u64,
    /// Why estimates are withdrawn for this dataset, if they are.
    unavailable: Option<String>,
}

/// Bits of a narrow entry given to its count.
const COUNT_BITS: u32 = 12;
const COUNT_MASK: u32 = (1 << COUNT_BITS) - 1;
/// Bit 31 of an entry's first word: a wide entry (its count in the next word).
const WIDE: u32 = 1 << 31;
/// Pair ids below this fit a narrow entry.
const NARROW_PAIRS: u32 = 1 << (31 - COUNT_BITS);
const LEVEL_MASK: u32 = (1 << LEVEL_BITS) - 1;

fn pair_key(segment: u32, level: u32) -> u32 {
    (segment << LEVEL_BITS) | level
}

/// `(pair id, count)` of each entry of a packed list, in order (a list cut
/// inside a wide entry ends there; `well_formed` refuses such lists on load).
#[inline(always)]
pub(super) fn entries(list: &[u32]) -> impl Iterator<Item = (u32, u64)> + '_ {
    let mut w = 0;
    std::iter::from_fn(move || {
        let e = *list.get(w)?;
        if e & WIDE == 0 {
            w += 1;
            Some((e >> COUNT_BITS, u64::from(e & COUNT_MASK)))
        } else {
            let c = *list.get(w + 1)?;
            w += 2;
            Some((e & !WIDE, u64::from(c)))
        }
    })
}

/// Append `(pid, count)` to `out`: one narrow word when it fits, else wide
/// entries of at most `u32::MAX` each.
fn encode(pid: u32, mut count: u64, out: &mut Vec<u32>) {
    if pid < NARROW_PAIRS && count <= u64::from(COUNT_MASK) {
        out.push((pid << COUNT_BITS) | count as u32);
        return;
    }
    while count > 0 {
        let take = count.min(u64::from(u32::MAX));
        out.push(WIDE | pid);
        out.push(take as u32);
        count -= take;
    }
}

/// The factor that rounds a sum of `terms` non-negative products up past its
/// exact value: each product and each addition is off by at most one unit
/// roundoff `u = 2^-53` (relative), so the floating sum is at least
/// `exact x (1 - (terms + 1) u)`; multiplying by `1 + (terms + 3) 2^-52` (the
/// factor's and the product's own roundings included) lands at or above the
/// exact sum, and within about `3 (terms + 3) u` above it: far inside 1e-9 for
/// any list a ledger can hold.
#[inline(always)]
pub(crate) fn round_up_factor(terms: usize) -> f64 {
    1.0 + (terms as f64 + 3.0) * f64::EPSILON
}

impl LevelHistory {
    /// The history of `n` examples. `poisson`: every example starts an open run at
    /// step 0 (at its initial bucket `C`); shuffle mode keeps no runs.
    pub(crate) fn new(n: usize, poisson: bool) -> Result<Self, crate::ledger::LedgerError> {
        use super::columns::try_filled;
        Ok(Self {
            run_start: if poisson {
                try_filled(n, 0u64)?
            } else {
                Vec::new()
            },
            counts: try_filled(n, Box::<[u32]>::default())?,
            ..Self::default()
        })
    }

    /// Whether this history has the shape of one for `n` examples (a snapshot's
    /// history is checked against its configuration before it is trusted).
    pub(crate) fn fits(&self, n: usize, poisson: bool) -> bool {
        self.counts.len() == n && self.run_start.len() == if poisson { n } else { 0 }
    }

    /// Whether every entry and run names a known segment and a level of a grid
    /// whose top bucket is `top` (a snapshot's history is checked before any
    /// RDP value is evaluated from it).
    pub(crate) fn refers_within(&self, top: u32) -> bool {
        let segments = self.segments.len();
        let pairs = self.pairs.len();
        self.runs.iter().all(|&(_, s)| (s as usize) < segments)
            && self
                .pairs
                .iter()
                .all(|&k| ((k >> LEVEL_BITS) as usize) < segments && k & LEVEL_MASK <= top)
            && self.counts.iter().all(|list| {
                let mut w = 0;
                while w < list.len() {
                    let e = list[w];
                    let (pid, width) = if e & WIDE == 0 {
                        (e >> COUNT_BITS, 1)
                    } else {
                        (e & !WIDE, 2)
                    };
                    if pid as usize >= pairs {
                        return false;
                    }
                    w += width;
                }
                w == list.len()
            })
    }

    /// The distinct hyperparameters, by segment id.
    pub fn segments(&self) -> &[SegmentParams] {
        &self.segments
    }

    /// Why no estimate can be given for this dataset, if none can.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// The segment id of `params`, registering it if new (`None` past the limit).
    fn segment_of(&mut self, params: SegmentParams) -> Option<u32> {
        if let Some(s) = self.segments.iter().rposition(|p| *p == params) {
            return Some(s as u32);
        }
        if self.segments.len() >= MAX_SEGMENTS {
            self.unavailable = Some(format!(
                "more than {MAX_SEGMENTS} distinct (sampling_rate, noise_multiplier) settings: \
                 the per-example PLD estimate is not kept for this dataset"
            ));
            return None;
        }
        self.segments.push(params);
        Some(self.segments.len() as u32 - 1)
    }

    /// Poisson: the segment of the latest step (`None` before the first).
    pub(crate) fn current_segment(&self) -> Option<u32> {
        self.runs.last().map(|&(_, s)| s)
    }

    /// Step `t` (Poisson) uses `params`: extend the current run or start one.
    pub(crate) fn begin_poisson_step(&mut self, t: u64, params: SegmentParams) {
        if let Some(&(_, s)) = self.runs.last() {
            if self.segments[s as usize] == params {
                return;
            }
        }
        if let Some(s) = self.segment_of(params) {
            match self.runs.last_mut() {
                Some(last) if last.0 >= t => last.1 = s, // no step of it applied
                _ => self.runs.push((t, s)),
            }
        }
    }

    /// The segment id shuffle step with `params` charges at (`None`: withdrawn).
    pub(crate) fn shuffle_segment(&mut self, params: SegmentParams) -> Option<u32> {
        self.segment_of(params)
    }

    /// Poisson: example `i` leaves bucket `level`; its open run ends before step
    /// `end` and the next one starts there.
    #[inline]
    pub(crate) fn close_run(&mut self, i: usize, level: u32, end: u64) {
        let start = std::mem::replace(&mut self.run_start[i], end);
        if level == 0 || end <= start || self.unavailable.is_some() {
            return;
        }
        let mut r = self.runs.partition_point(|run| run.0 <= start).max(1) - 1;
        while let Some(&(run_start, segment)) = self.runs.get(r) {
            if run_start >= end {
                break;
            }
            let run_end = self.runs.get(r + 1).map_or(u64::MAX, |n| n.0);
            let steps = end.min(run_end) - start.max(run_start);
            self.add(i, segment, level, steps);
            r += 1;
        }
    }

    /// Shuffle: example `i` was processed at `level` in segment `segment`.
    #[inline]
    pub(crate) fn charge(&mut self, i: usize, segment: u32, level: u32) {
        if level > 0 && self.unavailable.is_none() {
            self.add(i, segment, level, 1);
        }
    }

    /// The id of pair `(segment, level)`, numbering it if new.
    fn pair_id(&mut self, segment: u32, level: u32) -> u32 {
        if self.pair_ids.len() != self.pairs.len() {
            // A loaded history: its index is not stored.
            self.pair_ids = (0u32..).zip(&self.pairs).map(|(i, &k)| (k, i)).collect();
        }
        let key = pair_key(segment, level);
        if let Some(&id) = self.pair_ids.get(&key) {
            return id;
        }
        // At most 2^15 segments x 100,001 levels: far fewer pairs than the
        // 2^31 a wide entry can name before memory would run out.
        let id = self.pairs.len() as u32;
        self.pairs.push(key);
        self.pair_ids.insert(key, id);
        id
    }

    /// Add `steps` at `(segment, level)` to example `i`'s closed counts.
    fn add(&mut self, i: usize, segment: u32, level: u32, steps: u64) {
        if steps == 0 {
            return;
        }
        let pid = self.pair_id(segment, level);
        let list = &mut self.counts[i];
        // In place: an entry of this pair with room for `steps`.
        let mut w = 0;
        while w < list.len() {
            let e = list[w];
            if e & WIDE == 0 {
                if e >> COUNT_BITS == pid
                    && u64::from(e & COUNT_MASK) + steps <= u64::from(COUNT_MASK)
                {
                    list[w] = e + steps as u32;
                    return;
                }
                w += 1;
            } else {
                if e & !WIDE == pid && u64::from(list[w + 1]) + steps <= u64::from(u32::MAX) {
                    list[w + 1] += steps as u32;
                    return;
                }
                w += 2;
            }
        }
        // A new pair, or a count that outgrew its entry: re-encode the list with
        // this pair's total, growing it by exactly what is needed.
        let mut merged: Vec<(u32, u64)> = Vec::with_capacity(list.len() + 1);
        for (p, c) in entries(list).chain(std::iter::once((pid, steps))) {
            match merged.iter_mut().find(|(q, _)| *q == p) {
                Some(m) => m.1 += c,
                None => merged.push((p, c)),
            }
        }
        let mut v = Vec::with_capacity(list.len() + 1);
        for (p, c) in merged {
            encode(p, c, &mut v);
        }
        if list.is_empty() {
            self.lists += 1;
        }
        self.entries = self.entries + v.len() as u64 - list.len() as u64;
        *list = v.into_boxed_slice();
    }

    /// Example `i`'s counts at step `now`, one per (segment, level), sorted:
    /// the closed counts plus (Poisson) its open run `[run_start, now)` at
    /// `bucket`. `None` when the estimate is withdrawn for the dataset.
    pub fn example_counts(&self, i: usize, bucket: u32, now: u64) -> Option<Vec<LevelCount>> {
        if self.unavailable.is_some() {
            return None;
        }
        let mut out: Vec<LevelCount> = entries(&self.counts[i])
            .map(|(pid, steps)| {
                let key = self.pairs[pid as usize];
                LevelCount {
                    segment: key >> LEVEL_BITS,
                    level: key & LEVEL_MASK,
                    steps,
                }
            })
            .collect();
        if let Some(&start) = self.run_start.get(i) {
            if bucket > 0 && start < now {
                let mut r = self.runs.partition_point(|run| run.0 <= start).max(1) - 1;
                while let Some(&(run_start, segment)) = self.runs.get(r) {
                    if run_start >= now {
                        break;
                    }
                    let run_end = self.runs.get(r + 1).map_or(u64::MAX, |n| n.0);
                    out.push(LevelCount {
                        segment,
                        level: bucket,
                        steps: now.min(run_end) - start.max(run_start),
                    });
                    r += 1;
                }
            }
        }
        out.sort_unstable_by_key(|c| (c.segment, c.level));
        out.dedup_by(|later, kept| {
            let same = (later.segment, later.level) == (kept.segment, kept.level);
            if same {
                kept.steps += later.steps;
            }
            same
        });
        out.retain(|c| c.steps > 0);
        Some(out)
    }

    /// Pairs numbered so far (pair ids are `0..pair_count()`).
    pub(super) fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// `(segment, level)` of pair `pid` (below [`LevelHistory::pair_count`]).
    pub(super) fn pair(&self, pid: u32) -> (u32, u32) {
        let key = self.pairs[pid as usize];
        (key >> LEVEL_BITS, key & LEVEL_MASK)
    }

    /// Example `i`'s packed closed counts (read with [`entries`]).
    #[inline(always)]
    pub(super) fn list(&self, i: usize) -> &[u32] {
        &self.counts[i]
    }

    /// Poisson: the first step of example `i`'s open run at its bucket.
    #[inline]
    pub(crate) fn run_start(&self, i: usize) -> u64 {
        self.run_start[i]
    }

    /// Whether a step with `params` can be recorded: `false` only when it would be
    /// a new distinct setting past [`MAX_SEGMENTS`]. The ledger refuses such a
    /// step (the history is the source of its RDP and may not be withdrawn).
    pub(crate) fn has_room_for(&self, params: SegmentParams) -> bool {
        self.segments.len() < MAX_SEGMENTS || self.segments.contains(&params)
    }

    /// `out = ` example `i`'s closed counts as RDP: the sum over its entries of
    /// `count x tables[segment].row(level)`, rounded up (see `compact.rs`).
    /// `tables[s]` is the per-bucket table of segment `s`.
    #[inline]
    pub(crate) fn settled_into(&self, i: usize, tables: &[Arc<RdpTable>], out: &mut [f64]) {
        out.fill(0.0);
        let list = &self.counts[i];
        for (pid, count) in entries(list) {
            let key = self.pairs[pid as usize];
            let row = tables[(key >> LEVEL_BITS) as usize].row(key & LEVEL_MASK);
            let c = count as f64;
            for (o, &r) in out.iter_mut().zip(row) {
                *o += c * r;
            }
        }
        if !list.is_empty() {
            let up = round_up_factor(list.len());
            for o in out.iter_mut() {
                *o *= up;
            }
        }
    }

    /// Example `i`'s only entry as `(segment, level, count)`, if it has exactly one.
    #[inline]
    pub(crate) fn single_entry(&self, i: usize) -> Option<(u32, u32, u64)> {
        let mut it = entries(&self.counts[i]);
        let (pid, count) = it.next()?;
        if it.next().is_some() {
            return None;
        }
        let key = self.pairs[pid as usize];
        Some((key >> LEVEL_BITS, key & LEVEL_MASK, count))
    }

    /// [`LevelHistory::settled_into`] at one order `j` (bit for bit its `out[j]`).
    #[inline]
    pub(crate) fn settled_at(&self, i: usize, tables: &[Arc<RdpTable>], j: usize) -> f64 {
        let list = &self.counts[i];
        let mut sum = 0.0;
        for (pid, count) in entries(list) {
            let key = self.pairs[pid as usize];
            sum += count as f64 * tables[(key >> LEVEL_BITS) as usize].row(key & LEVEL_MASK)[j];
        }
        if list.is_empty() {
            sum
        } else {
            sum * round_up_factor(list.len())
        }
    }

    /// Heap bytes held (allocator overhead of the per-example lists included).
    pub(crate) fn bytes(&self) -> u64 {
        (self.run_start.capacity() * 8
            + self.counts.capacity() * std::mem::size_of::<Box<[u32]>>()
            + self.runs.capacity() * 16
            + self.pairs.capacity() * 4
            + self.pair_ids.capacity() * 12
            + self.segments.capacity() * std::mem::size_of::<SegmentParams>()) as u64
            + self.entries * 4
            + self.lists * ALLOCATION_OVERHEAD
    }

    /// Prefetch example `i`'s closed counts themselves (up to three cache
    /// lines: 48 words, more than almost any list holds). The all-epsilons
    /// pass reads the lists in id order, but each is its own allocation: without
    /// this every example costs a cache miss the hardware cannot foresee.
    #[inline(always)]
    pub(crate) fn prefetch_list(&self, i: usize) {
        if let Some(list) = self.counts.get(i) {
            // The words at the start of each cache line the list spans.
            let addr = list.as_ptr() as usize;
            let end = list.len().min(48);
            let mut w = 0;
            while w < end {
                super::columns::prefetch(list, w);
                w += 16 - ((addr / 4 + w) % 16);
            }
        }
    }

    /// Prefetch example `i`'s run start and list header (the step loop).
    #[inline(always)]
    pub(crate) fn prefetch(&self, i: usize) {
        super::columns::prefetch(&self.run_start, i);
        super::columns::prefetch(&self.counts, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(q: f64, sigma: f64) -> SegmentParams {
        SegmentParams {
            sampling_rate: q,
            noise_multiplier: sigma,
        }
    }

    #[test]
    fn runs_split_over_segments_and_counts_merge() {
        let mut h = LevelHistory::new(2, true).unwrap();
        let (a, b) = (p(0.1, 1.0), p(0.1, 2.0));
        for t in 0..10 {
            h.begin_poisson_step(t, if (3..6).contains(&t) { b } else { a });
        }
        // Example 0 at level 100 for steps 0..7, then level 40 from step 7 on.
        h.close_run(0, 100, 7);
        let c = h.example_counts(0, 40, 10).unwrap();
        let got: Vec<(u32, u32, u64)> = c.iter().map(|c| (c.segment, c.level, c.steps)).collect();
        assert_eq!(got, vec![(0, 40, 3), (0, 100, 4), (1, 100, 3)]);
        // Back to 100 at step 9: level 40 for 7..9 merges with nothing yet.
        h.close_run(0, 40, 9);
        h.close_run(0, 100, 10);
        let got: Vec<(u32, u32, u64)> = h
            .example_counts(0, 7, 10)
            .unwrap()
            .iter()
            .map(|c| (c.segment, c.level, c.steps))
            .collect();
        assert_eq!(got, vec![(0, 40, 2), (0, 100, 5), (1, 100, 3)]);
        // Untouched example: its open run only.
        let got = h.example_counts(1, 100, 10).unwrap();
        assert_eq!(got.iter().map(|c| c.steps).sum::<u64>(), 10);
        assert_eq!(h.entries, 3);
    }

    #[test]
    fn huge_counts_spill_into_repeated_entries() {
        let mut h = LevelHistory::new(1, false).unwrap();
        let s = h.shuffle_segment(p(1.0, 1.0)).unwrap();
        h.add(0, s, 5, 0xFFFF_FFFF + 10);
        h.add(0, s, 5, 3);
        let c = h.example_counts(0, 5, 0).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].steps, 0xFFFF_FFFF + 13);
    }

    #[test]
    fn counts_past_a_narrow_entry_widen_and_stay_exact() {
        let mut h = LevelHistory::new(2, false).unwrap();
        let s = h.shuffle_segment(p(1.0, 1.0)).unwrap();
        h.add(0, s, 9, 4000);
        h.add(0, s, 3, 1);
        assert_eq!(h.counts[0].len(), 2, "two narrow words");
        h.add(0, s, 9, 95);
        assert_eq!(h.counts[0].len(), 2, "4095 still fits in place");
        h.add(0, s, 9, 1);
        assert_eq!(h.counts[0].len(), 3, "4096 takes a wide entry");
        h.add(0, s, 9, 10);
        let got: Vec<(u32, u64)> = h
            .example_counts(0, 0, 0)
            .unwrap()
            .iter()
            .map(|c| (c.level, c.steps))
            .collect();
        assert_eq!(got, vec![(3, 1), (9, 4106)]);
        assert_eq!(h.entries, 3);
        assert!(h.refers_within(9) && !h.refers_within(8));
        // A list cut inside a wide entry is refused.
        h.counts[1] = vec![WIDE].into_boxed_slice();
        assert!(!h.refers_within(9));
    }

    #[test]
    fn too_many_segments_withdraw_the_estimate() {
        let mut h = LevelHistory::new(1, true).unwrap();
        for t in 0..=MAX_SEGMENTS as u64 {
            h.begin_poisson_step(t, p(0.1, 1.0 + t as f64));
        }
        assert!(h.unavailable().is_some());
        assert!(h.example_counts(0, 3, 10).is_none());
    }
}

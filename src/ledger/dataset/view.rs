//! A consistent view of every example's RDP at one step while later steps go on:
//! a release computes its `O(n × #orders)` pass from the view,
//! in chunks under the dataset's read lock, instead of holding the write lock for
//! the whole pass, so steps keep flowing while it runs.
//!
//! Opening a view records the step and the release offset. While it is open a
//! step (or refresh, or retirement) saves an example's RDP row as at the view's
//! step before it changes the example's state for the first time (evaluated from
//! its compact form, `compact.rs`), which costs `O(batch × entries × #orders)` on
//! the step and nothing when no view is open. The view then reads, for every
//! example, its RDP at the view's step: the saved row when the example changed
//! since, an evaluation of the live state otherwise (it has not changed). The
//! prefix sums only grow, so `P(step)` is still at hand.
//!
//! Compaction rewrites every example and drops old segments, so a view could
//! not read through it. It must not wait for the view either: it falls at the
//! step where the segments outgrow their budget, and a replay of the log (which
//! never has a view open) compacts at that step, so a compaction held back
//! would leave the live ledger rounded differently from its own replay.
//! Instead, a compaction with a view open first computes the view's remaining
//! epsilons ([`Ledger::settle_view`], `O(n × #orders)` once, like the
//! compaction itself) and the view serves them from there. At most one view is
//! open per ledger.

use super::compact::At;
use super::left_out::ReleaseShares;
use super::Ledger;
use crate::accounting::conversion::Conversion;
use crate::ledger::convert::Converter;
use crate::ledger::error::LedgerError;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Names an open view; a token whose view was closed (or whose ledger was
/// replaced by a reload) reads nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewToken {
    serial: u64,
    step: u64,
}

impl ViewToken {
    /// The step the view shows: every example as it was before step `step`.
    pub fn step(&self) -> u64 {
        self.step
    }
}

/// Hashes an example id for the saved-state map: ids are small dense integers,
/// so a multiplication spreads them well, at a fraction of SipHash's cost on a
/// lookup the release makes for every saved example.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// An open view (see the module note).
#[derive(Debug)]
pub(super) struct EpochView {
    token: ViewToken,
    /// The conversion constants of the release's `delta` and conversion, fixed
    /// when the view opens (a compaction computes the view's epsilons ahead
    /// with them), computed once for all the chunks read.
    conv: Converter,
    /// Epsilons computed ahead by a compaction, for the examples from the first
    /// number on; once present the view reads only these and saves nothing.
    ahead: Option<(usize, Vec<f64>)>,
    /// The release offset at the view's step.
    release: Vec<f64>,
    /// The release charges of examples left out of a release, at the view's
    /// step (shared until a release is charged: `left_out.rs`).
    shares: Arc<ReleaseShares>,
    /// One bit per example: saved since the view opened (the common case of a
    /// read, not saved, costs one bit test).
    changed: Vec<u64>,
    /// Where each saved example's row is in `rows`.
    slot: HashMap<u32, u32, BuildHasherDefault<IdHasher>>,
    /// Examples saved.
    saved_count: usize,
    /// Saved RDP rows at the view's step (releases not included), by slot
    /// (`#orders` each), in one allocation.
    rows: Vec<f64>,
    /// Examples below this id were read already; their changes need no copy.
    read_below: AtomicUsize,
}

impl Clone for EpochView {
    fn clone(&self) -> Self {
        EpochView {
            token: self.token,
            conv: self.conv.clone(),
            ahead: self.ahead.clone(),
            release: self.release.clone(),
            shares: self.shares.clone(),
            changed: self.changed.clone(),
            slot: self.slot.clone(),
            saved_count: self.saved_count,
            rows: self.rows.clone(),
            read_below: AtomicUsize::new(self.read_below.load(Ordering::Acquire)),
        }
    }
}

impl EpochView {
    /// Whether example `i`'s row must be saved before it changes: not when it
    /// was saved already (the first save is the state at the view's step), when
    /// the view has read it already, or when a compaction computed ahead.
    #[inline]
    pub(super) fn needs_save(&self, i: usize) -> bool {
        self.ahead.is_none()
            && self.changed[i / 64] & (1u64 << (i % 64)) == 0
            && i >= self.read_below.load(Ordering::Acquire)
    }

    /// The view's step (a saved row is evaluated as before it).
    pub(super) fn step(&self) -> u64 {
        self.token.step
    }

    /// Keep `row` as example `i`'s RDP at the view's step (after `needs_save`).
    #[inline]
    pub(super) fn save(&mut self, i: usize, row: &[f64]) {
        self.changed[i / 64] |= 1u64 << (i % 64);
        self.slot.insert(i as u32, self.saved_count as u32);
        self.saved_count += 1;
        self.rows.extend_from_slice(row);
    }

    /// Example `i`'s saved row, if it changed since the view opened.
    #[inline]
    fn saved(&self, i: usize, m: usize) -> Option<&[f64]> {
        if self.changed[i / 64] & (1u64 << (i % 64)) == 0 {
            return None;
        }
        let k = *self.slot.get(&(i as u32))? as usize;
        Some(&self.rows[k * m..(k + 1) * m])
    }

    /// Heap bytes held by the view.
    pub(super) fn bytes(&self) -> usize {
        self.rows.capacity() * 8
            + self.slot.capacity() * 16
            + self.changed.capacity() * 8
            + self.release.capacity() * 8
            + self.conv.bytes()
            + self.ahead.as_ref().map_or(0, |(_, e)| e.capacity() * 8)
    }
}

/// Save example `i`'s row into the open view, if any, before changing its
/// state. A macro over the ledger's fields (not a method) so that callers
/// holding borrows of other fields (the prefix sums, the filter) can use it;
/// `$prefix` is the ledger's prefix sums (`None` in shuffle mode).
macro_rules! save_for_view {
    ($ledger:expr, $i:expr, $prefix:expr) => {
        if let Some(view) = $ledger.view.as_mut() {
            let i: usize = $i;
            if view.needs_save(i) {
                let eval = $crate::ledger::dataset::compact::Eval {
                    levels: &$ledger.levels,
                    tables: &$ledger.seg_tables,
                    prefix: $prefix,
                    top: $ledger.top,
                };
                let mut row = vec![0.0; $ledger.m];
                eval.own_into(
                    i,
                    $ledger.bucket[i],
                    $ledger.flags[i],
                    $crate::ledger::dataset::compact::At::Before(view.step()),
                    &mut row,
                );
                view.save(i, &row);
            }
        }
    };
}
pub(super) use save_for_view;

impl Ledger {
    /// Open a view of every example at the current step, to be read as
    /// epsilons at `delta` by `conversion`. Refused while another view is open
    /// (releases take turns) or while a multi-part step is incomplete (a
    /// release could not be charged then).
    pub fn open_view(
        &mut self,
        delta: f64,
        conversion: Conversion,
    ) -> Result<ViewToken, LedgerError> {
        Self::check_delta(delta)?;
        self.refuse_if_pending("a release")?;
        if let Some(v) = &self.view {
            return Err(LedgerError::Conflict {
                step: self.next_step,
                reason: format!(
                    "a release computed from step {} is still in progress",
                    v.token.step
                ),
            });
        }
        self.view_serial += 1;
        let token = ViewToken {
            serial: self.view_serial,
            step: self.next_step,
        };
        self.view = Some(EpochView {
            token,
            conv: self.release_converter(delta, conversion),
            ahead: None,
            release: self.release.clone(),
            shares: self.shares.clone(),
            changed: vec![0; self.n.div_ceil(64)],
            slot: HashMap::default(),
            saved_count: 0,
            rows: Vec::new(),
            read_below: AtomicUsize::new(0),
        });
        Ok(token)
    }

    /// Close the view `token` names; `false` when it is not open (closed before,
    /// or the ledger was reloaded since).
    pub fn close_view(&mut self, token: ViewToken) -> bool {
        if self.view.as_ref().is_some_and(|v| v.token == token) {
            self.view = None;
            return true;
        }
        false
    }

    /// Whether a view is open (a release is computing from it).
    pub fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// Examples whose state the open view keeps a copy of (changed since it opened).
    pub fn view_saved(&self) -> usize {
        self.view.as_ref().map_or(0, |v| v.saved_count)
    }

    /// Epsilons of the examples in `ids` as they were at the view's step (at
    /// the view's `delta` and conversion), appended to `out`:
    /// `O(|ids| × #orders)`. Bit for bit what [`Ledger::epsilons`] gave at that
    /// step. A view is read once, in order: `ids` starts where the last read
    /// ended (at 0 the first time), so that steps need not keep copies of
    /// examples already read. Refused when the view is not open or `ids` does
    /// not continue the reading.
    pub fn view_epsilons(
        &self,
        token: ViewToken,
        ids: Range<usize>,
        out: &mut Vec<f64>,
    ) -> Result<(), LedgerError> {
        let view = self
            .view
            .as_ref()
            .filter(|v| v.token == token)
            .ok_or_else(|| LedgerError::Conflict {
                step: self.next_step,
                reason: "the release's view of the ledger was closed (the dataset was reloaded)"
                    .to_string(),
            })?;
        let end = ids.end.min(self.n).max(ids.start);
        let read = view.read_below.load(Ordering::Acquire);
        if ids.start != read {
            return Err(LedgerError::Conflict {
                step: self.next_step,
                reason: format!(
                    "a view is read once, in order: the next read starts at {read}, not {}",
                    ids.start
                ),
            });
        }
        match &view.ahead {
            Some((from, epsilons)) => out.extend_from_slice(&epsilons[read - from..end - from]),
            None => self.compute_view_epsilons(view, read..end, out),
        }
        view.read_below.store(end, Ordering::Release);
        Ok(())
    }

    /// The view's epsilons of `ids` from the saved and live state: the one
    /// computation behind reading a view and settling it.
    fn compute_view_epsilons(&self, view: &EpochView, ids: Range<usize>, out: &mut Vec<f64>) {
        let m = self.m;
        // An example changed since the view opened reads its saved row, any
        // other its live state as before the view's step (`pass.rs`).
        let pass = self.pass(
            At::Before(view.token.step),
            &view.release,
            &view.shares,
            &view.conv,
        );
        out.extend(pass.collect(ids, |i| view.saved(i, m), |e| e.epsilon));
    }

    /// Before a compaction rewrites every example: compute the open view's
    /// epsilons not read yet, so that it reads them from there (module note),
    /// and drop the saved copies, which nothing needs any more.
    pub(super) fn settle_view(&mut self) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        if view.ahead.is_some() {
            return;
        }
        let from = view.read_below.load(Ordering::Acquire);
        let mut epsilons = Vec::with_capacity(self.n.saturating_sub(from));
        self.compute_view_epsilons(view, from..self.n, &mut epsilons);
        if let Some(view) = self.view.as_mut() {
            view.ahead = Some((from, epsilons));
            view.slot = HashMap::default();
            view.saved_count = 0;
            view.rows = Vec::new();
            view.changed.fill(0);
        }
    }
}

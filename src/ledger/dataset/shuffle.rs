//! Shuffle mode (spec §2, shuffled fixed-size batches): within an epoch each
//! example is processed once. In the sampled mode it is charged only then, at
//! its clipped norm; in the predictable mode (spec §3.6) its position in the
//! epoch is hidden, so every example's epoch charge is booked at the epoch's
//! first step at the threshold in force for the whole epoch, and the filter
//! retires examples only at epoch boundaries. The worst case is one Gaussian
//! charge at `C` per epoch begun, at that epoch's smallest noise multiplier.

use super::columns::RETIRED;
use super::view::save_for_view;
use super::{Accrual, Ledger};
use crate::ledger::filter::NEVER;

/// Shuffle mode: charges happen only at processing; the worst case is one Gaussian
/// charge at `C` per epoch, at the epoch's smallest noise multiplier.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct ShuffleState {
    pub(super) steps_per_epoch: u64,
    /// Worst-case RDP of all completed epochs.
    pub(super) worst_done: Vec<f64>,
    /// Per order, the largest top-bucket charge of the steps of epoch `epoch`.
    pub(super) epoch_max: Vec<f64>,
    /// The epoch of the latest step (meaningless before the first step).
    pub(super) epoch: u64,
    pub(super) started: bool,
    /// Predictable mode: the noise multiplier of the current epoch's booked
    /// charge (no later step of the epoch may use a smaller one).
    #[serde(default)]
    pub(super) booked_sigma: Option<f64>,
    /// Predictable mode: the level history's segment of that charge (what
    /// the discounted ledger discounts from).
    #[serde(default)]
    pub(super) booked_segment: Option<u32>,
}

impl ShuffleState {
    /// The state before the first step.
    pub(super) fn new(steps_per_epoch: u64, orders: usize) -> Self {
        ShuffleState {
            steps_per_epoch,
            worst_done: vec![0.0; orders],
            epoch_max: vec![0.0; orders],
            epoch: 0,
            started: false,
            booked_sigma: None,
            booked_segment: None,
        }
    }

    /// Enter step `t`, whose top-bucket charge is `top_row`: fold the previous
    /// epoch into the worst case when `t` begins a new one. Returns `t`'s epoch.
    pub(super) fn begin_step(&mut self, t: u64, top_row: &[f64]) -> u64 {
        let epoch = t / self.steps_per_epoch;
        if self.started && epoch == self.epoch {
            for (w, &r) in self.epoch_max.iter_mut().zip(top_row) {
                *w = w.max(r);
            }
        } else {
            if self.started {
                for (w, &e) in self.worst_done.iter_mut().zip(&self.epoch_max) {
                    *w += e;
                }
            }
            self.epoch_max.copy_from_slice(top_row);
            self.epoch = epoch;
            self.started = true;
        }
        epoch
    }

    /// The worst case's RDP so far (releases not included).
    pub(super) fn worst_rdp_into(&self, rdp: &mut [f64]) {
        for ((o, &w), &e) in rdp.iter_mut().zip(&self.worst_done).zip(&self.epoch_max) {
            *o = if self.started { w + e } else { 0.0 };
        }
    }

    /// Heap bytes held.
    pub(super) fn bytes(&self) -> usize {
        (self.worst_done.capacity() + self.epoch_max.capacity()) * 8
    }
}

impl Ledger {
    /// Predictable mode with shuffled batches: the first step after which the
    /// filter may retire an example checked at step `at` (retirement happens
    /// only at epoch boundaries, so that an example is charged for an epoch
    /// only when it trains through all of it). `at` itself otherwise.
    pub(super) fn at_epoch_boundary(&self, at: u64) -> u64 {
        match &self.accrual {
            Accrual::Shuffle(s) if at != NEVER && self.config.is_predictable() => at
                .div_ceil(s.steps_per_epoch)
                .saturating_mul(s.steps_per_epoch),
            _ => at,
        }
    }

    /// Predictable mode: note that the reported `ids` were processed in
    /// `epoch` (each example once per epoch); they are charged nothing more.
    pub(super) fn mark_processed(&mut self, batches: &[(&[u64], &[f64])], epoch: u64) {
        for (ids, _) in batches {
            for &id in ids.iter() {
                self.since[id as usize] = epoch + 1;
            }
        }
    }

    /// Predictable mode: book the epoch that step `now - 1` begins for every
    /// example the filter has not retired, at its threshold, in history
    /// segment `segment`, and queue the filter's check of those whose next
    /// epoch would not fit their budget for the epoch's end. `O(n)` once per
    /// epoch, `O(batch)` per step.
    pub(super) fn book_epoch(&mut self, segment: Option<u32>, now: u64) {
        let mut filter = self.filter.take();
        for i in 0..self.n {
            if self.flags[i] & RETIRED != 0 {
                continue;
            }
            save_for_view!(self, i, None);
            if let Some(s) = segment {
                self.levels.charge(i, s, self.bucket[i]);
            }
            if let Some(f) = filter.as_mut() {
                let at = self.predict(f, i, now);
                if at != NEVER {
                    f.schedule_by(i as u32, at);
                }
            }
        }
        self.filter = filter;
    }
}

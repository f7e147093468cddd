//! Shuffle mode (spec §2, shuffled fixed-size batches): within an epoch each
//! example is processed once and charged only then, at its clipped norm; the
//! worst case is one Gaussian charge at `C` per epoch begun, at that epoch's
//! smallest noise multiplier.

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

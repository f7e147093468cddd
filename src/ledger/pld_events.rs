//! The dataset's history as PLD events (spec §8, worst case): what the PLD
//! accountant composes. Kept apart from the prefix sums because compaction
//! drops old segments there, while the PLD needs every run of hyperparameters.
//!
//! Size: one entry per run of equal hyperparameters (Poisson), per distinct
//! epoch noise multiplier (shuffle), and per distinct release event, so it stays
//! small however many steps are applied.

use crate::accounting::pld::PldEvent;
use crate::accounting::table::StepMechanism;

/// Training steps and releases as PLD events, in the order they happened.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct PldHistory {
    /// Poisson runs (`PoissonGaussian`) or completed shuffle epochs (`Gaussian`).
    steps: Vec<PldEvent>,
    /// Shuffle mode: the epoch of the latest step and its smallest noise multiplier.
    open_epoch: Option<(u64, f64)>,
    /// Release events (Gaussian for zCDP Gaussian releases, pure DP for
    /// bounded-range exponential mechanisms).
    releases: Vec<PldEvent>,
    /// Set when a release was charged without a PLD description: from then on
    /// no PLD worst case can be given (it would leave that release out).
    incomplete: bool,
}

/// Add `count` to the last event if it is the same mechanism, else append it.
fn push_merged(list: &mut Vec<PldEvent>, event: PldEvent) {
    use PldEvent::*;
    if let Some(last) = list.last_mut() {
        match (last, event) {
            (
                PoissonGaussian { q, sigma, count },
                PoissonGaussian {
                    q: q2,
                    sigma: s2,
                    count: c2,
                },
            ) if *q == q2 && *sigma == s2 => {
                *count += c2;
                return;
            }
            (
                Gaussian { sigma, count },
                Gaussian {
                    sigma: s2,
                    count: c2,
                },
            ) if *sigma == s2 => {
                *count += c2;
                return;
            }
            (
                PureDp { epsilon, count },
                PureDp {
                    epsilon: e2,
                    count: c2,
                },
            ) if *epsilon == e2 => {
                *count += c2;
                return;
            }
            _ => {}
        }
    }
    list.push(event);
}

impl PldHistory {
    /// Record one applied step. Poisson: one subsampled-Gaussian step at
    /// `(q, sigma)`. Shuffle (`epoch` given): the worst case is one Gaussian
    /// mechanism at `C` per epoch, without amplification, at the epoch's
    /// smallest noise multiplier (as the RDP worst case of `shuffle.rs`).
    pub(crate) fn record_step(&mut self, mechanism: StepMechanism, epoch: Option<u64>) {
        match (mechanism, epoch) {
            (StepMechanism::Poisson { q, sigma }, _) => push_merged(
                &mut self.steps,
                PldEvent::PoissonGaussian { q, sigma, count: 1 },
            ),
            (StepMechanism::Gaussian { sigma }, Some(e)) => match &mut self.open_epoch {
                Some((open, s)) if *open == e => *s = s.min(sigma),
                _ => {
                    self.close_epoch();
                    self.open_epoch = Some((e, sigma));
                }
            },
            (StepMechanism::Gaussian { sigma }, None) => {
                push_merged(&mut self.steps, PldEvent::Gaussian { sigma, count: 1 })
            }
        }
    }

    fn close_epoch(&mut self) {
        if let Some((_, sigma)) = self.open_epoch.take() {
            push_merged(&mut self.steps, PldEvent::Gaussian { sigma, count: 1 });
        }
    }

    /// Record a release: its PLD events, or `None` when it has no PLD
    /// description (the PLD worst case is then withheld for good).
    pub(crate) fn record_release(&mut self, events: Option<&[PldEvent]>) {
        match events {
            Some(events) => {
                for &e in events {
                    push_merged(&mut self.releases, e);
                }
            }
            None => self.incomplete = true,
        }
    }

    /// Every event so far (steps, then releases: composition is commutative),
    /// or `None` when a release could not be described.
    pub(crate) fn events(&self) -> Option<Vec<PldEvent>> {
        if self.incomplete {
            return None;
        }
        let mut out = self.steps.clone();
        if let Some((_, sigma)) = self.open_epoch {
            push_merged(&mut out, PldEvent::Gaussian { sigma, count: 1 });
        }
        out.extend_from_slice(&self.releases);
        Some(out)
    }

    /// The release events alone (every example is charged each of them), or
    /// `None` when a release could not be described.
    pub(crate) fn release_events(&self) -> Option<Vec<PldEvent>> {
        (!self.incomplete).then(|| self.releases.clone())
    }

    /// Heap bytes held.
    pub(crate) fn bytes(&self) -> usize {
        (self.steps.capacity() + self.releases.capacity()) * std::mem::size_of::<PldEvent>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_runs_merge_and_change_with_hyperparameters() {
        let mut h = PldHistory::default();
        let a = StepMechanism::Poisson { q: 0.1, sigma: 1.0 };
        let b = StepMechanism::Poisson { q: 0.1, sigma: 2.0 };
        for m in [a, a, b, a] {
            h.record_step(m, None);
        }
        assert_eq!(
            h.events().unwrap(),
            vec![
                PldEvent::PoissonGaussian {
                    q: 0.1,
                    sigma: 1.0,
                    count: 2
                },
                PldEvent::PoissonGaussian {
                    q: 0.1,
                    sigma: 2.0,
                    count: 1
                },
                PldEvent::PoissonGaussian {
                    q: 0.1,
                    sigma: 1.0,
                    count: 1
                },
            ]
        );
    }

    #[test]
    fn shuffle_charges_one_gaussian_per_epoch_at_its_smallest_sigma() {
        let mut h = PldHistory::default();
        let g = |sigma| StepMechanism::Gaussian { sigma };
        // Epoch 0: sigmas 2, 1.5, 3 -> 1.5; epoch 1: 2 (still open).
        for (s, e) in [(2.0, 0), (1.5, 0), (3.0, 0), (2.0, 1)] {
            h.record_step(g(s), Some(e));
        }
        assert_eq!(
            h.events().unwrap(),
            vec![
                PldEvent::Gaussian {
                    sigma: 1.5,
                    count: 1
                },
                PldEvent::Gaussian {
                    sigma: 2.0,
                    count: 1
                },
            ]
        );
    }

    #[test]
    fn an_undescribed_release_withholds_the_pld() {
        let mut h = PldHistory::default();
        h.record_release(Some(&[PldEvent::PureDp {
            epsilon: 0.1,
            count: 3,
        }]));
        assert!(h.events().is_some());
        h.record_release(None);
        assert!(h.events().is_none());
    }
}

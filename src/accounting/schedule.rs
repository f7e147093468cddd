//! Noise schedules and budgets (seed 002 §IV-A2): sigma decays per epoch; given a
//! total budget, find the epoch at which training must stop.

use super::composition::Event;
use super::conversion::{epsilon_from_rdp, zcdp_epsilon_exact, Conversion};
use super::error::{InvalidArgument, Result};
use super::orders::default_orders;
use super::validate;
use serde::{Deserialize, Serialize};

/// How sigma changes with the epoch number `t` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoiseSchedule {
    /// `sigma_t = sigma_0`.
    Constant,
    /// `sigma_t = sigma_0 / (1 + k t)`.
    Time {
        /// Decay rate `k > 0`.
        k: f64,
    },
    /// `sigma_t = sigma_0 exp(-k t)`.
    Exponential {
        /// Decay rate `k > 0`.
        k: f64,
    },
    /// `sigma_t = sigma_0 k^floor(t / period)`.
    Step {
        /// Decay factor `0 < k < 1`.
        k: f64,
        /// Epochs between reductions.
        period: u32,
    },
    /// `sigma_t = (sigma_0 - sigma_end)(1 - t/period)^k + sigma_end`, then `sigma_end`.
    Polynomial {
        /// Decay power `k > 0`.
        k: f64,
        /// Epochs to reach `sigma_end`.
        period: u32,
        /// Final noise multiplier.
        sigma_end: f64,
    },
}

impl NoiseSchedule {
    /// Check the schedule's parameters.
    pub fn validate(&self, sigma0: f64) -> Result<()> {
        validate::positive("sigma0", sigma0)?;
        match *self {
            NoiseSchedule::Constant => {}
            NoiseSchedule::Time { k } | NoiseSchedule::Exponential { k } => {
                validate::positive("decay", k)?;
            }
            NoiseSchedule::Step { k, period } => {
                if !(k > 0.0 && k < 1.0) {
                    return Err(InvalidArgument::new(
                        "decay",
                        format!("step decay factor must be in (0, 1), got {k}"),
                    ));
                }
                if period == 0 {
                    return Err(InvalidArgument::new("period", "must be at least 1"));
                }
            }
            NoiseSchedule::Polynomial {
                k,
                period,
                sigma_end,
            } => {
                validate::positive("decay", k)?;
                validate::positive("sigma_end", sigma_end)?;
                if period == 0 {
                    return Err(InvalidArgument::new("period", "must be at least 1"));
                }
                if sigma_end >= sigma0 {
                    return Err(InvalidArgument::new("sigma_end", "must be below sigma0"));
                }
            }
        }
        Ok(())
    }

    /// Noise multiplier of epoch `t`.
    pub fn sigma(&self, sigma0: f64, t: u32) -> f64 {
        let tf = t as f64;
        match *self {
            NoiseSchedule::Constant => sigma0,
            NoiseSchedule::Time { k } => sigma0 / (1.0 + k * tf),
            NoiseSchedule::Exponential { k } => sigma0 * (-k * tf).exp(),
            NoiseSchedule::Step { k, period } => sigma0 * k.powi((t / period) as i32),
            NoiseSchedule::Polynomial {
                k,
                period,
                sigma_end,
            } => {
                if t >= period {
                    sigma_end
                } else {
                    (sigma0 - sigma_end) * (1.0 - tf / period as f64).powf(k) + sigma_end
                }
            }
        }
    }
}

/// A total privacy budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// (epsilon, delta)-DP, accounted with exact RDP.
    Epsilon {
        /// Total epsilon.
        epsilon: f64,
        /// Its delta.
        delta: f64,
    },
    /// rho-zCDP (shuffled batching only: zCDP does not capture Poisson amplification).
    Rho {
        /// Total rho.
        rho: f64,
    },
}

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batching {
    /// Poisson sampling at rate q, `steps_per_epoch` steps per epoch.
    Poisson,
    /// Shuffled fixed-size batches: one Gaussian charge per example per epoch.
    Shuffle,
}

/// One epoch of a planned schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedEpoch {
    /// Epoch number (0-based).
    pub epoch: u32,
    /// Noise multiplier of the epoch.
    pub sigma: f64,
    /// Cumulative spend after this epoch, in the budget's unit (epsilon or rho).
    pub spent: f64,
    /// Whether this epoch fits within the budget.
    pub within_budget: bool,
}

/// The result of planning a schedule against a budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulePlan {
    /// Epochs up to and including the first one over budget (or `max_epochs`).
    pub epochs: Vec<PlannedEpoch>,
    /// The first epoch that must not run; `None` if all `max_epochs` fit.
    pub stop_epoch: Option<u32>,
}

/// Inputs of [`plan`].
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest {
    /// The decay function.
    pub schedule: NoiseSchedule,
    /// Initial noise multiplier.
    pub sigma0: f64,
    /// Batching method.
    pub batching: Batching,
    /// Poisson sampling rate (ignored for shuffling).
    pub q: f64,
    /// Steps per epoch for Poisson batching.
    pub steps_per_epoch: u64,
    /// The total budget.
    pub budget: Budget,
    /// Horizon.
    pub max_epochs: u32,
}

/// Walk the schedule epoch by epoch until the budget would be exceeded.
pub fn plan(req: &PlanRequest) -> Result<SchedulePlan> {
    req.schedule.validate(req.sigma0)?;
    if req.batching == Batching::Poisson {
        validate::sampling_rate("sampling_rate", req.q)?;
    }
    match req.budget {
        Budget::Epsilon { epsilon, delta } => {
            validate::positive("budget_epsilon", epsilon)?;
            validate::delta("delta", delta)?;
        }
        Budget::Rho { rho } => {
            validate::positive("budget_rho", rho)?;
            if req.batching == Batching::Poisson {
                return Err(InvalidArgument::new(
                    "budget_rho",
                    "a rho budget needs shuffled batching: zCDP does not capture Poisson amplification (seed 002 §IV-B2); give an epsilon budget instead",
                ));
            }
        }
    }
    let orders = default_orders();
    let mut rdp = vec![0.0; orders.len()];
    let mut rho = 0.0;
    let mut epochs = Vec::new();
    let mut stop_epoch = None;
    for t in 0..req.max_epochs {
        let sigma = req.schedule.sigma(req.sigma0, t);
        let event = match req.batching {
            Batching::Poisson => Event::Poisson {
                q: req.q,
                sigma,
                count: req.steps_per_epoch,
            },
            Batching::Shuffle => Event::ShuffledEpoch { sigma, count: 1 },
        };
        for (slot, &a) in rdp.iter_mut().zip(&orders) {
            *slot += event.rdp(a);
        }
        rho += 1.0 / (2.0 * sigma * sigma);
        let (spent, limit) = match req.budget {
            Budget::Rho { rho: limit } => (rho, limit),
            Budget::Epsilon { epsilon, delta } => {
                let spent = match req.batching {
                    // A Gaussian's RDP curve is exactly alpha·rho: optimise alpha continuously.
                    Batching::Shuffle => zcdp_epsilon_exact(rho, delta).epsilon,
                    Batching::Poisson => {
                        epsilon_from_rdp(&orders, &rdp, delta, Conversion::Improved).epsilon
                    }
                };
                (spent, epsilon)
            }
        };
        let within_budget = spent <= limit;
        epochs.push(PlannedEpoch {
            epoch: t,
            sigma,
            spent,
            within_budget,
        });
        if !within_budget {
            stop_epoch = Some(t);
            break;
        }
    }
    Ok(SchedulePlan { epochs, stop_epoch })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_functions_follow_seed_formulas() {
        assert_eq!(NoiseSchedule::Time { k: 0.5 }.sigma(10.0, 2), 5.0);
        assert!(
            (NoiseSchedule::Exponential { k: 0.1 }.sigma(10.0, 10) - 10.0 * (-1f64).exp()).abs()
                < 1e-12
        );
        assert_eq!(NoiseSchedule::Step { k: 0.5, period: 3 }.sigma(8.0, 7), 2.0);
        let p = NoiseSchedule::Polynomial {
            k: 1.0,
            period: 10,
            sigma_end: 2.0,
        };
        assert_eq!(p.sigma(12.0, 5), 7.0);
        assert_eq!(p.sigma(12.0, 50), 2.0);
    }

    #[test]
    fn constant_rho_budget_stops_at_the_expected_epoch() {
        // rho per epoch = 1/(2·10²) = 0.005; budget 0.78125 allows 156 epochs.
        let plan = plan(&PlanRequest {
            schedule: NoiseSchedule::Constant,
            sigma0: 10.0,
            batching: Batching::Shuffle,
            q: 0.0,
            steps_per_epoch: 0,
            budget: Budget::Rho { rho: 0.78125 },
            max_epochs: 1000,
        })
        .unwrap();
        assert_eq!(plan.stop_epoch, Some(156));
        assert!(plan.epochs[155].within_budget);
    }
}

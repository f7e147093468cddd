//! The data-independent (worst-case) accountant (spec §4): RDP composes additively.

use super::conversion::{epsilon_from_rdp, Conversion, EpsilonAtOrder};
use super::error::Result;
use super::sgm::{gaussian_rdp, sgm_rdp};
use super::validate;
use serde::{Deserialize, Serialize};

/// One kind of training event, repeated `count` times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// `count` Poisson-sampled steps at rate `q` with noise multiplier `sigma`
    /// (a full-batch step is `q = 1`).
    Poisson {
        /// Sampling rate.
        q: f64,
        /// Noise multiplier.
        sigma: f64,
        /// Number of steps.
        count: u64,
    },
    /// `count` epochs of shuffled fixed-size batches: each example is in exactly one
    /// batch per epoch, so an epoch costs one Gaussian mechanism (seed 002, Thm. 2).
    ShuffledEpoch {
        /// Noise multiplier.
        sigma: f64,
        /// Number of epochs.
        count: u64,
    },
    /// `count` plain Gaussian mechanisms (e.g. a DP release), no amplification.
    Gaussian {
        /// Noise multiplier.
        sigma: f64,
        /// Number of mechanisms.
        count: u64,
    },
}

impl Event {
    /// Check the event's parameters, naming the bad field.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Event::Poisson { q, sigma, .. } => {
                validate::sampling_rate("q", q)?;
                validate::noise_multiplier("sigma", sigma)?;
            }
            Event::ShuffledEpoch { sigma, .. } | Event::Gaussian { sigma, .. } => {
                validate::noise_multiplier("sigma", sigma)?;
            }
        }
        Ok(())
    }

    /// RDP of the whole event at `alpha`.
    pub fn rdp(&self, alpha: f64) -> f64 {
        let (per, count) = match *self {
            Event::Poisson { q, sigma, count } => (sgm_rdp(q, sigma, alpha), count),
            Event::ShuffledEpoch { sigma, count } | Event::Gaussian { sigma, count } => {
                (gaussian_rdp(sigma, alpha), count)
            }
        };
        if count == 0 {
            0.0
        } else {
            per * count as f64
        }
    }
}

/// Total RDP of a sequence of events at each order.
pub fn compose(events: &[Event], orders: &[f64]) -> Vec<f64> {
    orders
        .iter()
        .map(|&a| events.iter().map(|e| e.rdp(a)).sum())
        .collect()
}

/// Worst-case epsilon of a sequence of events.
pub fn worst_case_epsilon(
    events: &[Event],
    orders: &[f64],
    delta: f64,
    conversion: Conversion,
) -> EpsilonAtOrder {
    epsilon_from_rdp(orders, &compose(events, orders), delta, conversion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_batch_poisson_equals_gaussian() {
        let orders = [2.0, 10.0];
        let a = compose(
            &[Event::Poisson {
                q: 1.0,
                sigma: 2.0,
                count: 3,
            }],
            &orders,
        );
        let b = compose(
            &[Event::Gaussian {
                sigma: 2.0,
                count: 3,
            }],
            &orders,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn composition_adds() {
        let orders = [4.0];
        let one = compose(
            &[Event::Poisson {
                q: 0.01,
                sigma: 1.0,
                count: 1,
            }],
            &orders,
        )[0];
        let many = compose(
            &[Event::Poisson {
                q: 0.01,
                sigma: 1.0,
                count: 1000,
            }],
            &orders,
        )[0];
        assert!((many - 1000.0 * one).abs() < 1e-12 * many);
        assert!(Event::Poisson {
            q: 2.0,
            sigma: 1.0,
            count: 1
        }
        .validate()
        .is_err());
    }
}

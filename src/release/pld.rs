//! A release's PLD events (spec §8): what the PLD worst case composes for it.
//!
//! - Gaussian statistics (mean: sum and count; histogram; gradient-descent
//!   quantiles) are Gaussian mechanisms. Gaussian mechanisms with `rho_j =
//!   Δ_j²/(2σ_j²)` compose to exactly one Gaussian mechanism with `μ² = Σ 2 rho_j`,
//!   so a release's Gaussian part is one Gaussian event of noise multiplier
//!   `1/sqrt(2 rho)`, exactly (no zCDP slack).
//! - KSS quantiles run one eta-bounded-range exponential mechanism per depth
//!   (one per example: the sub-problems at a depth see disjoint data). Such a
//!   mechanism is eta-DP, so each depth is a pure-DP event of epsilon eta
//!   (randomized response, its tight dominating pair). A depth where an atom's
//!   count is released in place of a mechanism uses Laplace noise
//!   of scale `2/eta`, which is `eta/2`-DP: the same event dominates it. Its zCDP charge
//!   `eta²/8` is not a Gaussian one and must not be treated as one.
//!
//! Per-group statistics cost the same as population ones: groups are disjoint.

use super::quantiles::{kss_depth, kss_eta};
use super::request::{QuantileMethod, ReleaseRequest};
use crate::accounting::pld::PldEvent;

/// The PLD events of one release of `request`.
pub fn release_pld_events(request: &ReleaseRequest) -> Vec<PldEvent> {
    let mut gaussian_rho = request.mean.as_ref().map_or(0.0, |m| m.rho)
        + request.histogram.as_ref().map_or(0.0, |h| h.rho);
    let mut out = Vec::new();
    if let Some(q) = &request.quantiles {
        match q.method {
            QuantileMethod::GradientDescent => gaussian_rho += q.rho,
            QuantileMethod::Kss if q.rho > 0.0 && !q.levels.is_empty() => {
                out.push(PldEvent::PureDp {
                    epsilon: kss_eta(q.levels.len(), q.rho),
                    count: kss_depth(q.levels.len()) as u64,
                })
            }
            QuantileMethod::Kss => {}
        }
    }
    if gaussian_rho > 0.0 {
        out.push(PldEvent::Gaussian {
            sigma: 1.0 / (2.0 * gaussian_rho).sqrt(),
            count: 1,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::request::{HistogramRequest, MeanRequest, QuantilesRequest};

    #[test]
    fn gaussian_parts_merge_and_kss_is_pure_dp_per_depth() {
        let r = ReleaseRequest {
            mean: Some(MeanRequest { rho: 0.01 }),
            quantiles: Some(QuantilesRequest {
                rho: 0.03,
                levels: vec![0.1, 0.3, 0.5, 0.7, 0.9],
                method: QuantileMethod::Kss,
                steps: None,
            }),
            histogram: Some(HistogramRequest { rho: 0.04, bins: 4 }),
            by_group: false,
            delta: None,
        };
        let ev = release_pld_events(&r);
        // Five levels take three depths, each eta = sqrt(8 * 0.03 / 3).
        let eta = (8.0f64 * 0.03 / 3.0).sqrt();
        match ev[0] {
            PldEvent::PureDp { epsilon, count } => {
                assert!((epsilon - eta).abs() < 1e-15);
                assert_eq!(count, 3);
            }
            other => panic!("{other:?}"),
        }
        // Gaussian rho 0.05 in all: mu = sqrt(0.1), sigma = 1/mu.
        match ev[1] {
            PldEvent::Gaussian { sigma, count: 1 } => {
                assert!((sigma - 1.0 / 0.1f64.sqrt()).abs() < 1e-12)
            }
            other => panic!("{other:?}"),
        }
    }
}

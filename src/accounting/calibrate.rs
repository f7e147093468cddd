//! Noise calibration: the smallest noise multiplier that reaches a target epsilon.

use super::composition::{worst_case_epsilon, Event};
use super::conversion::Conversion;
use super::error::{InvalidArgument, Result};
use super::validate;

/// Relative width at which bisection stops (Opacus stops at 0.01 in epsilon).
pub const RELATIVE_TOLERANCE: f64 = 1e-9;

/// The noise multiplier `sigma` such that `steps` Poisson steps at rate `q` give
/// `epsilon <= target_epsilon` at `delta`, within [`RELATIVE_TOLERANCE`] of the
/// smallest such sigma. The answer is always on the safe side (its epsilon is
/// at most the target).
pub fn noise_for_epsilon(
    target_epsilon: f64,
    delta: f64,
    q: f64,
    steps: u64,
    orders: &[f64],
    conversion: Conversion,
) -> Result<f64> {
    validate::positive("target_epsilon", target_epsilon)?;
    validate::delta("delta", delta)?;
    validate::sampling_rate("sampling_rate", q)?;
    let eps = |sigma: f64| {
        worst_case_epsilon(
            &[Event::Poisson {
                q,
                sigma,
                count: steps,
            }],
            orders,
            delta,
            conversion,
        )
        .epsilon
    };
    if q == 0.0 || steps == 0 {
        return Err(InvalidArgument::new(
            "steps",
            "nothing is released (q = 0 or no steps): any noise multiplier works",
        ));
    }
    let (mut lo, mut hi) = (1e-3, 1.0);
    while eps(hi) > target_epsilon {
        lo = hi;
        hi *= 2.0;
        if hi > 1e7 {
            return Err(InvalidArgument::new(
                "target_epsilon",
                format!("unreachable with a noise multiplier below 1e7: {target_epsilon}"),
            ));
        }
    }
    if eps(lo) <= target_epsilon {
        return Err(InvalidArgument::new(
            "target_epsilon",
            format!("already met with noise multiplier {lo}; the target is too loose"),
        ));
    }
    while (hi - lo) > RELATIVE_TOLERANCE * hi {
        let mid = 0.5 * (lo + hi);
        if eps(mid) > target_epsilon {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::orders::default_orders;

    #[test]
    fn calibrated_sigma_meets_target_tightly() {
        let orders = default_orders();
        let sigma =
            noise_for_epsilon(3.0, 1e-5, 0.01, 1000, &orders, Conversion::Improved).unwrap();
        let at = |s: f64| {
            worst_case_epsilon(
                &[Event::Poisson {
                    q: 0.01,
                    sigma: s,
                    count: 1000,
                }],
                &orders,
                1e-5,
                Conversion::Improved,
            )
            .epsilon
        };
        assert!(at(sigma) <= 3.0);
        assert!(at(sigma * (1.0 - 1e-6)) > 3.0);
        assert!(noise_for_epsilon(3.0, 2.0, 0.01, 10, &orders, Conversion::Improved).is_err());
    }
}

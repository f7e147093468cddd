//! Noise calibration by PLD: the smallest noise multiplier whose PLD epsilon
//! meets a target (PLD is tighter than RDP, so it needs less noise).

use super::accountant::{worst_case_epsilon, PldEvent, PldOptions};
use crate::accounting::error::{InvalidArgument, Result};
use crate::accounting::validate;

/// Relative width at which bisection stops (each step composes a PLD).
pub const RELATIVE_TOLERANCE: f64 = 1e-4;

/// Noise multiplier within [`RELATIVE_TOLERANCE`] of the smallest one such that
/// `steps` Poisson steps at rate `q` have PLD epsilon `<= target_epsilon` at
/// `delta`; always on the safe side (its own epsilon meets the target).
pub fn noise_for_epsilon_pld(
    target_epsilon: f64,
    delta: f64,
    q: f64,
    steps: u64,
    opts: &PldOptions,
) -> Result<f64> {
    validate::positive("target_epsilon", target_epsilon)?;
    validate::delta("delta", delta)?;
    validate::sampling_rate("sampling_rate", q)?;
    if q == 0.0 || steps == 0 {
        return Err(InvalidArgument::new(
            "steps",
            "nothing is released (q = 0 or no steps): any noise multiplier works",
        ));
    }
    // A composition the grid cannot hold has a huge epsilon: treat it as over
    // the target (moves sigma up, the safe side).
    let over = |sigma: f64| {
        worst_case_epsilon(
            &[PldEvent::PoissonGaussian {
                q,
                sigma,
                count: steps,
            }],
            delta,
            opts,
        )
        .map_or(true, |e| e > target_epsilon)
    };
    // Below ~0.05 the single-step grid explodes; such targets are refused.
    let (mut lo, mut hi) = (0.05, 1.0);
    while over(hi) {
        lo = hi;
        hi *= 2.0;
        if hi > 1e5 {
            return Err(InvalidArgument::new(
                "target_epsilon",
                format!("unreachable with a noise multiplier below 1e5: {target_epsilon}"),
            ));
        }
    }
    if !over(lo) {
        return Err(InvalidArgument::new(
            "target_epsilon",
            format!("already met with noise multiplier {lo}; the target is too loose"),
        ));
    }
    while (hi - lo) > RELATIVE_TOLERANCE * hi {
        let mid = 0.5 * (lo + hi);
        if over(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

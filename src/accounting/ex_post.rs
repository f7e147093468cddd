//! The ex-post per-example bound (spec §10). A provisional implementation:
//! bisection in log space, rounded up; the default order set targeted at the
//! planned steps and the norm grid.

use crate::accounting::error::InvalidArgument;
use crate::accounting::grid::BucketGrid;
use crate::accounting::sgm::{gaussian_rdp, sgm_rdp};
use crate::accounting::table::StepMechanism;

fn log_lhs(orders: &[f64], weights: &[f64], rdp: &[f64], eps: f64) -> f64 {
    let terms: Vec<f64> = orders
        .iter()
        .zip(weights)
        .zip(rdp)
        .map(|((&a, &w), &r)| w.ln() + (a - 1.0) * (eps - r))
        .collect();
    let max = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}

/// The `eps` solving `sum_a w_a exp((a - 1)(eps - R_a)) = 1/delta`, rounded up.
pub fn ex_post_epsilon(orders: &[f64], weights: &[f64], rdp: &[f64], delta: f64) -> f64 {
    if rdp.iter().all(|r| r.is_infinite()) {
        return f64::INFINITY;
    }
    let target = -delta.ln();
    let mut lo = 0.0f64;
    let mut hi = 1.0f64;
    while log_lhs(orders, weights, rdp, hi) < target {
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if log_lhs(orders, weights, rdp, mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi * (1.0 + 1e-12)
}

/// Checks an ex-post order set: same lengths, orders > 1 sorted, weights > 0 summing to 1.
pub fn validate_ex_post_orders(orders: &[f64], weights: &[f64]) -> Result<(), InvalidArgument> {
    if orders.is_empty() || orders.len() != weights.len() {
        return Err(InvalidArgument::new(
            "ex_post.weights",
            "needs one weight per order (and at least one order)",
        ));
    }
    if orders.windows(2).any(|w| w[0] >= w[1])
        || orders.iter().any(|a| !(*a > 1.0 && a.is_finite()))
    {
        return Err(InvalidArgument::new(
            "ex_post.orders",
            "must be finite orders > 1, sorted and distinct",
        ));
    }
    if weights.iter().any(|w| !(*w > 0.0)) || (weights.iter().sum::<f64>() - 1.0).abs() > 1e-9 {
        return Err(InvalidArgument::new(
            "ex_post.weights",
            "must be positive and sum to 1",
        ));
    }
    Ok(())
}

/// Equal weights.
pub fn equal_weights(k: usize) -> Vec<f64> {
    vec![1.0 / k as f64; k]
}

/// The default order set: for threshold fractions 1, 1/2, 1/4, ..., the
/// candidate order minimising `T rho(alpha; f C) + ln(1/delta)/(alpha - 1)`.
pub fn default_ex_post_orders(
    candidates: &[f64],
    mechanism: StepMechanism,
    planned_steps: u64,
    grid: &BucketGrid,
    delta: f64,
) -> Vec<f64> {
    let t = planned_steps as f64;
    let smallest = grid.value(1).max(f64::MIN_POSITIVE) / grid.max_norm();
    let mut out: Vec<f64> = Vec::new();
    let mut f = 1.0f64;
    while f >= smallest && out.len() < 8 {
        let best = candidates
            .iter()
            .map(|&a| {
                let rho = match mechanism {
                    StepMechanism::Poisson { q, sigma } => sgm_rdp(q, sigma / f, a),
                    StepMechanism::Gaussian { sigma } => gaussian_rdp(sigma / f, a),
                };
                (a, t * rho + (1.0 / delta).ln() / (a - 1.0))
            })
            .fold(
                (f64::NAN, f64::INFINITY),
                |b, x| if x.1 < b.1 { x } else { b },
            );
        if best.0.is_finite() && !out.contains(&best.0) {
            out.push(best.0);
        }
        f *= 0.5;
    }
    out.sort_by(f64::total_cmp);
    out
}

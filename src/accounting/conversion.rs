//! Conversions from RDP (and zCDP) to (epsilon, delta)-DP (spec §5).

use serde::{Deserialize, Serialize};

/// Which conversion a query asks for: part of the wire, defined once with the
/// Rust client in the workspace crate `dpledger-api`.
pub use dpledger_api::config::Conversion;

/// An epsilon with the order at which it was attained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpsilonAtOrder {
    /// The (epsilon, delta)-DP epsilon.
    pub epsilon: f64,
    /// The Rényi order that minimised it.
    pub order: f64,
}

/// A delta with the order at which it was attained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeltaAtOrder {
    /// The (epsilon, delta)-DP delta.
    pub delta: f64,
    /// The Rényi order that minimised it.
    pub order: f64,
}

/// Epsilon bound of one order for the given conversion (may be `inf`).
pub fn epsilon_at(order: f64, rdp: f64, delta: f64, conversion: Conversion) -> f64 {
    if !rdp.is_finite() || order.is_infinite() {
        return if rdp == 0.0 { 0.0 } else { f64::INFINITY };
    }
    match conversion {
        Conversion::Improved => {
            rdp + (-1.0 / order).ln_1p() - (delta.ln() + order.ln()) / (order - 1.0)
        }
        Conversion::Classic => rdp - delta.ln() / (order - 1.0),
    }
}

/// `min over orders` of the conversion, clamped at 0, with the optimal order.
///
/// `delta = 0` gives 0 when every RDP value is 0 and infinity otherwise.
pub fn epsilon_from_rdp(
    orders: &[f64],
    rdp: &[f64],
    delta: f64,
    conversion: Conversion,
) -> EpsilonAtOrder {
    debug_assert_eq!(orders.len(), rdp.len());
    if delta == 0.0 {
        let all_zero = rdp.iter().all(|&r| r == 0.0);
        return EpsilonAtOrder {
            epsilon: if all_zero { 0.0 } else { f64::INFINITY },
            order: orders.first().copied().unwrap_or(f64::NAN),
        };
    }
    let mut best = EpsilonAtOrder {
        epsilon: f64::INFINITY,
        order: orders.first().copied().unwrap_or(f64::NAN),
    };
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = epsilon_at(a, r, delta, conversion);
        if eps < best.epsilon {
            best = EpsilonAtOrder {
                epsilon: eps,
                order: a,
            };
        }
    }
    best.epsilon = best.epsilon.max(0.0);
    best
}

/// The smallest delta for which the RDP curve gives (epsilon, delta)-DP, using the
/// improved conversion and, like dp-accounting, the KL bound `sqrt(1 - exp(-rdp))`
/// that is better at orders near 1.
pub fn delta_from_rdp(orders: &[f64], rdp: &[f64], epsilon: f64) -> DeltaAtOrder {
    let mut best_log = f64::INFINITY;
    let mut best_order = orders.first().copied().unwrap_or(f64::NAN);
    for (&a, &r) in orders.iter().zip(rdp) {
        if !r.is_finite() {
            continue;
        }
        let mut log_delta = if r == 0.0 {
            f64::NEG_INFINITY
        } else {
            0.5 * (-(-r).exp()).ln_1p()
        };
        if a.is_finite() && a > 1.01 {
            let bound = (a - 1.0) * (r - epsilon + (-1.0 / a).ln_1p()) - a.ln();
            log_delta = log_delta.min(bound);
        }
        if log_delta < best_log {
            best_log = log_delta;
            best_order = a;
        }
    }
    DeltaAtOrder {
        delta: best_log.exp().min(1.0),
        order: best_order,
    }
}

/// Exact conversion of rho-zCDP to (epsilon, delta)-DP: the improved RDP conversion
/// applied to `RDP(alpha) = alpha rho`, optimised over continuous `alpha > 1`.
pub fn zcdp_epsilon_exact(rho: f64, delta: f64) -> EpsilonAtOrder {
    if rho == 0.0 {
        return EpsilonAtOrder {
            epsilon: 0.0,
            order: f64::INFINITY,
        };
    }
    if !rho.is_finite() {
        return EpsilonAtOrder {
            epsilon: f64::INFINITY,
            order: f64::NAN,
        };
    }
    let f = |alpha: f64| epsilon_at(alpha, alpha * rho, delta, Conversion::Improved);
    // The objective is unimodal in t = ln(alpha - 1); scan, then golden-section refine.
    let g = |t: f64| f(1.0 + t.exp());
    let (lo_t, hi_t) = (-30.0f64, 30.0f64);
    let n = 600;
    let mut best_i = 0;
    let mut best = f64::INFINITY;
    for i in 0..=n {
        let t = lo_t + (hi_t - lo_t) * i as f64 / n as f64;
        let v = g(t);
        if v < best {
            best = v;
            best_i = i;
        }
    }
    let step = (hi_t - lo_t) / n as f64;
    let (mut a, mut b) = (
        lo_t + step * (best_i as f64 - 1.0),
        lo_t + step * (best_i as f64 + 1.0),
    );
    let phi = 0.5 * (5f64.sqrt() - 1.0);
    let mut c = b - phi * (b - a);
    let mut d = a + phi * (b - a);
    for _ in 0..200 {
        if g(c) < g(d) {
            b = d;
        } else {
            a = c;
        }
        c = b - phi * (b - a);
        d = a + phi * (b - a);
        if (b - a).abs() < 1e-13 {
            break;
        }
    }
    let t = 0.5 * (a + b);
    let order = 1.0 + t.exp();
    EpsilonAtOrder {
        epsilon: f(order).min(best).max(0.0),
        order,
    }
}

/// The simple conversion `rho + 2 sqrt(rho log(1/delta))` (Bun–Steinke; seed 002 Prop. 1).
pub fn zcdp_epsilon_simple(rho: f64, delta: f64) -> f64 {
    rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_zero_semantics() {
        let e = epsilon_from_rdp(&[2.0, 3.0], &[0.0, 0.0], 0.0, Conversion::Improved);
        assert_eq!(e.epsilon, 0.0);
        let e = epsilon_from_rdp(&[2.0, 3.0], &[0.0, 1e-9], 0.0, Conversion::Improved);
        assert_eq!(e.epsilon, f64::INFINITY);
    }

    #[test]
    fn improved_is_never_worse_than_classic() {
        let orders = [1.5, 2.0, 8.0, 32.0];
        let rdp = [0.01, 0.02, 0.1, 0.5];
        let i = epsilon_from_rdp(&orders, &rdp, 1e-5, Conversion::Improved);
        let c = epsilon_from_rdp(&orders, &rdp, 1e-5, Conversion::Classic);
        assert!(i.epsilon <= c.epsilon);
    }

    #[test]
    fn delta_inverts_epsilon() {
        let orders: Vec<f64> = (2..64).map(f64::from).collect();
        let rdp: Vec<f64> = orders.iter().map(|a| a * 0.01).collect();
        let e = epsilon_from_rdp(&orders, &rdp, 1e-6, Conversion::Improved);
        let d = delta_from_rdp(&orders, &rdp, e.epsilon);
        assert!(d.delta <= 1e-6 * (1.0 + 1e-9), "{d:?}");
    }

    #[test]
    fn zcdp_exact_beats_simple_and_matches_gaussian_closed_form() {
        for &(rho, delta) in &[(0.01, 1e-5), (1.0, 1e-6), (0.0001, 1e-10)] {
            let exact = zcdp_epsilon_exact(rho, delta).epsilon;
            assert!(exact <= zcdp_epsilon_simple(rho, delta));
            // Simple bound of classic conversion: rho + 2 sqrt(rho ln 1/delta) is the optimum
            // of the classic formula, so the improved exact value must be below it.
            assert!(exact > 0.0);
        }
    }
}

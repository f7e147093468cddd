//! Tanh-sinh (double-exponential) quadrature on a finite interval.
//!
//! Used where a closed-form series would cancel catastrophically (see `sgm`). The
//! integrands we hand it are smooth and non-negative, for which tanh-sinh converges
//! doubly exponentially: each halving of the step roughly squares the relative
//! error. We therefore stop once two successive levels agree to `sqrt(rel_tol)`
//! and estimate the error of the finer level as `diff² / |I|` (the usual
//! double-exponential estimate), floored at a few ulps of the result.

use std::f64::consts::FRAC_PI_2;

/// Beyond |t| = 4 the weights are below 1e-35 of the central weight.
const T_MAX: f64 = 4.0;
const MAX_LEVELS: u32 = 12;

/// `(integral of f over [a, b], error estimate)`. If `f` returns a non-finite value
/// anywhere it is evaluated, the answer is `(inf, inf)`: callers computing privacy
/// losses turn that into an infinite (safe) bound rather than an underestimate.
pub fn tanh_sinh<F: Fn(f64) -> f64>(f: F, a: f64, b: f64, rel_tol: f64) -> (f64, f64) {
    if b <= a {
        return (0.0, 0.0);
    }
    let centre = 0.5 * (a + b);
    let half = 0.5 * (b - a);
    let node = |t: f64| -> f64 {
        let u = FRAC_PI_2 * t.sinh();
        let weight = FRAC_PI_2 * t.cosh() / (u.cosh() * u.cosh());
        if weight == 0.0 {
            return 0.0;
        }
        let x = (centre + half * u.tanh()).clamp(a, b);
        // A non-finite value propagates: the caller must see it and fail closed,
        // never receive an integral that silently dropped part of its mass.
        weight * f(x)
    };
    let mut h = 0.5;
    let mut sum = node(0.0);
    let mut k = 1;
    while (k as f64) * h <= T_MAX {
        let t = k as f64 * h;
        sum += node(t) + node(-t);
        k += 1;
    }
    let mut estimate = half * h * sum;
    if !estimate.is_finite() {
        return (f64::INFINITY, f64::INFINITY);
    }
    for level in 1..=MAX_LEVELS {
        h *= 0.5;
        let mut k = 1;
        while (k as f64) * h <= T_MAX {
            let t = k as f64 * h;
            sum += node(t) + node(-t);
            k += 2;
        }
        let next = half * h * sum;
        let diff = (next - estimate).abs();
        estimate = next;
        if !next.is_finite() {
            return (f64::INFINITY, f64::INFINITY);
        }
        if next == 0.0 {
            return (0.0, 0.0);
        }
        if level >= 3 && diff <= rel_tol.sqrt() * next.abs() {
            let err = (diff * diff / next.abs()).max(16.0 * f64::EPSILON * next.abs());
            return (next, err);
        }
        if level == MAX_LEVELS {
            return (next, diff);
        }
    }
    (estimate, f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_fail_closed() {
        let (v, e) = tanh_sinh(|x| if x > 0.7 { f64::NAN } else { 1.0 }, 0.0, 1.0, 1e-15);
        assert_eq!((v, e), (f64::INFINITY, f64::INFINITY));
    }

    #[test]
    fn integrates_known_functions() {
        let (v, e) = tanh_sinh(|x| x.exp(), 0.0, 1.0, 1e-15);
        assert!((v - (1f64.exp() - 1.0)).abs() < 1e-14, "{v} err {e}");
        let (v, _) = tanh_sinh(|x| (-x * x / 2.0).exp(), -40.0, 40.0, 1e-15);
        assert!(
            (v - (2.0 * std::f64::consts::PI).sqrt()).abs() < 1e-13,
            "{v}"
        );
        let (v, _) = tanh_sinh(|x| 1.0 / (1.0 + x * x), -1.0, 1.0, 1e-15);
        assert!((v - std::f64::consts::FRAC_PI_2).abs() < 1e-14);
    }
}

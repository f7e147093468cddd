//! Discretised PLDs of single mechanisms by connect-the-dots (Doroshenko et al.
//! 2022): exact hockey-stick values `delta(k h)` on the grid become a discrete
//! pair whose curve is their chord interpolation in `gamma = e^eps`.
//!
//! Why this is pessimistic: `gamma -> H_gamma(P||Q)` is convex, equals 1 at
//! `gamma = 0` and is non-increasing. The discrete pair's curve is linear in
//! `gamma` between grid points (a chord of a convex function, hence above it),
//! the line from `(0, 1)` to the first grid point below the grid (a chord again),
//! and the constant `delta(l_max)` above the grid (the curve is non-increasing),
//! that constant being the mass placed at `+inf`. So the discrete pair dominates
//! `(P, Q)` at every `gamma >= 0`, and dominating pairs compose (Zhu, Dong, Wang
//! 2022, Thm. 10). Masses are second differences of the convex curve, hence
//! `>= 0`; a negative value from rounding is raised to 0, which only adds mass
//! (every `delta` grows).

use super::pmf::DiscretePld;
use crate::accounting::error::{InvalidArgument, Result};

/// Standard normal tail quantile used to cut the support: `Phi^c(11.5) < 1e-30`,
/// so even 1e7 compositions lose less than 1e-23 to the cut (and that goes to
/// delta via the infinity mass anyway).
pub const Z_CUT: f64 = 11.5;
/// Largest grid a single mechanism may occupy.
pub const MAX_SINGLE_BINS: i64 = 1 << 24;

/// Which of the two neighbouring orders the pair describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `P` = with the example (mixture), `Q` = without.
    Remove,
    /// `P` = without the example, `Q` = with it.
    Add,
}

/// Which `erfc` a computation uses. The proven worst case keeps the `libm`
/// crate's (the FreeBSD msun port, < 1 ulp, the same on every platform); the
/// per-example *estimate* (`"guarantee": false`) may take glibc's where there is
/// one: about twice as fast (the `libm` crate computes its own `exp`), a few ulp
/// apart, and building an estimate's level evaluates four per grid point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// A bound: `libm`'s `erfc` everywhere.
    Guarantee,
    /// An estimate: the platform's `erfc` where it is faster.
    Estimate,
}

/// `Phi^c(z)`, the standard normal upper tail (`libm`'s `erfc`).
pub fn normal_sf(z: f64) -> f64 {
    normal_sf_with(Precision::Guarantee, z)
}

/// `Phi^c(z)` with the `erfc` that `precision` asks for.
fn normal_sf_with(precision: Precision, z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    0.5 * match precision {
        Precision::Guarantee => libm::erfc(x),
        Precision::Estimate => fast_erfc(x),
    }
}

/// glibc's `erfc` on linux-gnu, else the `libm` crate's.
fn fast_erfc(x: f64) -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn erfc(x: f64) -> f64;
        }
        // SAFETY: C99's erfc, a pure function of one double (glibc's libm,
        // which std links on this target).
        unsafe { erfc(x) }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        libm::erfc(x)
    }
}

#[cfg(test)]
fn normal_cdf(z: f64) -> f64 {
    normal_sf(-z)
}

fn normal_cdf_with(precision: Precision, z: f64) -> f64 {
    normal_sf_with(precision, -z)
}

/// Privacy loss `ln((1-q) + q e^{(2x-1)/(2 s^2)})` of the remove pair at `x`.
fn remove_loss(q: f64, sigma: f64, x: f64) -> f64 {
    let a = (2.0 * x - 1.0) / (2.0 * sigma * sigma) + q.ln();
    if q >= 1.0 {
        return a;
    }
    let b = (-q).ln_1p();
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// Exact hockey-stick divergence of the Poisson-subsampled Gaussian
/// (sensitivity 1, noise multiplier `sigma`, rate `q`) in one direction.
pub fn sgm_delta(q: f64, sigma: f64, dir: Direction, eps: f64) -> f64 {
    sgm_delta_with(Precision::Guarantee, q, sigma, dir, eps)
}

/// [`sgm_delta`] with the `erfc` that `precision` asks for.
fn sgm_delta_with(precision: Precision, q: f64, sigma: f64, dir: Direction, eps: f64) -> f64 {
    let sf = |z: f64| normal_sf_with(precision, z);
    let cdf = |z: f64| normal_cdf_with(precision, z);
    let s2 = sigma * sigma;
    let d = match dir {
        Direction::Remove => {
            // L > eps  <=>  x > x*, with e^eps - 1 + q = q e^{(2x*-1)/(2 s^2)}.
            let w = eps.exp_m1() + q;
            if w <= 0.0 {
                return -eps.exp_m1();
            }
            let x = s2 * (w / q).ln() + 0.5;
            q * sf((x - 1.0) / sigma) - w * sf(x / sigma)
        }
        Direction::Add => {
            // L > eps  <=>  x < x*, with e^-eps - 1 + q = q e^{(2x*-1)/(2 s^2)}.
            let w = (-eps).exp_m1() + q;
            if w <= 0.0 {
                return 0.0;
            }
            let x = s2 * (w / q).ln() + 0.5;
            let e = eps.exp();
            (1.0 - e * (1.0 - q)) * cdf(x / sigma) - e * q * cdf((x - 1.0) / sigma)
        }
    };
    d.clamp(0.0, 1.0)
}

/// Hockey-stick divergence of randomized response with loss `+-eps0`: the
/// tight dominating pair of every `eps0`-DP mechanism (Kairouz et al. 2015).
pub fn pure_dp_delta(eps0: f64, eps: f64) -> f64 {
    let p = 1.0 / (1.0 + (-eps0).exp());
    let hi = if eps < eps0 {
        -(eps - eps0).exp_m1()
    } else {
        0.0
    };
    let lo = if eps < -eps0 {
        -(eps + eps0).exp_m1()
    } else {
        0.0
    };
    p * hi + (1.0 - p) * lo
}

/// Connect-the-dots PLD of a curve `delta` on grid indices `lo..=hi` (step `h`).
pub fn connect_the_dots(
    h: f64,
    lo: i64,
    hi: i64,
    delta: impl Fn(f64) -> f64,
) -> Result<DiscretePld> {
    if hi - lo > MAX_SINGLE_BINS {
        return Err(InvalidArgument::new(
            "value_discretization",
            format!(
                "{h} needs {} grid points for one mechanism (at most {MAX_SINGLE_BINS}); use a coarser discretisation",
                hi - lo
            ),
        ));
    }
    let d: Vec<f64> = (lo..=hi).map(|k| delta(k as f64 * h)).collect();
    let m = d.len();
    let em1 = h.exp_m1();
    let eh = h.exp();
    let mut probs = vec![0.0; m];
    for j in 0..m {
        let above = if j + 1 < m {
            (d[j + 1] - d[j]) / em1
        } else {
            0.0
        };
        let below = if j == 0 {
            d[0] - 1.0 // slope from (0, 1), times gamma_0
        } else {
            eh * (d[j] - d[j - 1]) / em1
        };
        probs[j] = (above - below).max(0.0);
    }
    Ok(DiscretePld {
        step: h,
        first: lo,
        probs,
        infinity_mass: d[m - 1],
    })
}

/// The PLD of one Poisson-subsampled Gaussian step in direction `dir`.
pub fn sgm_pld(q: f64, sigma: f64, dir: Direction, h: f64) -> Result<DiscretePld> {
    sgm_pld_cut(q, sigma, dir, h, Z_CUT, Precision::Guarantee)
}

/// As [`sgm_pld`], with the support cut at `z_cut` noise standard deviations
/// on either side instead of [`Z_CUT`]. Any cut is pessimistic (the
/// connect-the-dots pair collapses the mass below the grid onto its first
/// point and puts the mass above it at `+inf`); it costs accuracy only, at most
/// `2 Phi^c(z_cut)` of delta per composed step (the two pairs differ only on
/// samples beyond the cut). Per-example estimates use it to build narrower
/// single-step PLDs, with [`Precision::Estimate`].
pub fn sgm_pld_cut(
    q: f64,
    sigma: f64,
    dir: Direction,
    h: f64,
    z_cut: f64,
    precision: Precision,
) -> Result<DiscretePld> {
    if !(q > 0.0 && q <= 1.0 && sigma > 0.0 && sigma.is_finite()) {
        return Err(InvalidArgument::new(
            "noise_multiplier",
            format!("PLD needs q in (0, 1] and sigma > 0, got q = {q}, sigma = {sigma}"),
        ));
    }
    let z_cut = z_cut.min(Z_CUT);
    let lo_x = -z_cut * sigma;
    let hi_x = 1.0 + z_cut * sigma;
    let (lo, hi) = match dir {
        Direction::Remove => (remove_loss(q, sigma, lo_x), remove_loss(q, sigma, hi_x)),
        Direction::Add => (
            -remove_loss(q, sigma, z_cut * sigma),
            -remove_loss(q, sigma, lo_x),
        ),
    };
    let (lo, hi) = ((lo / h).floor() as i64 - 1, (hi / h).ceil() as i64 + 1);
    connect_the_dots(h, lo, hi, |e| sgm_delta_with(precision, q, sigma, dir, e))
}

/// The PLD of an `eps0`-DP mechanism (both directions are the same).
pub fn pure_dp_pld(eps0: f64, h: f64) -> Result<DiscretePld> {
    let k = (eps0 / h).ceil() as i64;
    connect_the_dots(h, -k - 1, k + 1, |e| pure_dp_delta(eps0, e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_guarantee_keeps_libm_and_the_estimate_stays_within_a_few_ulp() {
        for k in -600..=600 {
            let z = k as f64 / 50.0;
            let x = z / std::f64::consts::SQRT_2;
            assert_eq!(
                normal_sf(z).to_bits(),
                (0.5 * libm::erfc(x)).to_bits(),
                "{z}"
            );
            let (g, e) = (
                normal_sf_with(Precision::Guarantee, z),
                normal_sf_with(Precision::Estimate, z),
            );
            assert!((g - e).abs() <= 8.0 * f64::EPSILON * g, "{z}: {g} vs {e}");
        }
    }

    use super::*;

    #[test]
    fn gaussian_curve_matches_closed_form() {
        // q = 1: delta = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s)).
        let s: f64 = 1.3;
        for &e in &[0.0, 0.5, 2.0] {
            let want = normal_cdf(-e * s + 0.5 / s) - e.exp() * normal_cdf(-e * s - 0.5 / s);
            for dir in [Direction::Remove, Direction::Add] {
                let got = sgm_delta(1.0, s, dir, e);
                assert!((got - want).abs() < 1e-14, "{dir:?} {e} {got} {want}");
            }
        }
    }

    #[test]
    fn discrete_pair_dominates_the_exact_curve() {
        for dir in [Direction::Remove, Direction::Add] {
            let pld = sgm_pld(0.05, 0.9, dir, 1e-2).unwrap();
            let total: f64 = pld.probs.iter().sum::<f64>() + pld.infinity_mass;
            assert!((total - 1.0).abs() < 1e-9, "{total}");
            for i in 0..400 {
                let e = -0.3 + i as f64 * 0.00731;
                let exact = sgm_delta(0.05, 0.9, dir, e);
                assert!(pld.delta_for_epsilon(e) >= exact - 1e-13, "{dir:?} {e}");
            }
        }
    }

    #[test]
    fn a_narrower_cut_dominates_and_costs_at_most_its_tail() {
        for dir in [Direction::Remove, Direction::Add] {
            let full = sgm_pld(0.01, 1.0, dir, 1e-3).unwrap();
            let cut = sgm_pld_cut(0.01, 1.0, dir, 1e-3, 5.0, Precision::Guarantee).unwrap();
            assert!(cut.probs.len() < full.probs.len(), "{dir:?}");
            for i in 0..200 {
                let e = -0.2 + i as f64 * 0.021;
                let (c, f) = (cut.delta_for_epsilon(e), full.delta_for_epsilon(e));
                assert!(c >= f - 1e-15, "{dir:?} {e}: {c} < {f}");
                assert!(c <= f + 2.0 * normal_sf(5.0), "{dir:?} {e}: {c} vs {f}");
            }
        }
    }

    #[test]
    fn pure_dp_pld_is_exact_on_grid() {
        let pld = pure_dp_pld(0.5, 0.01).unwrap();
        assert!(pld.delta_for_epsilon(0.5) < 1e-15);
        assert!((pld.delta_for_epsilon(0.2) - pure_dp_delta(0.5, 0.2)).abs() < 1e-12);
    }
}

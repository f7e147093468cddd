//! DP quantiles of values in `[0, B]` (issue 6, item 2).
//!
//! Default method: the recursive approximate-quantiles algorithm of Kaplan,
//! Schnapp & Stemmer (ICML 2022) over the exponential mechanism on intervals
//! (Smith 2011), accounted in zCDP. The median level is estimated first, the data
//! split at the estimate, and each side recursively estimates its own levels
//! (rescaled to the side). At each depth the sub-problems see disjoint data, so
//! one example influences one exponential mechanism per depth: with `L` depths
//! (`ceil(log2(m+1))` for `m` levels) and each mechanism `η`-bounded-range, the
//! whole release is `L η² / 8`-zCDP (Cesar & Rogers 2021: `η`-BR ⇒ `η²/8`-zCDP).
//!
//! The utility of an interval holding `i` points below it is `-|i − q·n|`. Under
//! add/remove of one value every utility moves by `+(1−q)` or `−q` on one side of
//! the value and by `±q` or `∓(1−q)` on the other, so the utilities' changes span
//! a range of at most 1: sampling with weight `exp(η u)` is `η`-bounded-range.
//!
//! Ties (many examples share the worst case `B`; unsampled ones share values)
//! would give intervals of width zero that the mechanism can never choose, so
//! every value first moves by an independent uniform jitter of width `B·1e-9`
//! (reflected into `[0, B]`), and outputs within that width of `0` or `B` snap
//! to the end point. Both are per-record randomisation and post-processing.

use super::noise::{add_gaussian, gumbel};
use rand::Rng;

/// Relative width of the tie-breaking jitter.
pub const JITTER: f64 = 1e-9;

/// Number of recursion depths of the KSS algorithm for `m` levels (the number of
/// exponential mechanisms any one example takes part in).
pub fn kss_depth(m: usize) -> usize {
    if m == 0 {
        0
    } else {
        let p = m / 2;
        1 + kss_depth(p).max(kss_depth(m - p - 1))
    }
}

/// The per-mechanism parameter `η` that makes `m` levels cost `rho` in total.
pub fn kss_eta(m: usize, rho: f64) -> f64 {
    (8.0 * rho / kss_depth(m) as f64).sqrt()
}

/// The zCDP cost of KSS with `m` levels and per-mechanism parameter `eta`.
pub fn kss_rho(m: usize, eta: f64) -> f64 {
    kss_depth(m) as f64 * eta * eta / 8.0
}

/// Release the quantiles at `levels` (each in (0, 1), strictly increasing) of
/// `values` in `[0, bound]` with KSS at total zCDP cost `rho`. The estimates are
/// non-decreasing in the level.
pub fn kss_quantiles<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    let eta = kss_eta(levels.len(), rho);
    let width = bound * JITTER;
    let mut xs: Vec<f64> = values
        .iter()
        .map(|&x| jitter(x.clamp(0.0, bound), width, bound, rng))
        .collect();
    xs.sort_unstable_by(f64::total_cmp);
    let mut out = vec![0.0; levels.len()];
    recurse(rng, &xs, 0.0, bound, levels, eta, &mut out);
    out.iter().map(|&v| snap(v, width, bound)).collect()
}

fn jitter<R: Rng + ?Sized>(x: f64, width: f64, bound: f64, rng: &mut R) -> f64 {
    let y = x + (rng.random::<f64>() - 0.5) * width;
    if y < 0.0 {
        (-y).min(bound)
    } else if y > bound {
        (2.0 * bound - y).max(0.0)
    } else {
        y
    }
}

fn snap(v: f64, width: f64, bound: f64) -> f64 {
    if v >= bound - width {
        bound
    } else if v <= width {
        0.0
    } else {
        v
    }
}

fn recurse<R: Rng + ?Sized>(
    rng: &mut R,
    xs: &[f64],
    lo: f64,
    hi: f64,
    levels: &[f64],
    eta: f64,
    out: &mut [f64],
) {
    if levels.is_empty() {
        return;
    }
    let p = levels.len() / 2;
    let q = levels[p];
    let (v, below) = interval_mechanism(rng, xs, lo, hi, q, eta);
    out[p] = v;
    let left: Vec<f64> = levels[..p].iter().map(|&l| l / q).collect();
    let right: Vec<f64> = levels[p + 1..]
        .iter()
        .map(|&l| (l - q) / (1.0 - q))
        .collect();
    let (out_left, rest) = out.split_at_mut(p);
    recurse(rng, &xs[..below], lo, v, &left, eta, out_left);
    recurse(rng, &xs[below..], v, hi, &right, eta, &mut rest[1..]);
}

/// The exponential mechanism on intervals (Smith 2011) for the `q`-quantile of the
/// sorted `xs` within `[lo, hi]`: interval `i` (between the `i`-th and `i+1`-th
/// point, `i` points below it) is chosen with probability proportional to
/// `width_i · exp(−η |i − q n|)` (Gumbel-max in log space), then a point uniformly
/// inside it. Returns the point and the number of values below it.
pub fn interval_mechanism<R: Rng + ?Sized>(
    rng: &mut R,
    xs: &[f64],
    lo: f64,
    hi: f64,
    q: f64,
    eta: f64,
) -> (f64, usize) {
    let n = xs.len();
    let target = q * n as f64;
    let mut best = (f64::NEG_INFINITY, 0usize);
    for i in 0..=n {
        let left = if i == 0 { lo } else { xs[i - 1].max(lo) };
        let right = if i == n { hi } else { xs[i].min(hi) };
        let width = right - left;
        if width <= 0.0 {
            continue;
        }
        let score = width.ln() - eta * (i as f64 - target).abs() + gumbel(rng);
        if score > best.0 {
            best = (score, i);
        }
    }
    if best.0 == f64::NEG_INFINITY {
        // A degenerate domain (lo == hi): its only point.
        return (lo, xs.partition_point(|&x| x < lo));
    }
    let i = best.1;
    let left = if i == 0 { lo } else { xs[i - 1].max(lo) };
    let right = if i == n { hi } else { xs[i].min(hi) };
    let v = left + rng.random::<f64>() * (right - left);
    (v, i)
}

/// Number of full-batch gradient steps of the seed's method (seed 000, App. E).
pub const GRADIENT_STEPS: usize = 20;

/// The noise standard deviation of the gradient method: `steps × m` noisy
/// gradient sums and one noisy count, each of sensitivity at most 1.
pub fn gradient_sigma(m: usize, steps: usize, rho: f64) -> f64 {
    ((steps * m + 1) as f64 / (2.0 * rho)).sqrt()
}

/// The seed's method (seed 000, App. E; Andrew et al. 2021's quantile objective):
/// per level, `steps` full-batch gradient steps on the pinball loss from `B/2`.
/// The gradient `Σ (1[x ≤ θ] − q)` has sensitivity `max(q, 1−q) ≤ 1` and gets
/// Gaussian noise; it is normalised by a noisy count (sensitivity 1), and the
/// step size decays as `B / (2 sqrt(t+1))`. Estimates are sorted (post-processing).
pub fn gradient_quantiles<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
    steps: usize,
) -> Vec<f64> {
    let sigma = gradient_sigma(levels.len(), steps, rho);
    let mut xs: Vec<f64> = values.iter().map(|&x| x.clamp(0.0, bound)).collect();
    xs.sort_unstable_by(f64::total_cmp);
    let count = add_gaussian(rng, xs.len() as f64, sigma).max(1.0);
    let mut out: Vec<f64> = levels
        .iter()
        .map(|&q| {
            let mut theta = bound / 2.0;
            for t in 0..steps {
                let at_or_below = xs.partition_point(|&x| x <= theta) as f64;
                let grad = add_gaussian(rng, at_or_below - q * xs.len() as f64, sigma) / count;
                let rate = bound / (2.0 * ((t + 1) as f64).sqrt());
                theta = (theta - rate * grad).clamp(0.0, bound);
            }
            theta
        })
        .collect();
    out.sort_unstable_by(f64::total_cmp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn depth_is_ceil_log2_of_m_plus_one() {
        for m in 1..200usize {
            let expect = ((m + 1) as f64).log2().ceil() as usize;
            assert_eq!(kss_depth(m), expect, "m = {m}");
        }
    }

    #[test]
    fn cost_formula_round_trips() {
        for m in [1usize, 5, 9, 31] {
            let eta = kss_eta(m, 0.00125);
            assert!((kss_rho(m, eta) - 0.00125).abs() < 1e-17);
        }
        // Five levels take three depths: η = sqrt(8 ρ / 3).
        assert!((kss_eta(5, 0.00125) - (0.01f64 / 3.0).sqrt()).abs() < 1e-15);
    }

    #[test]
    fn gradient_method_spends_exactly_rho() {
        use crate::release::noise::gaussian_rho;
        for (m, steps, rho) in [(5usize, 20usize, 0.00125), (1, 1, 0.5), (9, 100, 2.0)] {
            let sigma = gradient_sigma(m, steps, rho);
            // steps × m gradient sums and one count, each of sensitivity 1.
            let spent = (steps * m + 1) as f64 * gaussian_rho(1.0, sigma);
            assert!(
                (spent - rho).abs() <= 1e-15 * rho.max(1.0),
                "{spent} vs {rho}"
            );
        }
    }

    #[test]
    fn interval_mechanism_concentrates_on_the_target_rank() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
        let xs: Vec<f64> = (1..=1000).map(|i| i as f64).collect();
        let mut total = 0usize;
        for _ in 0..200 {
            let (v, below) = interval_mechanism(&mut rng, &xs, 0.0, 1001.0, 0.5, 1.0);
            assert!((0.0..=1001.0).contains(&v));
            assert_eq!(below, xs.partition_point(|&x| x < v));
            total += below.abs_diff(500);
        }
        // With η = 1 the rank error is Laplace-like with scale 1.
        assert!(
            total as f64 / 200.0 < 3.0,
            "mean error {}",
            total as f64 / 200.0
        );
    }

    #[test]
    fn estimates_are_monotone_and_inside_the_domain() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
        let values: Vec<f64> = (0..5000)
            .map(|i| ((i * 7919) % 5000) as f64 / 1000.0)
            .collect();
        let levels = [0.05, 0.25, 0.5, 0.75, 0.95];
        for est in [
            kss_quantiles(&mut rng, &values, 5.0, &levels, 0.01),
            gradient_quantiles(&mut rng, &values, 5.0, &levels, 0.01, GRADIENT_STEPS),
        ] {
            assert!(est.windows(2).all(|w| w[0] <= w[1]), "{est:?}");
            assert!(est.iter().all(|v| (0.0..=5.0).contains(v)), "{est:?}");
        }
    }

    #[test]
    fn ties_at_the_bound_are_found() {
        // Half the values exactly at B: the 0.75-quantile is B.
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        let mut values: Vec<f64> = (0..5000).map(|i| i as f64 / 5000.0).collect();
        values.extend(std::iter::repeat_n(2.0, 5000));
        let est = kss_quantiles(&mut rng, &values, 2.0, &[0.25, 0.75], 0.01);
        assert_eq!(est[1], 2.0, "{est:?}");
        assert!((est[0] - 0.5).abs() < 0.05, "{est:?}");
    }
}

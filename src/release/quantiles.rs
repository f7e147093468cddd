//! DP quantiles of values in `[0, B]` (issue 6, item 2; issue 15, item 8).
//!
//! Default method: the recursive approximate-quantiles algorithm of Kaplan,
//! Schnapp & Stemmer (ICML 2022) over an exponential mechanism on a public grid,
//! accounted in zCDP. The median level is estimated first, the data split at the
//! estimate, and each side recursively estimates its own levels (rescaled to the
//! side). At each depth the sub-problems see disjoint data, so one example
//! influences one exponential mechanism per depth: with `L` depths
//! (`ceil(log2(m+1))` for `m` levels) and each mechanism `η`-bounded-range, the
//! whole release is `L η² / 8`-zCDP (Cesar & Rogers 2021: `η`-BR ⇒ `η²/8`-zCDP).
//! The full proof is in `docs/releases-quantiles.md`; in brief:
//!
//! * **Grid.** Every value is mapped to one of `GRID_CELLS + 2` public cells: the
//!   atoms `{0}` and `{B}`, and `GRID_CELLS` intervals of width `h = B /
//!   GRID_CELLS` between them (a fixed per-record map). The mechanism samples a
//!   cell from the counting measure on the cells of its sub-domain, a
//!   data-independent base measure, and releases the cell's public
//!   representative (post-processing). Values that share a cell (in particular a
//!   run of equal epsilons) form one cell, so a run of 1,400 equal values is
//!   one output whose utility is 0 whenever the target rank falls in the run:
//!   the old jitter gave such a run a width of `B·1e-9` and it was almost never
//!   chosen (issue 15).
//! * **Utility.** Cell `c` holds the ranks `[a, b] = [#{x < c}, #{x ≤ c}]`; its
//!   utility is `−s(q) · dist(q·n, [a, b])` with `s(q) = 1 / (2 max(q, 1−q))`.
//!   Under add/remove of one value, the cells below it shift `[a, b]` by `−q`
//!   relative to the target, those above by `1−q`, and its own cell widens by
//!   `q` below and `1−q` above; since the intervals are ordered the changes of
//!   `u` span at most `2 s(q) max(q, 1−q) = 1`, so sampling with weight
//!   `exp(η u)` is `η`-bounded-range. (Without the factor `s(q)`, as before this
//!   change, the span reaches `2 max(q, 1−q)`, up to 1.6 at the level 0.8 that
//!   five levels use: the old mechanism spent more than it charged.)
//! * **Splitting a cell.** The examples of the chosen cell go to the left or the
//!   right sub-problem by independent fair coins (a per-record randomisation
//!   whose law does not depend on the data), so given the coins each example
//!   still lands in exactly one sub-problem, and by the joint quasi-convexity of
//!   Rényi divergence the mixture over coins keeps the bound.

use super::noise::{add_gaussian, gumbel};
use rand::Rng;
use rand_distr::{Binomial, Distribution};

/// Number of interval cells of the public grid: the release resolution is
/// `B / GRID_CELLS` (measured choice; see `docs/releases-quantiles.md`).
pub const GRID_CELLS: u32 = 1 << 16;

/// The release's public value resolution `h = B / GRID_CELLS`, in units of `B`.
pub fn resolution() -> f64 {
    1.0 / f64::from(GRID_CELLS)
}

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

/// The grid cell of `x` (clamped into `[0, bound]`): `0` for the atom `{0}`,
/// `GRID_CELLS + 1` for the atom `{bound}`, else `ceil(x / h)` in `1..=GRID_CELLS`.
pub fn cell_of(x: f64, bound: f64) -> u32 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= bound {
        GRID_CELLS + 1
    } else {
        ((x / bound * f64::from(GRID_CELLS)).ceil() as u32).clamp(1, GRID_CELLS)
    }
}

/// The public value released for a cell: `0`, `bound`, or the cell's midpoint.
pub fn cell_value(c: u32, bound: f64) -> f64 {
    match c {
        0 => 0.0,
        c if c > GRID_CELLS => bound,
        c => (f64::from(c) - 0.5) / f64::from(GRID_CELLS) * bound,
    }
}

/// The utility scale `s(q) = 1 / (2 max(q, 1−q))` that bounds the span of the
/// utilities' changes by 1 under add/remove (module doc).
pub fn utility_scale(q: f64) -> f64 {
    0.5 / q.max(1.0 - q)
}

/// Release the quantiles at `levels` (each in (0, 1), strictly increasing) of
/// `values` in `[0, bound]` with KSS at total zCDP cost `rho`. The estimates are
/// non-decreasing in the level and lie on the public grid.
pub fn kss_quantiles<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    let eta = kss_eta(levels.len(), rho);
    let mut cells: Vec<u32> = values.iter().map(|&x| cell_of(x, bound)).collect();
    cells.sort_unstable();
    let mut out = vec![0u32; levels.len()];
    recurse(rng, &cells, 0, GRID_CELLS + 1, levels, eta, &mut out);
    out.iter().map(|&c| cell_value(c, bound)).collect()
}

fn recurse<R: Rng + ?Sized>(
    rng: &mut R,
    cells: &[u32],
    lo: u32,
    hi: u32,
    levels: &[f64],
    eta: f64,
    out: &mut [u32],
) {
    if levels.is_empty() {
        return;
    }
    let p = levels.len() / 2;
    let q = levels[p];
    let (c, split) = cell_mechanism(rng, cells, lo, hi, q, eta);
    out[p] = c;
    let left: Vec<f64> = levels[..p].iter().map(|&l| l / q).collect();
    let right: Vec<f64> = levels[p + 1..]
        .iter()
        .map(|&l| (l - q) / (1.0 - q))
        .collect();
    let (out_left, rest) = out.split_at_mut(p);
    recurse(rng, &cells[..split], lo, c, &left, eta, out_left);
    recurse(rng, &cells[split..], c, hi, &right, eta, &mut rest[1..]);
}

/// The exponential mechanism on the grid cells `lo..=hi` for the `q`-quantile of
/// the sorted `cells` (all within `lo..=hi`): cell `c` is chosen with probability
/// proportional to `exp(−η s(q) dist(q n, [#{x < c}, #{x ≤ c}]))` (Gumbel-max in
/// log space over runs of cells with equal utility). Returns the cell and the
/// split index: the values below it, plus a fair-coin share of the values in it.
pub fn cell_mechanism<R: Rng + ?Sized>(
    rng: &mut R,
    cells: &[u32],
    lo: u32,
    hi: u32,
    q: f64,
    eta: f64,
) -> (u32, usize) {
    let target = q * cells.len() as f64;
    let scale = eta * utility_scale(q);
    // Best (score, first cell, cells in the run, values below, values in the cell).
    let mut best = (f64::NEG_INFINITY, lo, 1u32, 0usize, 0usize);
    let mut consider = |rng: &mut R, first: u32, count: u32, below: usize, tied: usize| {
        let (a, b) = (below as f64, (below + tied) as f64);
        let dist = (a - target).max(target - b).max(0.0);
        let score = f64::from(count).ln() - scale * dist + gumbel(rng);
        if score > best.0 {
            best = (score, first, count, below, tied);
        }
    };
    let (mut next, mut below) = (lo, 0usize);
    while below < cells.len() {
        let c = cells[below];
        let tied = cells[below..].partition_point(|&x| x == c);
        if c > next {
            consider(rng, next, c - next, below, 0);
        }
        consider(rng, c, 1, below, tied);
        below += tied;
        next = c + 1;
    }
    if next <= hi {
        consider(rng, next, hi - next + 1, below, 0);
    }
    let (_, first, count, below, tied) = best;
    let c = first + rng.random_range(0..count);
    let to_left = if tied == 0 {
        0
    } else {
        Binomial::new(tied as u64, 0.5).map_or(0, |b| b.sample(rng) as usize)
    };
    (c, below + to_left)
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
    fn cell_mechanism_concentrates_on_the_target_rank() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
        let cells: Vec<u32> = (1..=1000).map(|i| i * 50).collect();
        let mut total = 0usize;
        for _ in 0..200 {
            let (c, split) = cell_mechanism(&mut rng, &cells, 0, GRID_CELLS + 1, 0.5, 1.0);
            assert!(c <= GRID_CELLS + 1);
            let below = cells.partition_point(|&x| x < c);
            assert!((below..=cells.partition_point(|&x| x <= c)).contains(&split));
            total += split.abs_diff(500);
        }
        // With η s = 1 the rank error is Laplace-like with scale 1, plus
        // log(50)/η for the 49 empty cells of each gap.
        let mean = total as f64 / 200.0;
        assert!(mean < 8.0, "mean error {mean}");
    }

    #[test]
    fn a_tied_run_covering_the_target_is_chosen() {
        // 300 distinct values 1,000 cells apart, the middle one repeated 2,000
        // times: the median is that value, with utility 0 over 2,000 ranks.
        let mut rng = rand_pcg::Pcg64::seed_from_u64(4);
        let mut cells: Vec<u32> = (1..=300).map(|i| i * 200).collect();
        cells.extend(std::iter::repeat_n(150 * 200, 2000));
        cells.sort_unstable();
        let hits = (0..200)
            .filter(|_| cell_mechanism(&mut rng, &cells, 0, GRID_CELLS + 1, 0.5, 0.05).0 == 30_000)
            .count();
        assert!(hits >= 190, "{hits} of 200");
    }

    #[test]
    fn cells_round_trip_within_the_resolution() {
        for x in [0.0, 1e-12, 0.3, 0.5, 0.999_999_9, 1.0] {
            let v = cell_value(cell_of(x, 1.0), 1.0);
            assert!((v - x).abs() <= resolution() / 2.0 + 1e-15, "{x} -> {v}");
        }
        assert_eq!(cell_value(cell_of(0.0, 2.0), 2.0), 0.0);
        assert_eq!(cell_value(cell_of(2.0, 2.0), 2.0), 2.0);
    }

    #[test]
    fn utility_changes_span_at_most_one() {
        // Brute force over small data: add one value anywhere, every level.
        let utility = |cells: &[u32], c: u32, q: f64| {
            let a = cells.iter().filter(|&&x| x < c).count() as f64;
            let b = cells.iter().filter(|&&x| x <= c).count() as f64;
            let t = q * cells.len() as f64;
            -utility_scale(q) * (a - t).max(t - b).max(0.0)
        };
        let base: Vec<u32> = vec![1, 2, 2, 4, 4, 4, 5, 7, 7, 8];
        let mut worst: f64 = 0.0;
        for q in [0.1, 1.0 / 3.0, 0.5, 0.6, 0.8, 0.95] {
            for z in 0..10u32 {
                let mut added = base.clone();
                added.push(z);
                added.sort_unstable();
                let diffs: Vec<f64> = (0..10u32)
                    .map(|c| utility(&added, c, q) - utility(&base, c, q))
                    .collect();
                let span = diffs.iter().cloned().fold(f64::MIN, f64::max)
                    - diffs.iter().cloned().fold(f64::MAX, f64::min);
                assert!(span <= 1.0 + 1e-12, "q {q}, z {z}: span {span}");
                worst = worst.max(span);
            }
        }
        // The bound is attained, so the test would catch a looser utility.
        assert!(worst > 0.99, "{worst}");
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

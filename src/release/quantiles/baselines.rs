//! The methods the served KSS release is measured against (not served by
//! `method: kss`): the seed's gradient method (served as `method:
//! gradient_descent`) and the per-level alternative (not served).

use super::atoms::AtomMass;
use super::grid::Grid;
use super::mechanism::Mechanism;
use super::utility::Target;
use crate::release::noise::add_gaussian;
use rand::Rng;

/// The per-level alternative (not served): every level's
/// exponential mechanism on all the data at `rho / m` each (`η = sqrt(8 rho /
/// m)`), then sorted (post-processing). No split, so no atom problem, but `m`
/// mechanisms per example instead of `ceil(log2(m+1))`.
pub fn per_level_quantiles<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    let grid = Grid::SERVED;
    let mech = Mechanism {
        grid,
        eta: (8.0 * rho / levels.len() as f64).sqrt(),
    };
    let cells = grid.sorted_cells(values, bound);
    let mut out: Vec<u32> = levels
        .iter()
        .map(|&q| {
            let t = Target {
                frac: q,
                offset: 0.0,
            };
            let domain = (0, grid.top());
            mech.sample(rng, &cells, domain, t, AtomMass::default()).0
        })
        .collect();
    out.sort_unstable();
    out.iter().map(|&c| grid.cell_value(c, bound)).collect()
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
    fn estimates_are_monotone_and_inside_the_domain() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
        let values: Vec<f64> = (0..5000)
            .map(|i| ((i * 7919) % 5000) as f64 / 1000.0)
            .collect();
        let levels = [0.05, 0.25, 0.5, 0.75, 0.95];
        for est in [
            super::super::kss_quantiles(&mut rng, &values, 5.0, &levels, 0.01),
            per_level_quantiles(&mut rng, &values, 5.0, &levels, 0.01),
            gradient_quantiles(&mut rng, &values, 5.0, &levels, 0.01, GRADIENT_STEPS),
        ] {
            assert!(est.windows(2).all(|w| w[0] <= w[1]), "{est:?}");
            assert!(est.iter().all(|v| (0.0..=5.0).contains(v)), "{est:?}");
        }
    }
}

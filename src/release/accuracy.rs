//! The accuracy benchmark of issue 6 (a seeded experiment, not a timing): both
//! quantile methods on `B·Beta(1.5, 6)` data, with and without a share of values
//! exactly at `B`, reported as rank errors like the seed's Table 2; and on heavily
//! tied data (issue 15, item 8), the per-example epsilons of a run with stable
//! norms. Used by the `release-accuracy` command and by `tests/release_accuracy.rs`.

use super::quantiles::{gradient_quantiles, kss_quantiles, resolution, GRADIENT_STEPS};
use rand::SeedableRng;
use rand_distr::{Beta, Binomial, Distribution};
use serde::Serialize;

/// Distance from the target rank `level·n` to the ranks `v` can have among the
/// sorted `xs`, `[#{x < v}, #{x ≤ v}]` (ties make this an interval).
pub fn rank_error(xs: &[f64], level: f64, v: f64) -> f64 {
    let target = level * xs.len() as f64;
    let below = xs.partition_point(|&x| x < v) as f64;
    let at_or_below = xs.partition_point(|&x| x <= v) as f64;
    if target < below {
        below - target
    } else if target > at_or_below {
        target - at_or_below
    } else {
        0.0
    }
}

/// The rank error of `v` up to a value resolution `h`: the least
/// [`rank_error`] of any `u` with `|u − v| ≤ h`, i.e. the distance from the
/// target to `[#{x < v − h}, #{x ≤ v + h}]`. No zCDP mechanism can output a
/// private value exactly with positive probability (docs/releases-quantiles.md),
/// so on tied data accuracy is measured at the release's public resolution.
pub fn rank_error_within(xs: &[f64], level: f64, v: f64, h: f64) -> f64 {
    let target = level * xs.len() as f64;
    let below = xs.partition_point(|&x| x < v - h) as f64;
    let at_or_below = xs.partition_point(|&x| x <= v + h) as f64;
    if target < below {
        below - target
    } else if target > at_or_below {
        target - at_or_below
    } else {
        0.0
    }
}

/// The exact `level`-quantile of the sorted `xs` (the smallest value with at
/// least `level·n` values at or below it).
pub fn exact_quantile(xs: &[f64], level: f64) -> f64 {
    let k = ((level * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[k - 1]
}

/// `n` values `bound · Beta(1.5, 6)`, the last `share_at_bound · n` set to `bound`.
pub fn beta_population(seed: u64, n: usize, bound: f64, share_at_bound: f64) -> Vec<f64> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let beta = Beta::new(1.5, 6.0).expect("valid shape");
    let at_bound = (share_at_bound * n as f64).round() as usize;
    (0..n)
        .map(|i| {
            if i >= n - at_bound {
                bound
            } else {
                bound * beta.sample(&mut rng)
            }
        })
        .collect()
}

/// Trials of the participation count in [`tied_population`].
pub const TIED_STEPS: u64 = 2500;
/// Sampling rate in [`tied_population`].
pub const TIED_RATE: f64 = 0.1;

/// `n` per-example epsilons of a run with stable norms (every gradient clipped),
/// where an example's epsilon depends only on how often it was sampled:
/// `bound · sqrt(k / TIED_STEPS)` with `k ~ Binomial(TIED_STEPS, TIED_RATE)`.
/// At `n = 50,000` this gives about 130 distinct values in runs of up to about
/// 1,400 equal ones, like the runs reported in issue 15; the values are not on
/// any grid the mechanism knows.
pub fn tied_population(seed: u64, n: usize, bound: f64) -> Vec<f64> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let binomial = Binomial::new(TIED_STEPS, TIED_RATE).expect("valid parameters");
    (0..n)
        .map(|_| bound * (binomial.sample(&mut rng) as f64 / TIED_STEPS as f64).sqrt())
        .collect()
}

/// The benchmark populations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Population {
    /// [`beta_population`] with this share of values at `B`.
    Beta {
        /// Share of values exactly at `B`.
        share_at_bound: f64,
    },
    /// [`tied_population`].
    Tied,
}

impl Population {
    /// The seeded values, in `[0, bound]`.
    pub fn values(&self, seed: u64, n: usize, bound: f64) -> Vec<f64> {
        match *self {
            Population::Beta { share_at_bound } => beta_population(seed, n, bound, share_at_bound),
            Population::Tied => tied_population(seed, n, bound),
        }
    }

    fn describe(&self) -> String {
        match *self {
            Population::Beta { share_at_bound } => {
                format!("B·Beta(1.5, 6), {:.0}% at B", share_at_bound * 100.0)
            }
            Population::Tied => {
                format!("tied: B·sqrt(k/{TIED_STEPS}), k ~ Binomial({TIED_STEPS}, {TIED_RATE})")
            }
        }
    }
}

/// One level's result, averaged over trials.
#[derive(Debug, Clone, Serialize)]
pub struct LevelAccuracy {
    /// The level.
    pub level: f64,
    /// The exact quantile.
    pub exact: f64,
    /// KSS estimate of the first trial.
    pub kss: f64,
    /// Gradient-method estimate of the first trial.
    pub gradient: f64,
    /// Mean rank error of KSS over the trials.
    pub kss_rank_error: f64,
    /// Mean rank error of the gradient method over the trials.
    pub gradient_rank_error: f64,
}

/// Both methods on one population.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyReport {
    /// Values drawn.
    pub n: usize,
    /// The population.
    pub population: Population,
    /// Distinct values among the `n`.
    pub distinct: usize,
    /// Total zCDP cost of each method's release of all the levels.
    pub rho: f64,
    /// Trials averaged.
    pub trials: usize,
    /// Value resolution `h` of the rank errors ([`rank_error_within`]), in units
    /// of `B`: 0 (exact) on continuous data, the release's public resolution on
    /// tied data.
    pub resolution: f64,
    /// Per level.
    pub levels: Vec<LevelAccuracy>,
    /// Mean rank error over levels and trials, KSS.
    pub kss_mean_rank_error: f64,
    /// Mean rank error over levels and trials, gradient method.
    pub gradient_mean_rank_error: f64,
    /// Mean exact rank error (resolution 0), KSS.
    pub kss_mean_exact_rank_error: f64,
    /// Mean exact rank error (resolution 0), gradient method.
    pub gradient_mean_exact_rank_error: f64,
}

/// The resolution at which rank errors on `population` are measured, in units of `B`.
pub fn resolution_for(population: Population) -> f64 {
    match population {
        Population::Beta { .. } => 0.0,
        Population::Tied => resolution(),
    }
}

/// Run both methods `trials` times on the seeded population.
pub fn compare_methods(
    seed: u64,
    n: usize,
    population: Population,
    levels: &[f64],
    rho: f64,
    trials: usize,
) -> AccuracyReport {
    let bound = 1.0;
    let h = resolution_for(population) * bound;
    let values = population.values(seed, n, bound);
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let mut distinct = sorted.clone();
    distinct.dedup();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x5eed);
    let m = levels.len();
    // [KSS, gradient] × [at resolution, exact], per level.
    let mut err = [[vec![0.0; m], vec![0.0; m]], [vec![0.0; m], vec![0.0; m]]];
    let mut first = [Vec::new(), Vec::new()];
    for t in 0..trials {
        let k = kss_quantiles(&mut rng, &values, bound, levels, rho);
        let g = gradient_quantiles(&mut rng, &values, bound, levels, rho, GRADIENT_STEPS);
        for (method, est) in [&k, &g].into_iter().enumerate() {
            for j in 0..m {
                err[method][0][j] +=
                    rank_error_within(&sorted, levels[j], est[j], h) / trials as f64;
                err[method][1][j] += rank_error(&sorted, levels[j], est[j]) / trials as f64;
            }
        }
        if t == 0 {
            first = [k, g];
        }
    }
    let rows: Vec<LevelAccuracy> = (0..m)
        .map(|j| LevelAccuracy {
            level: levels[j],
            exact: exact_quantile(&sorted, levels[j]),
            kss: first[0][j],
            gradient: first[1][j],
            kss_rank_error: err[0][0][j],
            gradient_rank_error: err[1][0][j],
        })
        .collect();
    let mean = |e: &Vec<f64>| e.iter().sum::<f64>() / m as f64;
    AccuracyReport {
        n,
        population,
        distinct: distinct.len(),
        rho,
        trials,
        resolution: h / bound,
        kss_mean_rank_error: mean(&err[0][0]),
        gradient_mean_rank_error: mean(&err[1][0]),
        kss_mean_exact_rank_error: mean(&err[0][1]),
        gradient_mean_exact_rank_error: mean(&err[1][1]),
        levels: rows,
    }
}

impl AccuracyReport {
    /// A plain-text table (values in units of `B`).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{}: n = {} ({} distinct), rho = {} per method, {} trials (values in units of B)\n",
            self.population.describe(),
            self.n,
            self.distinct,
            self.rho,
            self.trials
        );
        if self.resolution > 0.0 {
            s += &format!(
                "rank errors within the release's resolution h = {:e} B (see docs/releases-quantiles.md)\n",
                self.resolution
            );
        }
        s += "level   exact     KSS       gradient  | rank error KSS  gradient\n";
        for r in &self.levels {
            s += &format!(
                "{:<7} {:<9.5} {:<9.5} {:<9.5} | {:>14.1} {:>9.1}\n",
                r.level, r.exact, r.kss, r.gradient, r.kss_rank_error, r.gradient_rank_error
            );
        }
        s += &format!(
            "mean rank error: KSS {:.1}, gradient {:.1}\n",
            self.kss_mean_rank_error, self.gradient_mean_rank_error
        );
        if self.resolution > 0.0 {
            s += &format!(
                "mean exact rank error (h = 0): KSS {:.1}, gradient {:.1}\n",
                self.kss_mean_exact_rank_error, self.gradient_mean_exact_rank_error
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_error_handles_ties() {
        let xs = [1.0, 2.0, 2.0, 2.0, 3.0];
        assert_eq!(rank_error(&xs, 0.5, 2.0), 0.0);
        assert_eq!(rank_error(&xs, 0.2, 2.5), 3.0);
        assert_eq!(rank_error(&xs, 1.0, 0.5), 5.0);
        assert_eq!(exact_quantile(&xs, 0.5), 2.0);
        assert_eq!(exact_quantile(&xs, 0.9), 3.0);
    }

    #[test]
    fn rank_error_within_widens_the_rank_interval() {
        let xs = [1.0, 2.0, 2.0, 2.0, 3.0];
        assert_eq!(rank_error_within(&xs, 0.5, 2.05, 0.0), 1.5);
        assert_eq!(rank_error_within(&xs, 0.5, 2.05, 0.1), 0.0);
        assert_eq!(rank_error_within(&xs, 0.2, 2.5, 0.6), 0.0);
        assert_eq!(rank_error_within(&xs, 0.2, 2.5, 0.4), 3.0);
    }

    #[test]
    fn tied_population_has_the_runs_of_issue_15() {
        let mut xs = tied_population(2022, 50_000, 1.0);
        xs.sort_by(f64::total_cmp);
        let runs: Vec<usize> = xs.chunk_by(|a, b| a == b).map(|run| run.len()).collect();
        let longest = runs.iter().copied().max().unwrap_or(0);
        assert!((110..=150).contains(&runs.len()), "{} distinct", runs.len());
        assert!((1200..=1600).contains(&longest), "longest run {longest}");
        assert!(xs.iter().all(|x| (0.0..=1.0).contains(x)));
    }
}

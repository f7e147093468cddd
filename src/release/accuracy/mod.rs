//! The release accuracy benchmark (a seeded experiment, not a timing): both
//! quantile methods on `B·Beta(1.5, 6)` data, with and without a share of values
//! exactly at `B`, reported as rank errors like Table 2 of Yu et al. 2022 (per-instance accounting); and on heavily
//! tied data, the per-example epsilons of a run with stable
//! norms; and on training-like traces under the min rule, with 20-40% of the
//! values at the public atom `B` ([`min_rule`]), per group and for the
//! histogram's bins near `B` too ([`near_bound`]). Used by the `release-accuracy`
//! command and by `tests/release_accuracy.rs`.

pub mod min_rule;
pub mod near_bound;

pub use min_rule::{min_rule_trace, MinRuleTrace, Norms};
pub use near_bound::{compare_groups, histogram_near_bound, GroupsReport, HistogramReport};

use super::quantiles::{
    gradient_quantiles, kss_quantiles, kss_quantiles_on, per_level_quantiles, Grid, GRADIENT_STEPS,
};
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
/// 1,400 equal ones, like the tied runs of a stable-norm training run; the values are not on
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
    /// A training-like trace under the min rule ([`min_rule_trace`]).
    MinRule {
        /// Share of values exactly at `B`.
        share_at_bound: f64,
        /// How norms behave (persistent norms tie values).
        norms: Norms,
    },
}

impl Population {
    /// The seeded values, in `[0, bound]`.
    pub fn values(&self, seed: u64, n: usize, bound: f64) -> Vec<f64> {
        match *self {
            Population::Beta { share_at_bound } => beta_population(seed, n, bound, share_at_bound),
            Population::Tied => tied_population(seed, n, bound),
            Population::MinRule {
                share_at_bound,
                norms,
            } => min_rule_trace(seed, n, bound, share_at_bound, norms).values,
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
            Population::MinRule {
                share_at_bound,
                norms,
            } => format!(
                "training-like under the min rule ({}), {:.0}% at B",
                match norms {
                    Norms::Varying => "varying norms, continuous",
                    Norms::Persistent => "persistent norms, clipped examples tied",
                    Norms::Classes => "five persistent norm classes, all tied",
                },
                share_at_bound * 100.0
            ),
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
    /// Mean `|estimate − exact| / B` of KSS over the trials (it cannot be
    /// bounded inside gaps of the data, rank error can).
    pub kss_value_error: f64,
    /// Mean `|estimate − exact| / B` of the gradient method.
    pub gradient_value_error: f64,
    /// Mean rank error of the per-level alternative (not served)
    /// ([`per_level_quantiles`]: one mechanism per level at `rho/m`, sorted).
    pub per_level_rank_error: f64,
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
    /// Share of the values exactly at `B`.
    pub share_at_bound: f64,
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
    /// Largest per-level mean rank error, KSS.
    pub kss_max_rank_error: f64,
    /// Largest per-level mean rank error, gradient method.
    pub gradient_max_rank_error: f64,
    /// Cells of the former fine grid ([`ISSUE_15_GRID_CELLS`]) that KSS is
    /// also run on in the same run, for comparison with the served grid.
    pub issue_15_grid_cells: u32,
    /// Mean rank error of KSS on that grid, measured at that grid's own
    /// resolution on tied data (exact on continuous data).
    pub issue_15_grid_mean_rank_error: f64,
    /// Its largest per-level mean rank error.
    pub issue_15_grid_max_rank_error: f64,
    /// Mean rank error over levels and trials of [`per_level_quantiles`].
    pub per_level_mean_rank_error: f64,
    /// Its largest per-level mean rank error.
    pub per_level_max_rank_error: f64,
    /// KSS's rank error of each trial, averaged over the levels (the test of
    /// the grid compares these with a standard error, not a fixed margin).
    #[serde(skip)]
    pub kss_trial_means: Vec<f64>,
    /// The same on the former fine grid.
    #[serde(skip)]
    pub issue_15_grid_trial_means: Vec<f64>,
    /// Mean exact rank error (resolution 0), KSS.
    pub kss_mean_exact_rank_error: f64,
    /// Mean exact rank error (resolution 0), gradient method.
    pub gradient_mean_exact_rank_error: f64,
}

/// The grid the release served before the atoms at `B` (`2^16` cells), run
/// beside the served grid so that a change of grid is measured in one run.
pub const ISSUE_15_GRID_CELLS: u32 = 1 << 16;

/// The resolution at which rank errors on `population` are measured, in units of `B`.
pub fn resolution_for(population: Population) -> f64 {
    resolution_on(population, Grid::SERVED)
}

/// The resolution at which rank errors of releases on `grid` are measured: 0
/// (exact ranks) on continuous data, the grid's resolution on tied data.
pub fn resolution_on(population: Population, grid: Grid) -> f64 {
    match population {
        Population::Beta { .. } => 0.0,
        Population::Tied | Population::MinRule { .. } => grid.resolution(),
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
    // KSS and the gradient method share the stream they always had; the
    // per-level alternative has its own, so adding it changed no other figure.
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x5eed);
    let mut rng_per_level = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x7eed);
    let mut rng_issue_15 = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x15ed);
    let issue_15_grid = Grid::new(ISSUE_15_GRID_CELLS);
    let h_15 = resolution_on(population, issue_15_grid) * bound;
    let mut err_15 = vec![0.0; levels.len()];
    let mut trial_means = [Vec::with_capacity(trials), Vec::with_capacity(trials)];
    let m = levels.len();
    let exact: Vec<f64> = levels.iter().map(|&q| exact_quantile(&sorted, q)).collect();
    // [KSS, gradient] × [at resolution, exact, value], per level.
    let mut err = [
        [vec![0.0; m], vec![0.0; m], vec![0.0; m]],
        [vec![0.0; m], vec![0.0; m], vec![0.0; m]],
        [vec![0.0; m], vec![0.0; m], vec![0.0; m]],
    ];
    let mut first = [Vec::new(), Vec::new()];
    for t in 0..trials {
        let k = kss_quantiles(&mut rng, &values, bound, levels, rho);
        let g = gradient_quantiles(&mut rng, &values, bound, levels, rho, GRADIENT_STEPS);
        let p = per_level_quantiles(&mut rng_per_level, &values, bound, levels, rho);
        let f = kss_quantiles_on(
            issue_15_grid,
            &mut rng_issue_15,
            &values,
            bound,
            levels,
            rho,
        );
        let mut this_trial = [0.0, 0.0];
        for (j, e) in err_15.iter_mut().enumerate() {
            let e_15 = rank_error_within(&sorted, levels[j], f[j], h_15);
            *e += e_15 / trials as f64;
            this_trial[0] += rank_error_within(&sorted, levels[j], k[j], h) / levels.len() as f64;
            this_trial[1] += e_15 / levels.len() as f64;
        }
        trial_means[0].push(this_trial[0]);
        trial_means[1].push(this_trial[1]);
        for (method, est) in [&k, &g, &p].into_iter().enumerate() {
            for j in 0..m {
                err[method][0][j] +=
                    rank_error_within(&sorted, levels[j], est[j], h) / trials as f64;
                err[method][1][j] += rank_error(&sorted, levels[j], est[j]) / trials as f64;
                err[method][2][j] += (est[j] - exact[j]).abs() / bound / trials as f64;
            }
        }
        if t == 0 {
            first = [k, g];
        }
    }
    let rows: Vec<LevelAccuracy> = (0..m)
        .map(|j| LevelAccuracy {
            level: levels[j],
            exact: exact[j],
            kss: first[0][j],
            gradient: first[1][j],
            kss_rank_error: err[0][0][j],
            gradient_rank_error: err[1][0][j],
            kss_value_error: err[0][2][j],
            gradient_value_error: err[1][2][j],
            per_level_rank_error: err[2][0][j],
        })
        .collect();
    let mean = |e: &Vec<f64>| e.iter().sum::<f64>() / m as f64;
    let max = |e: &Vec<f64>| e.iter().copied().fold(0.0, f64::max);
    let at_bound = sorted.len() - sorted.partition_point(|&x| x < bound);
    AccuracyReport {
        n,
        population,
        distinct: distinct.len(),
        share_at_bound: at_bound as f64 / n as f64,
        rho,
        trials,
        resolution: h / bound,
        kss_mean_rank_error: mean(&err[0][0]),
        gradient_mean_rank_error: mean(&err[1][0]),
        kss_max_rank_error: max(&err[0][0]),
        gradient_max_rank_error: max(&err[1][0]),
        issue_15_grid_cells: ISSUE_15_GRID_CELLS,
        issue_15_grid_mean_rank_error: mean(&err_15),
        issue_15_grid_max_rank_error: max(&err_15),
        per_level_mean_rank_error: mean(&err[2][0]),
        kss_trial_means: std::mem::take(&mut trial_means[0]),
        issue_15_grid_trial_means: std::mem::take(&mut trial_means[1]),
        per_level_max_rank_error: max(&err[2][0]),
        kss_mean_exact_rank_error: mean(&err[0][1]),
        gradient_mean_exact_rank_error: mean(&err[1][1]),
        levels: rows,
    }
}

impl AccuracyReport {
    /// A plain-text table (values in units of `B`).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{}: n = {} ({} distinct, {:.1}% at B), rho = {} per method, {} trials (values in units of B)\n",
            self.population.describe(),
            self.n,
            self.distinct,
            self.share_at_bound * 100.0,
            self.rho,
            self.trials
        );
        if self.resolution > 0.0 {
            s += &format!(
                "rank errors within the release's resolution h = {:e} B (see docs/releases-quantiles.md)\n",
                self.resolution
            );
        }
        s += "level   exact     KSS       gradient  | rank error KSS  gradient | value error/B KSS  gradient\n";
        for r in &self.levels {
            s += &format!(
                "{:<7} {:<9.5} {:<9.5} {:<9.5} | {:>14.1} {:>9.1} | {:>17.2e} {:>9.2e}\n",
                r.level,
                r.exact,
                r.kss,
                r.gradient,
                r.kss_rank_error,
                r.gradient_rank_error,
                r.kss_value_error,
                r.gradient_value_error
            );
        }
        s += &format!(
            "mean rank error: KSS {:.1}, gradient {:.1}; worst level: KSS {:.1}, gradient {:.1}\n",
            self.kss_mean_rank_error,
            self.gradient_mean_rank_error,
            self.kss_max_rank_error,
            self.gradient_max_rank_error
        );
        s += &format!(
            "(alternative not served: one mechanism per level at rho/m, sorted: mean {:.1}, worst level {:.1})\n",
            self.per_level_mean_rank_error, self.per_level_max_rank_error
        );
        s += &format!(
            "(KSS on the former fine grid of {} cells, at its own resolution: mean {:.1}, worst level {:.1})\n",
            self.issue_15_grid_cells,
            self.issue_15_grid_mean_rank_error,
            self.issue_15_grid_max_rank_error
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

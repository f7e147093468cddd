//! The accuracy benchmark of issue 6 (a seeded experiment, not a timing): both
//! quantile methods on `B·Beta(1.5, 6)` data, with and without a share of values
//! exactly at `B`, reported as rank errors like the seed's Table 2. Used by the
//! `release-accuracy` command and by `tests/release_accuracy.rs`.

use super::quantiles::{gradient_quantiles, kss_quantiles, GRADIENT_STEPS};
use rand::SeedableRng;
use rand_distr::{Beta, Distribution};
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
    /// Share of values exactly at `B`.
    pub share_at_bound: f64,
    /// Total zCDP cost of each method's release of all the levels.
    pub rho: f64,
    /// Trials averaged.
    pub trials: usize,
    /// Per level.
    pub levels: Vec<LevelAccuracy>,
    /// Mean rank error over levels and trials, KSS.
    pub kss_mean_rank_error: f64,
    /// Mean rank error over levels and trials, gradient method.
    pub gradient_mean_rank_error: f64,
}

/// Run both methods `trials` times on the seeded population.
pub fn compare_methods(
    seed: u64,
    n: usize,
    share_at_bound: f64,
    levels: &[f64],
    rho: f64,
    trials: usize,
) -> AccuracyReport {
    let bound = 1.0;
    let values = beta_population(seed, n, bound, share_at_bound);
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x5eed);
    let m = levels.len();
    let (mut kss_err, mut gd_err) = (vec![0.0; m], vec![0.0; m]);
    let (mut kss_first, mut gd_first) = (Vec::new(), Vec::new());
    for t in 0..trials {
        let k = kss_quantiles(&mut rng, &values, bound, levels, rho);
        let g = gradient_quantiles(&mut rng, &values, bound, levels, rho, GRADIENT_STEPS);
        for j in 0..m {
            kss_err[j] += rank_error(&sorted, levels[j], k[j]) / trials as f64;
            gd_err[j] += rank_error(&sorted, levels[j], g[j]) / trials as f64;
        }
        if t == 0 {
            (kss_first, gd_first) = (k, g);
        }
    }
    let rows: Vec<LevelAccuracy> = (0..m)
        .map(|j| LevelAccuracy {
            level: levels[j],
            exact: exact_quantile(&sorted, levels[j]),
            kss: kss_first[j],
            gradient: gd_first[j],
            kss_rank_error: kss_err[j],
            gradient_rank_error: gd_err[j],
        })
        .collect();
    AccuracyReport {
        n,
        share_at_bound,
        rho,
        trials,
        kss_mean_rank_error: kss_err.iter().sum::<f64>() / m as f64,
        gradient_mean_rank_error: gd_err.iter().sum::<f64>() / m as f64,
        levels: rows,
    }
}

impl AccuracyReport {
    /// A plain-text table (values in units of `B`).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "n = {}, {:.0}% at B, rho = {} per method, {} trials (values in units of B)\n\
             level   exact     KSS       gradient  | rank error KSS  gradient\n",
            self.n,
            self.share_at_bound * 100.0,
            self.rho,
            self.trials
        );
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
}

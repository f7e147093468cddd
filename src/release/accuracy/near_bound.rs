//! Atoms at the bound: per-group quantile releases and the histogram's bins near
//! `B` on training-like traces under the min rule. Groups go through the
//! release's own per-group path ([`crate::release::compute`] with labels), so
//! the benchmark measures what a dashboard gets.

use super::{min_rule_trace, rank_error_within, Norms};
use crate::release::histogram::release_histogram;
use crate::release::noise::gaussian_sigma;
use crate::release::quantiles::resolution;
use crate::release::{
    compute, LabelAssignment, Labels, QuantileMethod, QuantilesRequest, ReleaseRequest,
};
use rand::SeedableRng;
use serde::Serialize;

/// One group's accuracy, averaged over trials.
#[derive(Debug, Clone, Serialize)]
pub struct GroupAccuracy {
    /// The group's label.
    pub label: String,
    /// Its examples.
    pub n: usize,
    /// Share of them exactly at `B`.
    pub share_at_bound: f64,
    /// Mean rank error per level, KSS (at the release's resolution).
    pub kss_rank_error: Vec<f64>,
    /// Mean rank error per level, gradient method.
    pub gradient_rank_error: Vec<f64>,
    /// Mean over levels, KSS.
    pub kss_mean_rank_error: f64,
    /// Largest level, KSS.
    pub kss_max_rank_error: f64,
    /// Mean over levels, gradient method.
    pub gradient_mean_rank_error: f64,
}

/// Per-group quantile releases of one min-rule trace.
#[derive(Debug, Clone, Serialize)]
pub struct GroupsReport {
    /// Examples in all groups.
    pub n: usize,
    /// Share at `B` over all groups.
    pub share_at_bound: f64,
    /// How norms behave in the trace.
    pub norms: Norms,
    /// The levels.
    pub levels: Vec<f64>,
    /// zCDP cost of each method's release (every group at that cost: disjoint).
    pub rho: f64,
    /// Trials averaged.
    pub trials: usize,
    /// Resolution of the rank errors, in units of `B`.
    pub resolution: f64,
    /// Per group.
    pub groups: Vec<GroupAccuracy>,
}

fn quantiles_request(levels: &[f64], rho: f64, method: QuantileMethod) -> ReleaseRequest {
    let mut r = ReleaseRequest {
        mean: None,
        quantiles: Some(QuantilesRequest {
            rho,
            levels: levels.to_vec(),
            method,
            steps: None,
        }),
        histogram: None,
        by_group: true,
        delta: None,
    };
    r.validate().expect("benchmark levels and rho are valid");
    r
}

/// Release the quantiles of every class of a min-rule trace (labels `class0`…),
/// by KSS and by the gradient method, `trials` times.
pub fn compare_groups(
    seed: u64,
    n: usize,
    share_at_bound: f64,
    norms: Norms,
    levels: &[f64],
    rho: f64,
    trials: usize,
) -> GroupsReport {
    let bound = 1.0;
    let h = resolution() * bound;
    let trace = min_rule_trace(seed, n, bound, share_at_bound, norms);
    let mut labels = Labels::default();
    labels
        .assign(
            n as u64,
            &LabelAssignment {
                ids: (0..n as u64).collect(),
                labels: trace
                    .classes
                    .iter()
                    .map(|c| Some(format!("class{c}")))
                    .collect(),
            },
        )
        .expect("at most 5 labels, every id in range");
    let (mut groups, _) = labels.partition(&trace.values);
    for g in &mut groups {
        g.sort_by(f64::total_cmp);
    }
    let m = levels.len();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x9709);
    let requests = [
        quantiles_request(levels, rho, QuantileMethod::Kss),
        quantiles_request(levels, rho, QuantileMethod::GradientDescent),
    ];
    // [method][group][level]
    let mut err = vec![vec![vec![0.0; m]; groups.len()]; 2];
    for _ in 0..trials {
        for (method, request) in requests.iter().enumerate() {
            let out = compute(&mut rng, request, &trace.values, bound, &labels);
            for (g, stats) in out.groups.unwrap_or_default().iter().enumerate() {
                let Some(sorted) = groups.get(g) else {
                    continue; // the (empty) unlabelled group
                };
                for (j, q) in stats.statistics.quantiles.iter().flatten().enumerate() {
                    err[method][g][j] +=
                        rank_error_within(sorted, q.level, q.value, h) / trials as f64;
                }
            }
        }
    }
    let mean = |e: &[f64]| e.iter().sum::<f64>() / m as f64;
    let at = |xs: &[f64]| xs.iter().filter(|&&x| x >= bound).count();
    GroupsReport {
        n,
        share_at_bound: at(&trace.values) as f64 / n as f64,
        norms,
        levels: levels.to_vec(),
        rho,
        trials,
        resolution: h / bound,
        groups: groups
            .iter()
            .enumerate()
            .map(|(g, xs)| GroupAccuracy {
                label: labels.names()[g].clone(),
                n: xs.len(),
                share_at_bound: at(xs) as f64 / xs.len().max(1) as f64,
                kss_mean_rank_error: mean(&err[0][g]),
                kss_max_rank_error: err[0][g].iter().copied().fold(0.0, f64::max),
                gradient_mean_rank_error: mean(&err[1][g]),
                kss_rank_error: err[0][g].clone(),
                gradient_rank_error: err[1][g].clone(),
            })
            .collect(),
    }
}

impl GroupsReport {
    /// A plain-text table.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "per-group KSS and gradient quantiles, training-like min-rule trace ({:?} norms), n = {}, \
             {:.1}% at B, rho = {} per method, {} trials, rank errors within h = {:e} B\n\
             group    n       at B   | KSS rank error per level {:?}        mean  worst | gradient mean\n",
            self.norms,
            self.n,
            self.share_at_bound * 100.0,
            self.rho,
            self.trials,
            self.resolution,
            self.levels
        );
        for g in &self.groups {
            let per: Vec<String> = g.kss_rank_error.iter().map(|e| format!("{e:.1}")).collect();
            s += &format!(
                "{:<8} {:<7} {:>5.1}% | {:<40} {:>5.1} {:>6.1} | {:>13.1}\n",
                g.label,
                g.n,
                g.share_at_bound * 100.0,
                per.join(" "),
                g.kss_mean_rank_error,
                g.kss_max_rank_error,
                g.gradient_mean_rank_error
            );
        }
        s
    }
}

/// One histogram bin's accuracy over trials.
#[derive(Debug, Clone, Serialize)]
pub struct BinAccuracy {
    /// Lower edge, in units of `B`.
    pub lo: f64,
    /// Upper edge (the last bin is closed and holds the atom at `B`).
    pub hi: f64,
    /// Exact count.
    pub exact: u64,
    /// Of which exactly at `B`.
    pub at_bound: u64,
    /// Released count of the first trial.
    pub released: f64,
    /// Mean `|released − exact|`.
    pub mean_abs_error: f64,
    /// Mean `released − exact` (rounding and clamping at 0 are the only bias).
    pub bias: f64,
}

/// The histogram's bins near `B` on a min-rule trace.
#[derive(Debug, Clone, Serialize)]
pub struct HistogramReport {
    /// Examples.
    pub n: usize,
    /// Share at `B`.
    pub share_at_bound: f64,
    /// Bins of the release.
    pub bins: usize,
    /// Its zCDP cost.
    pub rho: f64,
    /// Noise standard deviation of every count, `1/sqrt(2 rho)`.
    pub sigma: f64,
    /// Trials averaged.
    pub trials: usize,
    /// The last bins (nearest `B`), lowest first.
    pub near_bound: Vec<BinAccuracy>,
    /// Mean absolute error over those bins; Gaussian noise alone gives
    /// `σ·sqrt(2/π)`.
    pub mean_abs_error: f64,
}

/// Release a `bins`-bin histogram of a min-rule trace `trials` times and report
/// its last `near` bins.
#[allow(clippy::too_many_arguments)]
pub fn histogram_near_bound(
    seed: u64,
    n: usize,
    share_at_bound: f64,
    norms: Norms,
    bins: usize,
    near: usize,
    rho: f64,
    trials: usize,
) -> HistogramReport {
    let bound = 1.0;
    let values = min_rule_trace(seed, n, bound, share_at_bound, norms).values;
    let near = near.clamp(1, bins);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed ^ 0x4157);
    let edges: Vec<f64> = (0..=bins).map(|j| j as f64 / bins as f64).collect();
    let first = bins - near;
    let mut rows: Vec<BinAccuracy> = (first..bins)
        .map(|j| {
            let inside = |x: f64| x >= edges[j] && (x < edges[j + 1] || j == bins - 1);
            BinAccuracy {
                lo: edges[j],
                hi: edges[j + 1],
                exact: values.iter().filter(|&&x| inside(x)).count() as u64,
                at_bound: values.iter().filter(|&&x| inside(x) && x >= bound).count() as u64,
                released: 0.0,
                mean_abs_error: 0.0,
                bias: 0.0,
            }
        })
        .collect();
    for t in 0..trials {
        let h = release_histogram(&mut rng, &values, bound, bins, rho);
        for (row, &c) in rows.iter_mut().zip(&h.counts[first..]) {
            let e = c - row.exact as f64;
            row.mean_abs_error += e.abs() / trials as f64;
            row.bias += e / trials as f64;
            if t == 0 {
                row.released = c;
            }
        }
    }
    HistogramReport {
        n,
        share_at_bound: values.iter().filter(|&&x| x >= bound).count() as f64 / n as f64,
        bins,
        rho,
        sigma: gaussian_sigma(1.0, rho),
        trials,
        mean_abs_error: rows.iter().map(|r| r.mean_abs_error).sum::<f64>() / near as f64,
        near_bound: rows,
    }
}

impl HistogramReport {
    /// A plain-text table.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "histogram bins near B, training-like min-rule trace, n = {}, {:.1}% at B, {} bins, \
             rho = {} (sigma = {:.1}), {} trials\n\
             bin              exact   at B    released  mean |error|  bias\n",
            self.n,
            self.share_at_bound * 100.0,
            self.bins,
            self.rho,
            self.sigma,
            self.trials
        );
        for r in &self.near_bound {
            s += &format!(
                "[{:.3}, {:.3}{} {:<7} {:<7} {:<9} {:>12.1} {:>5.1}\n",
                r.lo,
                r.hi,
                if r.hi >= 1.0 { "]" } else { ")" },
                r.exact,
                r.at_bound,
                r.released,
                r.mean_abs_error,
                r.bias
            );
        }
        s += &format!(
            "mean |error| {:.1} (Gaussian noise alone: sigma·sqrt(2/pi) = {:.1}); the last bin \
             holds the atom at B\n",
            self.mean_abs_error,
            self.sigma * (2.0 / std::f64::consts::PI).sqrt()
        );
        s
    }
}

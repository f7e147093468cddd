//! The analysis a curator sees: per example the composed data-dependent RDP and
//! its epsilon (an estimate, `"guarantee": false`), the data-independent epsilon
//! beside it, per-checkpoint contributions relative to the data-independent
//! per-step RDP (the seed's Figure 1), and summaries over examples (Figure 2).
//! The seed-000 per-instance epsilons of each run are attached by the caller,
//! who has the ledgers ([`Analysis::attach_per_instance`]).

use super::compose::{Core, Rounding};
use super::runs::RunSet;
use super::DataDependentError;
use crate::accounting::conversion::{epsilon_from_rdp, Conversion};
use crate::accounting::sgm::sgm_rdp;
use crate::accounting::validate;
use serde::Serialize;

/// What to compute.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Rényi orders (each > 1); epsilon is minimised over them.
    pub orders: Vec<f64>,
    /// Hölder exponent `p > 1`; `None` means the authors' `3 * steps`.
    pub holder: Option<f64>,
    /// Delta of every epsilon, in (0, 1).
    pub delta: f64,
    /// RDP to (epsilon, delta) conversion.
    pub conversion: Conversion,
    /// Worker threads.
    pub threads: usize,
    /// Rounding of step orders and levels ([`Rounding::EXACT`] for the exact
    /// derivation; any other only loosens).
    pub rounding: Rounding,
}

/// The data-independent accountant on the same steps.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataIndependentEpsilon)]
pub struct DataIndependent {
    /// Its epsilon at `delta` (a proven bound).
    pub epsilon: f64,
    /// The optimal order.
    pub order: f64,
}

/// One checkpoint interval `[start_step, end_step)`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentInterval)]
pub struct Interval {
    /// First step of the interval.
    pub start_step: u64,
    /// One past its last step.
    pub end_step: u64,
    /// Quantiles over examples of the relative contribution (Figure 1).
    pub relative_contribution: Quantiles,
}

/// Quantiles of a distribution over examples (nearest rank).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentQuantiles)]
pub struct Quantiles {
    /// Smallest value.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 25th percentile.
    pub p25: f64,
    /// Median.
    pub median: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Quantiles {
    /// Quantiles of `values` (infinite values sort last; `None` when empty).
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Self {
            min: v[0],
            p10: q(0.10),
            p25: q(0.25),
            median: q(0.5),
            p75: q(0.75),
            p90: q(0.90),
            p99: q(0.99),
            max: v[v.len() - 1],
        })
    }
}

/// The distribution over examples (the seed's Figure 2).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentSummary)]
pub struct Summary {
    /// Data-dependent epsilons.
    pub epsilon: Quantiles,
    /// Data-dependent epsilon divided by the data-independent one.
    pub ratio_to_data_independent: Quantiles,
    /// Examples whose data-dependent epsilon is below the data-independent one.
    pub below_data_independent: usize,
}

/// One example's result. Owners may read their own; viewers nothing of it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentExample)]
pub struct ExampleResult {
    /// The example.
    pub id: u64,
    /// Composed data-dependent RDP at `order`.
    pub rdp: f64,
    /// Its epsilon at the analysis' delta (minimised over the orders).
    pub epsilon: f64,
    /// The optimal order.
    pub order: f64,
    /// Always `false`: the expectation is estimated from finitely many runs.
    pub guarantee: bool,
    /// The data-independent epsilon (the same for every example).
    pub data_independent_epsilon: f64,
    /// Seed-000 per-instance epsilon of this example in each run, if attached.
    pub per_instance_epsilon: Option<Vec<f64>>,
    /// Per interval: contribution at `order` divided by the data-independent RDP
    /// of the same steps at `order` (`null` where that is 0).
    pub relative_contributions: Vec<Option<f64>>,
}

/// A whole analysis; serialises to the JSON of the CLI and (later) HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentAnalysis)]
pub struct Analysis {
    /// Always `false`.
    pub guarantee: bool,
    /// Runs the expectation used.
    pub runs: usize,
    /// Steps per run.
    pub steps: usize,
    /// Hölder exponent used.
    pub holder: f64,
    /// Delta of every epsilon.
    pub delta: f64,
    /// Orders.
    pub orders: Vec<f64>,
    /// The conversion used (`improved` or `classic`).
    #[schema(value_type = String)]
    pub conversion: Conversion,
    /// Step orders were rounded up to the grid `order_ratio^k` (`1`: exact).
    pub order_ratio: f64,
    /// Levels were rounded up to multiples of this (`1`: the ledger's grid).
    pub level_stride: u32,
    /// The runs, in order: dataset ids (HTTP) or trace paths (CLI).
    pub datasets: Vec<String>,
    /// The data-independent accountant.
    pub data_independent: DataIndependent,
    /// Checkpoint intervals.
    pub intervals: Vec<Interval>,
    /// Distribution over examples.
    pub summary: Option<Summary>,
    /// Every example, by id.
    pub examples: Vec<ExampleResult>,
    /// Composed RDP curves, `rdp_curves[e * orders.len() + o]` (not serialised).
    #[serde(skip)]
    pub rdp_curves: Vec<f64>,
}

/// Check the options against the runs, and resolve the default Hölder exponent.
fn checked(runs: &RunSet, options: &Options) -> Result<(Vec<f64>, f64), DataDependentError> {
    let bad =
        |e: crate::accounting::InvalidArgument| DataDependentError::InvalidArgument(e.to_string());
    if runs.runs() < 2 {
        return Err(DataDependentError::TooFewRuns(runs.runs()));
    }
    let orders = validate::orders("alpha", &options.orders).map_err(bad)?;
    if orders.iter().any(|a| a.is_infinite()) {
        return Err(DataDependentError::InvalidArgument(
            "alpha: orders must be finite".into(),
        ));
    }
    validate::delta("delta", options.delta).map_err(bad)?;
    let steps = runs.steps().len();
    if steps == 0 {
        return Err(DataDependentError::InvalidArgument(
            "the runs have no steps".into(),
        ));
    }
    let holder = options.holder.unwrap_or(3.0 * steps as f64);
    if !(holder.is_finite() && holder > 1.0) {
        return Err(DataDependentError::InvalidArgument(format!(
            "holder: must be finite and > 1, got {holder}"
        )));
    }
    Ok((orders, holder))
}

/// Run the analysis: refuses fewer than 2 runs, orders not in `(1, inf)`, delta
/// outside `(0, 1)`, a Hölder exponent that is not `> 1`, and runs without steps.
pub fn analyze(runs: &RunSet, options: &Options) -> Result<Analysis, DataDependentError> {
    let (orders, holder) = checked(runs, options)?;
    let threads = options.threads.max(1);
    options
        .rounding
        .check()
        .map_err(DataDependentError::InvalidArgument)?;
    let core = Core::new(runs, &orders, holder, options.rounding, threads);
    let comp = core.compose(threads);
    let steps = runs.steps();
    let di_rdp: Vec<f64> = orders
        .iter()
        .map(|&a| {
            steps
                .iter()
                .map(|s| sgm_rdp(s.sampling_rate, s.noise_multiplier, a))
                .sum()
        })
        .collect();
    let di = epsilon_from_rdp(&orders, &di_rdp, options.delta, options.conversion);
    let per_example: Vec<_> = (0..runs.examples())
        .map(|e| {
            let curve = comp.example(e);
            let eps = epsilon_from_rdp(&orders, curve, options.delta, options.conversion);
            let o = orders.iter().position(|&a| a == eps.order).unwrap_or(0);
            (eps, curve[o])
        })
        .collect();
    let order_of: Vec<f64> = per_example.iter().map(|(e, _)| e.order).collect();
    let order_index: Vec<usize> = order_of
        .iter()
        .map(|a| orders.iter().position(|b| b == a).unwrap_or(0))
        .collect();
    let contributions = core.contributions(&order_index, threads);
    let bounds = &comp.boundaries;
    let n_int = bounds.len().saturating_sub(1);
    // Data-independent RDP of each interval at each order some example uses.
    let mut di_interval: Vec<(f64, Vec<f64>)> = Vec::new();
    for &a in &order_of {
        if !di_interval.iter().any(|(b, _)| *b == a) {
            let per = bounds
                .windows(2)
                .map(|w| {
                    (w[0]..w[1])
                        .map(|t| {
                            let s = steps[t as usize];
                            sgm_rdp(s.sampling_rate, s.noise_multiplier, a)
                        })
                        .sum()
                })
                .collect();
            di_interval.push((a, per));
        }
    }
    let examples: Vec<ExampleResult> = per_example
        .iter()
        .enumerate()
        .map(|(e, (eps, rdp))| {
            let di_i = &di_interval
                .iter()
                .find(|(a, _)| *a == eps.order)
                .expect("computed")
                .1;
            let relative_contributions = (0..n_int)
                .map(|i| {
                    let c = contributions[e * n_int + i];
                    (di_i[i] > 0.0).then(|| c / di_i[i])
                })
                .collect();
            ExampleResult {
                id: e as u64,
                rdp: *rdp,
                epsilon: eps.epsilon,
                order: eps.order,
                guarantee: false,
                data_independent_epsilon: di.epsilon,
                per_instance_epsilon: None,
                relative_contributions,
            }
        })
        .collect();
    let intervals = bounds
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            let rel: Vec<f64> = examples
                .iter()
                .filter_map(|x| x.relative_contributions[i])
                .collect();
            Interval {
                start_step: w[0],
                end_step: w[1],
                relative_contribution: Quantiles::of(&rel)
                    .unwrap_or(Quantiles::of(&[0.0]).expect("one")),
            }
        })
        .collect();
    let eps: Vec<f64> = examples.iter().map(|x| x.epsilon).collect();
    let ratio: Vec<f64> = eps.iter().map(|e| e / di.epsilon).collect();
    let summary = Quantiles::of(&eps)
        .zip(Quantiles::of(&ratio))
        .map(|(e, r)| Summary {
            epsilon: e,
            ratio_to_data_independent: r,
            below_data_independent: eps.iter().filter(|&&x| x < di.epsilon).count(),
        });
    Ok(Analysis {
        guarantee: false,
        runs: runs.runs(),
        steps: steps.len(),
        holder,
        delta: options.delta,
        orders,
        conversion: options.conversion,
        order_ratio: options.rounding.order_ratio,
        level_stride: options.rounding.level_stride.max(1),
        datasets: Vec::new(),
        data_independent: DataIndependent {
            epsilon: di.epsilon,
            order: di.order,
        },
        intervals,
        summary,
        examples,
        rdp_curves: comp.rdp,
    })
}

impl Analysis {
    /// Attach each run's seed-000 per-instance epsilons (`per_run[r][id]`, e.g.
    /// from `dpledger replay` of the same traces) to every example.
    pub fn attach_per_instance(&mut self, per_run: &[Vec<f64>]) {
        for x in &mut self.examples {
            let id = x.id as usize;
            x.per_instance_epsilon =
                Some(per_run.iter().filter_map(|r| r.get(id).copied()).collect());
        }
    }

    /// Only example `id`'s result (what its owner may read).
    pub fn example(&self, id: u64) -> Option<&ExampleResult> {
        self.examples.get(id as usize).filter(|x| x.id == id)
    }
}

/// One example's result with the context needed to read it: what its owner may
/// read (no distribution over other examples).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = DataDependentExampleView)]
pub struct ExampleView {
    /// Always `false`: an estimate from finitely many runs.
    pub guarantee: bool,
    /// The runs, in order.
    pub datasets: Vec<String>,
    /// Runs the expectation used.
    pub runs: usize,
    /// Steps per run.
    pub steps: usize,
    /// Hölder exponent used.
    pub holder: f64,
    /// Delta of every epsilon.
    pub delta: f64,
    /// The conversion used (`improved` or `classic`).
    #[schema(value_type = String)]
    pub conversion: Conversion,
    /// Step orders were rounded up to the grid `order_ratio^k` (`1`: exact).
    pub order_ratio: f64,
    /// Levels were rounded up to multiples of this (`1`: the ledger's grid).
    pub level_stride: u32,
    /// The data-independent accountant (public).
    pub data_independent: DataIndependent,
    /// Interval `i` of `relative_contributions` is steps
    /// `[boundaries[i], boundaries[i+1])`.
    pub boundaries: Vec<u64>,
    /// The example's result.
    pub example: ExampleResult,
}

impl Analysis {
    /// Example `id`'s view (its owner's), if the analysis has it.
    pub fn example_view(&self, id: u64) -> Option<ExampleView> {
        let example = self.examples.iter().find(|x| x.id == id)?.clone();
        let mut boundaries: Vec<u64> = self.intervals.iter().map(|i| i.start_step).collect();
        boundaries.extend(self.intervals.last().map(|i| i.end_step));
        Some(ExampleView {
            guarantee: false,
            datasets: self.datasets.clone(),
            runs: self.runs,
            steps: self.steps,
            holder: self.holder,
            delta: self.delta,
            conversion: self.conversion,
            order_ratio: self.order_ratio,
            level_stride: self.level_stride,
            data_independent: self.data_independent.clone(),
            boundaries,
            example,
        })
    }
}

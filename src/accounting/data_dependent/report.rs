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

/// The analysis' report, defined once with the Rust client in the workspace
/// crate `dpledger-api` (with its pure reading: quantiles, one example's view).
pub use dpledger_api::analysis::{
    Analysis, DataIndependent, ExampleResult, ExampleView, Interval, Quantiles, Summary,
};

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

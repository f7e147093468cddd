//! The report of Thudi et al.'s data-dependent analysis over several runs
//! (`GET /v1/analyses/data-dependent`, `dpledger data-dependent`): an
//! estimate (`guarantee: false`), shown next to the data-independent
//! accountant. The server computes it, the Rust client reads it; the OpenAPI
//! document names these types `DataDependent*`.

use crate::config::Conversion;
use serde::{Deserialize, Serialize};

/// The data-independent accountant on the same steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataIndependentEpsilon))]
pub struct DataIndependent {
    /// Its epsilon at `delta` (a proven bound).
    pub epsilon: f64,
    /// The optimal order.
    pub order: f64,
}

/// One checkpoint interval `[start_step, end_step)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentInterval))]
pub struct Interval {
    /// First step of the interval.
    pub start_step: u64,
    /// One past its last step.
    pub end_step: u64,
    /// Quantiles over examples of the relative contribution (Figure 1).
    pub relative_contribution: Quantiles,
}

/// Quantiles of a distribution over examples (nearest rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentQuantiles))]
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

/// The distribution over examples (the seed's Figure 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentSummary))]
pub struct Summary {
    /// Data-dependent epsilons.
    pub epsilon: Quantiles,
    /// Data-dependent epsilon divided by the data-independent one.
    pub ratio_to_data_independent: Quantiles,
    /// Examples whose data-dependent epsilon is below the data-independent one.
    pub below_data_independent: usize,
}

/// One example's result. Owners may read their own; viewers nothing of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentExample))]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentAnalysis))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
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

/// One example's result with the context needed to read it: what its owner may
/// read (no distribution over other examples).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DataDependentExampleView))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
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

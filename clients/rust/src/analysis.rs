//! Types of Thudi et al.'s data-dependent analysis over several runs
//! (`GET /v1/analyses/data-dependent`): an estimate (`guarantee: false`), shown
//! next to the data-independent and seed-000 per-instance epsilons.

use crate::types::Conversion;
use serde::Deserialize;

/// Parameters of an analysis; `runs` is required (at least 2 dataset ids).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AnalysisQuery {
    /// Dataset ids of the runs (runs of one configuration with refreshes).
    pub runs: Vec<String>,
    /// Rényi orders (default: the 64 ledger orders).
    pub alpha: Option<Vec<f64>>,
    /// Hölder exponent `p > 1` (default `3 × steps`).
    pub holder: Option<f64>,
    /// Delta (default: the runs' reporting delta when they agree).
    pub delta: Option<f64>,
    /// The conversion (default improved).
    pub conversion: Option<Conversion>,
    /// Round step orders up to `order_ratio^k` (server default 1.01; 1 is exact
    /// with `level_stride` 1). Rounding only loosens.
    pub order_ratio: Option<f64>,
    /// Round sensitivity levels up to multiples of this (default 1).
    pub level_stride: Option<u32>,
}

impl AnalysisQuery {
    /// The runs, with every other parameter at the server's default.
    pub fn runs<S: Into<String>>(runs: impl IntoIterator<Item = S>) -> Self {
        Self {
            runs: runs.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// The exact evaluation (no rounding of orders or levels).
    pub fn exact(mut self) -> Self {
        self.order_ratio = Some(1.0);
        self.level_stride = Some(1);
        self
    }

    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let join = |v: &[f64]| {
            v.iter()
                .map(|a| format!("{a:e}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = vec![("runs", self.runs.join(","))];
        if let Some(a) = &self.alpha {
            out.push(("alpha", join(a)));
        }
        if let Some(p) = self.holder {
            out.push(("holder", format!("{p:e}")));
        }
        if let Some(d) = self.delta {
            out.push(("delta", format!("{d:e}")));
        }
        if let Some(c) = self.conversion {
            out.push(("conversion", c.as_str().to_string()));
        }
        if let Some(r) = self.order_ratio {
            out.push(("order_ratio", format!("{r:e}")));
        }
        if let Some(s) = self.level_stride {
            out.push(("level_stride", s.to_string()));
        }
        out
    }
}

/// The data-independent accountant on the same steps (a proven bound).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataIndependentEpsilon {
    /// Its epsilon.
    pub epsilon: f64,
    /// The optimal order.
    pub order: f64,
}

/// Quantiles over examples (nearest rank).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentQuantiles {
    /// Smallest.
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
    /// Largest.
    pub max: f64,
}

/// One checkpoint interval (the seed's Figure 1).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentInterval {
    /// First step.
    pub start_step: u64,
    /// One past the last step.
    pub end_step: u64,
    /// Contribution relative to the data-independent RDP, over examples.
    pub relative_contribution: DataDependentQuantiles,
}

/// The distribution over examples (the seed's Figure 2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentSummary {
    /// Data-dependent epsilons.
    pub epsilon: DataDependentQuantiles,
    /// Divided by the data-independent epsilon.
    pub ratio_to_data_independent: DataDependentQuantiles,
    /// Examples below the data-independent epsilon.
    pub below_data_independent: usize,
}

/// One example's estimate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentExample {
    /// The example.
    pub id: u64,
    /// Composed data-dependent RDP at `order`.
    pub rdp: f64,
    /// Its epsilon (an estimate).
    pub epsilon: f64,
    /// The optimal order.
    pub order: f64,
    /// Always false.
    pub guarantee: bool,
    /// The data-independent epsilon.
    pub data_independent_epsilon: f64,
    /// Seed-000 per-instance epsilon in each run.
    #[serde(default)]
    pub per_instance_epsilon: Option<Vec<f64>>,
    /// Per interval, relative to the data-independent RDP (`None` where it is 0).
    pub relative_contributions: Vec<Option<f64>>,
}

/// The whole analysis (curators and admins of every run).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentAnalysis {
    /// Always false: an estimate from finitely many runs.
    pub guarantee: bool,
    /// Runs the expectation used.
    pub runs: usize,
    /// Steps per run.
    pub steps: usize,
    /// Hölder exponent.
    pub holder: f64,
    /// Delta.
    pub delta: f64,
    /// Orders.
    pub orders: Vec<f64>,
    /// The conversion.
    pub conversion: Conversion,
    /// Order rounding ratio (1: exact).
    pub order_ratio: f64,
    /// Level stride (1: the ledger's grid).
    pub level_stride: u32,
    /// The runs' dataset ids.
    pub datasets: Vec<String>,
    /// The data-independent accountant.
    pub data_independent: DataIndependentEpsilon,
    /// Checkpoint intervals.
    pub intervals: Vec<DataDependentInterval>,
    /// Distribution over examples.
    #[serde(default)]
    pub summary: Option<DataDependentSummary>,
    /// Every example, by id.
    pub examples: Vec<DataDependentExample>,
}

/// One example's result with its context (what its owner reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DataDependentExampleView {
    /// Always false.
    pub guarantee: bool,
    /// The runs' dataset ids.
    pub datasets: Vec<String>,
    /// Runs the expectation used.
    pub runs: usize,
    /// Steps per run.
    pub steps: usize,
    /// Hölder exponent.
    pub holder: f64,
    /// Delta.
    pub delta: f64,
    /// The conversion.
    pub conversion: Conversion,
    /// Order rounding ratio.
    pub order_ratio: f64,
    /// Level stride.
    pub level_stride: u32,
    /// The data-independent accountant.
    pub data_independent: DataIndependentEpsilon,
    /// Interval `i` is steps `[boundaries[i], boundaries[i+1])`.
    pub boundaries: Vec<u64>,
    /// The example.
    pub example: DataDependentExample,
}

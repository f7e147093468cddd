//! Types of Thudi et al.'s data-dependent analysis over several runs
//! (`GET /v1/analyses/data-dependent`): an estimate (`guarantee: false`), shown
//! next to the data-independent and seed-000 per-instance epsilons.

use crate::types::Conversion;

/// The analysis' report, defined once with the server in the workspace crate
/// `dpledger-api`, under the names of the OpenAPI document (its numbers are
/// plain `f64`, read as before).
pub use dpledger_api::analysis::{
    Analysis as DataDependentAnalysis, DataIndependent as DataIndependentEpsilon,
    ExampleResult as DataDependentExample, ExampleView as DataDependentExampleView,
    Interval as DataDependentInterval, Quantiles as DataDependentQuantiles,
    Summary as DataDependentSummary,
};

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

//! The report of Thudi et al.'s data-dependent analysis over several runs
//! (`GET /v1/analyses/data-dependent`, `dpledger data-dependent`): an
//! estimate (`guarantee: false`), shown next to the data-independent
//! accountant. The server computes it, the Rust client reads it; the OpenAPI
//! document names these types `DataDependent*`.

use crate::config::Conversion;
use serde::{Deserialize, Deserializer, Serialize};

/// Which runs to analyse, and how: the query string of
/// `GET /v1/analyses/data-dependent` (lists comma-separated), read by the
/// server and written by the Rust client ([`AnalysisQuery::pairs`]).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct AnalysisQuery {
    /// Comma-separated dataset ids of the runs (at least 2, distinct), runs of one
    /// configuration whose trainers sent full-batch refreshes at checkpoints.
    #[serde(deserialize_with = "comma_separated")]
    #[cfg_attr(feature = "openapi", param(value_type = String))]
    pub runs: Vec<String>,
    /// Comma-separated Rényi orders (default: the 64 ledger orders).
    #[serde(default, deserialize_with = "comma_separated_numbers")]
    #[cfg_attr(feature = "openapi", param(value_type = Option<String>))]
    pub alpha: Option<Vec<f64>>,
    /// Hölder exponent `p > 1` (default `3 × steps`, as Thudi et al.).
    pub holder: Option<f64>,
    /// Delta in (0, 1) (default: the runs' reporting delta when they agree).
    pub delta: Option<f64>,
    /// `improved` (default) or `classic`.
    #[cfg_attr(feature = "openapi", param(value_type = Option<String>))]
    pub conversion: Option<Conversion>,
    /// Round step orders up to the grid `order_ratio^k` (default 1.01; `1` with
    /// `level_stride=1` is the exact evaluation). Rounding only loosens.
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

    /// The query string's pairs, as the server reads them back (numbers in
    /// exponent notation, so that none loses a digit).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
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

impl AnalysisQuery {
    /// The run ids a `runs` parameter names: its comma-separated items,
    /// trimmed, empty ones left out. The server reads them before it
    /// validates the rest of the query, to authorise the caller first.
    pub fn run_ids(text: &str) -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
}

fn comma_separated<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(AnalysisQuery::run_ids(&String::deserialize(d)?))
}

fn comma_separated_numbers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    text.split(',')
        .map(|s| {
            s.trim().parse::<f64>().map_err(|e| {
                serde::de::Error::custom(format!("expected comma-separated numbers ({e})"))
            })
        })
        .collect::<Result<Vec<f64>, _>>()
        .map(Some)
}

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

#[cfg(test)]
mod query_tests {
    use super::*;

    fn read(query: &str) -> Result<AnalysisQuery, serde_urlencoded::de::Error> {
        serde_urlencoded::from_str(query)
    }

    /// What the client writes, the server reads back exactly.
    #[test]
    fn a_query_reads_back_as_it_was_written() {
        let query = AnalysisQuery {
            alpha: Some(vec![1.5, 2.0, 64.0]),
            holder: Some(3.0),
            delta: Some(1e-5),
            conversion: Some(Conversion::Classic),
            ..AnalysisQuery::runs(["r1", "r2"]).exact()
        };
        let text = serde_urlencoded::to_string(query.pairs()).unwrap();
        assert_eq!(read(&text).unwrap(), query);
        let plain = AnalysisQuery::runs(["a", "b", "c"]);
        let text = serde_urlencoded::to_string(plain.pairs()).unwrap();
        assert_eq!(read(&text).unwrap(), plain);
    }

    #[test]
    fn lists_are_trimmed_and_bad_parameters_refused() {
        let q = read("runs=r1,%20r2,&alpha=2,%203").unwrap();
        assert_eq!(q.runs, vec!["r1", "r2"]);
        assert_eq!(q.alpha, Some(vec![2.0, 3.0]));
        assert!(read("runs=r1,r2&alpha=two").is_err());
        // Every order is a number: an empty item is not left out.
        assert!(read("runs=r1,r2&alpha=2,,3").is_err());
        assert!(read("runs=r1,r2&alpha=").is_err());
        assert!(read("runs=r1,r2&conversion=best").is_err());
        assert!(read("runs=r1,r2&colour=red").is_err());
        assert!(read("delta=1e-5").is_err());
    }
}

//! Request and response bodies of the DP-release endpoints (tag `releases` of
//! `openapi/openapi.json`): releases of aggregate statistics of the per-example
//! epsilons, the release budget, group labels and the automatic release policy.
//!
//! A release's zCDP cost `rho` is charged to every example and to the worst case,
//! as RDP `alpha * rho` at every Rényi order, and is checked against the dataset's
//! release budget before any data is touched.

use serde::{Deserialize, Serialize};

/// The DP mean (and count) of the per-example epsilons.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanRequest {
    /// zCDP cost of this statistic (split evenly between the sum and the count).
    pub rho: f64,
}

/// How quantiles are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantileMethod {
    /// Kaplan–Schnapp–Stemmer recursion over the exponential mechanism (the
    /// server's default).
    #[default]
    Kss,
    /// Full-batch gradient descent on the quantile loss with Gaussian counts
    /// (Andrew et al. 2021), for comparison.
    GradientDescent,
}

/// DP quantiles of the per-example epsilons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantilesRequest {
    /// zCDP cost of all the levels together.
    pub rho: f64,
    /// Levels in (0, 1), distinct, 1 to 99 of them; the server sorts them.
    pub levels: Vec<f64>,
    /// Estimation method (default [`QuantileMethod::Kss`]).
    #[serde(default)]
    pub method: QuantileMethod,
    /// Gradient steps of [`QuantileMethod::GradientDescent`] (1-1000, server
    /// default 20); must be absent for [`QuantileMethod::Kss`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
}

/// A DP histogram of the per-example epsilons over equal bins of `[0, B]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistogramRequest {
    /// zCDP cost of the histogram.
    pub rho: f64,
    /// Number of bins (1-1000).
    pub bins: usize,
}

/// What a release asks for: any of mean, quantiles and histogram, of the whole
/// population or (with `by_group`) of every label group. Its cost is the sum of the
/// statistics' `rho`; per-group statistics cost the same as population ones (the
/// groups are disjoint). At least one statistic must be asked for.
///
/// ```
/// use dpledger_client::ReleaseRequest;
/// let r = ReleaseRequest::default()
///     .mean(0.001)
///     .quantiles(0.001, vec![0.1, 0.5, 0.9])
///     .histogram(0.001, 10);
/// assert!((r.rho() - 0.003).abs() < 1e-15);
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// Release the mean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<MeanRequest>,
    /// Release quantiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantiles: Option<QuantilesRequest>,
    /// Release a histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<HistogramRequest>,
    /// Release the statistics of every label group instead of the population
    /// (needs labels: [`crate::Client::set_labels`]).
    #[serde(default)]
    pub by_group: bool,
    /// Delta at which per-example epsilons (and the bound `B`) are computed;
    /// default: the dataset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
}

impl ReleaseRequest {
    /// Also release the mean, at zCDP cost `rho`.
    pub fn mean(mut self, rho: f64) -> Self {
        self.mean = Some(MeanRequest { rho });
        self
    }

    /// Also release the quantiles at `levels` (KSS method), at zCDP cost `rho` for
    /// all of them together.
    pub fn quantiles(mut self, rho: f64, levels: Vec<f64>) -> Self {
        self.quantiles = Some(QuantilesRequest {
            rho,
            levels,
            method: QuantileMethod::Kss,
            steps: None,
        });
        self
    }

    /// Also release a histogram of `bins` equal bins, at zCDP cost `rho`.
    pub fn histogram(mut self, rho: f64, bins: usize) -> Self {
        self.histogram = Some(HistogramRequest { rho, bins });
        self
    }

    /// Release per label group instead of for the whole population.
    pub fn by_group(mut self) -> Self {
        self.by_group = true;
        self
    }

    /// Compute epsilons (and the bound) at `delta` instead of the dataset's.
    pub fn at_delta(mut self, delta: f64) -> Self {
        self.delta = Some(delta);
        self
    }

    /// The release's total zCDP cost: the sum of its statistics' `rho`, as the
    /// server charges it.
    pub fn rho(&self) -> f64 {
        self.mean.as_ref().map_or(0.0, |m| m.rho)
            + self.quantiles.as_ref().map_or(0.0, |q| q.rho)
            + self.histogram.as_ref().map_or(0.0, |h| h.rho)
    }
}

/// A released mean and the noisy count it was divided by.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct MeanValue {
    /// The DP mean, clamped to `[0, B]`.
    pub mean: f64,
    /// The DP count of examples (Gaussian noise, rounded, at least 0).
    pub count: f64,
}

/// One released quantile.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct QuantileValue {
    /// The level in (0, 1).
    pub level: f64,
    /// The DP estimate of the level's quantile, in `[0, B]`.
    pub value: f64,
}

/// Released histogram counts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HistogramValue {
    /// `bins + 1` bin edges from 0 to `B`; bin `j` is `[edges[j], edges[j+1])`,
    /// the last one closed.
    pub edges: Vec<f64>,
    /// Noisy counts, rounded and clamped at 0.
    pub counts: Vec<f64>,
}

/// The statistics released for one population (everyone, or one group); each is
/// present when the request asked for it.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Statistics {
    /// The DP mean and count.
    #[serde(default)]
    pub mean: Option<MeanValue>,
    /// The DP quantiles, by increasing level.
    #[serde(default)]
    pub quantiles: Option<Vec<QuantileValue>>,
    /// The DP histogram.
    #[serde(default)]
    pub histogram: Option<HistogramValue>,
}

/// The statistics of one label group.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GroupStatistics {
    /// The label; `None` for the examples without one.
    #[serde(default)]
    pub label: Option<String>,
    /// Its statistics (inline in the JSON object, beside `label`).
    #[serde(flatten)]
    pub statistics: Statistics,
}

/// What a release published: the population's statistics, or every group's.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ReleaseValues {
    /// Statistics of all examples (when `by_group` was false).
    #[serde(default)]
    pub population: Option<Statistics>,
    /// Statistics of every group, labels in order of first use, then the
    /// unlabelled examples (when `by_group` was true).
    #[serde(default)]
    pub groups: Option<Vec<GroupStatistics>>,
}

impl ReleaseValues {
    /// The statistics of the group labelled `label` (`None`: the unlabelled
    /// examples), when the release was per group.
    pub fn group(&self, label: Option<&str>) -> Option<&Statistics> {
        self.groups
            .as_ref()?
            .iter()
            .find(|g| g.label.as_deref() == label)
            .map(|g| &g.statistics)
    }
}

/// Who asked for a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseTrigger {
    /// A curator's request.
    Request,
    /// The dataset's release policy, after a step.
    Policy,
}

/// A release as recorded durably and served to viewers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Release {
    /// 1, 2, ... within the dataset.
    pub id: u64,
    /// Steps applied when it was released (the ledger's next step).
    pub step: u64,
    /// When it was released (seconds since the Unix epoch).
    pub released_at: u64,
    /// A curator's request or the policy.
    pub trigger: ReleaseTrigger,
    /// What was asked for (quantile levels sorted).
    pub request: ReleaseRequest,
    /// Delta at which epsilons were computed.
    pub delta: f64,
    /// The bound `B`: the worst-case epsilon at `delta` before this release.
    pub bound: f64,
    /// zCDP cost charged to every example and to the worst case.
    pub rho: f64,
    /// The released statistics.
    pub values: ReleaseValues,
}

/// A release budget's state.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct BudgetStatus {
    /// Total zCDP `rho` releases may spend; `None` until a curator sets one (no
    /// release is possible before).
    #[serde(default)]
    pub rho_budget: Option<f64>,
    /// zCDP `rho` spent by the releases so far.
    pub rho_spent: f64,
    /// Releases so far.
    pub releases: u64,
}

impl BudgetStatus {
    /// The `rho` still to spend (`None` when no budget is set).
    pub fn rho_left(&self) -> Option<f64> {
        self.rho_budget.map(|b| (b - self.rho_spent).max(0.0))
    }
}

/// The answer to an accepted release.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReleaseOutcome {
    /// The release as stored and served to viewers.
    pub release: Release,
    /// The budget after it.
    pub budget: BudgetStatus,
}

/// A release budget as asked for: a zCDP `rho`, or an `(epsilon, delta)` target
/// that the server converts (exactly, rounded down) to the largest `rho` whose
/// releases together stay `(epsilon, delta)`-DP.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BudgetRequest {
    /// `{"rho": ...}`: total zCDP cost allowed (finite, `>= 0`).
    Rho {
        /// The budget.
        rho: f64,
    },
    /// `{"epsilon": ..., "delta": ...}`.
    Epsilon {
        /// The releases together must be `(epsilon, delta)`-DP ...
        epsilon: f64,
        /// ... at this delta.
        delta: f64,
    },
}

impl BudgetRequest {
    /// A budget of `rho` (zCDP).
    pub fn rho(rho: f64) -> Self {
        BudgetRequest::Rho { rho }
    }

    /// A budget that keeps the releases together `(epsilon, delta)`-DP.
    pub fn epsilon(epsilon: f64, delta: f64) -> Self {
        BudgetRequest::Epsilon { epsilon, delta }
    }
}

/// Releases every `every_steps` steps, automatically, after the step that makes the
/// number of applied steps a multiple of it. A refused automatic release (budget
/// spent, say) never fails the step; its reason is kept in `policy_error`. Steps
/// never wait for a release: one due while the previous is still computed is
/// deferred (and then describes a later step), and later ones coalesce into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleasePolicy {
    /// The period in steps (at least 1).
    pub every_steps: u64,
    /// What to release each time.
    pub request: ReleaseRequest,
}

/// Body of `PUT /v1/datasets/{d}/release-policy`: `null` removes the policy, so
/// it is always written.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PolicyUpdate<'a> {
    pub policy: Option<&'a ReleasePolicy>,
}

/// The policy in force.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PolicyView {
    /// The policy; `None` when none.
    #[serde(default)]
    pub policy: Option<ReleasePolicy>,
    /// Why its latest release was refused, if it was.
    #[serde(default)]
    pub policy_error: Option<String>,
}

/// Releases of a dataset, newest first, with the budget and the policy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReleaseList {
    /// The release budget and its spend.
    pub budget: BudgetStatus,
    /// The automatic policy, if any.
    #[serde(default)]
    pub policy: Option<ReleasePolicy>,
    /// Why the policy's latest release was refused, if it was.
    #[serde(default)]
    pub policy_error: Option<String>,
    /// Newest first.
    pub releases: Vec<Release>,
}

/// Body of `PUT /v1/datasets/{d}/labels`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LabelAssignment<'a> {
    pub ids: &'a [u64],
    pub labels: &'a [Option<String>],
}

/// The dataset's groups after a label assignment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LabelsView {
    /// Every label in use or used before, in order of first use.
    pub groups: Vec<String>,
}

/// The release settings that may be given when a dataset is created (see
/// [`crate::Client::create_dataset_with`]); `Default` gives none.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct DatasetSetup {
    /// Budget for releases (default none: no release is possible until a curator
    /// sets one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_budget: Option<BudgetRequest>,
    /// Group labels of examples `0, 1, ...` (`None`: unlabelled), for per-group
    /// releases; at most one per example.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<Option<String>>>,
    /// Release automatically every N steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_policy: Option<ReleasePolicy>,
}

/// A refused release's budget state: the `budget` extension of the problem
/// document of a 409 (see [`crate::Error::budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct BudgetRefusal {
    /// zCDP `rho` already spent.
    pub rho_spent: f64,
    /// zCDP `rho` the refused release would have cost.
    pub rho_requested: f64,
    /// The budget; `None` when none is set.
    #[serde(default)]
    pub rho_budget: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_serialize_as_the_server_reads_them() {
        let r = ReleaseRequest::default()
            .mean(0.001)
            .quantiles(0.002, vec![0.9, 0.1])
            .histogram(0.003, 5);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "mean": {"rho": 0.001},
                "quantiles": {"rho": 0.002, "levels": [0.9, 0.1], "method": "kss"},
                "histogram": {"rho": 0.003, "bins": 5},
                "by_group": false,
            })
        );
        assert_eq!(
            serde_json::to_value(BudgetRequest::rho(0.5)).unwrap(),
            json!({"rho": 0.5})
        );
        assert_eq!(
            serde_json::to_value(BudgetRequest::epsilon(1.0, 1e-6)).unwrap(),
            json!({"epsilon": 1.0, "delta": 1e-6})
        );
        assert_eq!(
            serde_json::to_value(PolicyUpdate { policy: None }).unwrap(),
            json!({"policy": null})
        );
        assert_eq!(
            serde_json::to_value(DatasetSetup::default()).unwrap(),
            json!({})
        );
    }

    #[test]
    fn group_statistics_are_flattened() {
        let v: ReleaseValues = serde_json::from_value(json!({
            "groups": [
                {"label": "a", "mean": {"mean": 1.5, "count": 10.0}},
                {"label": null, "histogram": {"edges": [0.0, 1.0], "counts": [3.0]}},
            ]
        }))
        .unwrap();
        assert!(v.population.is_none());
        assert_eq!(v.group(Some("a")).unwrap().mean.unwrap().mean, 1.5);
        let none = v.group(None).unwrap();
        assert!(none.mean.is_none());
        assert_eq!(none.histogram.as_ref().unwrap().counts, vec![3.0]);
        assert!(v.group(Some("b")).is_none());
    }
}

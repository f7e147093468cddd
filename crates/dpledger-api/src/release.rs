//! The DP releases' wire (spec §9): what a release asks for and what it
//! published, the release budget, the automatic policy and the label groups,
//! as the server answers them and the Rust client sends and reads them. The
//! rules that need nothing but the request (its validation, its zCDP cost,
//! whether a budget allows it) are here too, so that both sides apply them
//! alike; the mechanisms and the conversion of an `(epsilon, delta)` budget
//! stay in the server.

use crate::error::{check_delta, InvalidArgument};
use serde::{Deserialize, Serialize};

/// Largest number of quantile levels in one release.
pub const MAX_LEVELS: usize = 99;
/// Largest number of histogram bins.
pub const MAX_BINS: usize = 1000;
/// Largest number of gradient steps of the seed's quantile method.
pub const MAX_GRADIENT_STEPS: usize = 1000;

/// The DP mean of the per-example epsilons.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MeanRequest {
    /// zCDP cost of this statistic (split evenly between the sum and the count).
    pub rho: f64,
}

/// How quantiles are estimated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QuantileMethod {
    /// Kaplan–Schnapp–Stemmer recursion over the exponential mechanism (default).
    #[default]
    Kss,
    /// The seed's method: full-batch gradient descent on the quantile loss with
    /// Gaussian counts (Andrew et al. 2021), for comparison.
    GradientDescent,
}

/// DP quantiles of the per-example epsilons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QuantilesRequest {
    /// zCDP cost of all the levels together.
    pub rho: f64,
    /// Levels in (0, 1), e.g. `[0.1, 0.3, 0.5, 0.7, 0.9]`; sorted by the server.
    pub levels: Vec<f64>,
    /// Estimation method (default `kss`).
    #[serde(default)]
    pub method: QuantileMethod,
    /// Gradient steps of `gradient_descent` (default 20, as in the seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
}

/// A DP histogram of the per-example epsilons over equal bins of `[0, B]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HistogramRequest {
    /// zCDP cost of the histogram.
    pub rho: f64,
    /// Number of bins (1–1000).
    pub bins: usize,
}

/// A release: any of mean, quantiles and histogram, of the whole population or of
/// every label group. Its cost is the sum of the statistics' `rho`; per-group
/// statistics cost the same as population ones (the groups are disjoint).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
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
    /// Release the statistics of every label group instead of the population.
    #[serde(default)]
    pub by_group: bool,
    /// Delta at which per-example epsilons (and the bound `B`) are computed;
    /// default: the dataset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
}

/// A released mean and the noisy count it was divided by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MeanValue {
    /// The DP mean, clamped to `[0, B]`.
    pub mean: f64,
    /// The DP count of examples (Gaussian noise, rounded, at least 0).
    pub count: f64,
}

/// One released quantile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuantileValue {
    /// The level in (0, 1).
    pub level: f64,
    /// The DP estimate of the level's quantile, in `[0, B]`.
    pub value: f64,
}

/// Released bin counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistogramValue {
    /// `bins + 1` bin edges from 0 to `B`; bin `j` is `[edges[j], edges[j+1])`, the
    /// last one closed.
    pub edges: Vec<f64>,
    /// Noisy counts, rounded and clamped at 0 (post-processing).
    pub counts: Vec<f64>,
}

/// The statistics released for one population (everyone, or one group).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Statistics {
    /// The DP mean and count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<MeanValue>,
    /// The DP quantiles, by increasing level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantiles: Option<Vec<QuantileValue>>,
    /// The DP histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<HistogramValue>,
}

/// The statistics of one label group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupStatistics {
    /// The label; `null` for the examples without one.
    pub label: Option<String>,
    /// Its statistics.
    #[serde(flatten)]
    pub statistics: Statistics,
}

/// What a release published: the population's statistics, or every group's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseValues {
    /// Statistics of all examples (when `by_group` was false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<Statistics>,
    /// Statistics of every group, labels in order of first use, then the
    /// unlabelled examples (when `by_group` was true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<GroupStatistics>>,
}

/// A release as recorded durably and served to viewers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Release {
    /// 1, 2, … within the dataset.
    pub id: u64,
    /// Steps applied when it was released (the ledger's next step).
    pub step: u64,
    /// When it was released (seconds since the Unix epoch).
    pub released_at: u64,
    /// `request` for a curator's request, `policy` for an automatic one.
    pub trigger: ReleaseTrigger,
    /// What was asked for.
    pub request: ReleaseRequest,
    /// Delta at which epsilons were computed.
    pub delta: f64,
    /// The bound `B` (worst-case epsilon at `delta` before this release).
    pub bound: f64,
    /// zCDP cost charged to every example and to the worst case.
    pub rho: f64,
    /// The released statistics.
    pub values: ReleaseValues,
}

/// Who asked for a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReleaseTrigger {
    /// A curator's request.
    Request,
    /// The dataset's release policy, after a step.
    Policy,
}

/// Releases every `every_steps` steps, automatically. Steps never wait for a
/// release: one that falls due while the previous is still being computed is
/// deferred until it is done (and then describes the step reached by then);
/// releases falling due meanwhile coalesce into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleasePolicy {
    /// Release after every step whose number of applied steps is a multiple of this.
    pub every_steps: u64,
    /// What to release each time.
    pub request: ReleaseRequest,
}

/// A budget as asked for: `rho`, or `epsilon` with `delta`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetRequest {
    /// Total zCDP cost allowed for releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho: Option<f64>,
    /// Or: the releases together must be (epsilon, delta)-DP …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// … at this delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
}

/// The budget's state, as shown to viewers and in a refusal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetStatus {
    /// Total zCDP `rho` releases may spend; `null` until a curator sets one (no
    /// release is possible before).
    pub rho_budget: Option<f64>,
    /// zCDP `rho` spent by the releases so far.
    pub rho_spent: f64,
    /// Releases so far.
    pub releases: u64,
}

/// The answer to an accepted release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseOutcome {
    /// The release as stored and served to viewers.
    pub release: Release,
    /// The budget after it.
    pub budget: BudgetStatus,
}

/// Releases of a dataset, newest first, with the budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseList {
    /// The release budget and its spend.
    pub budget: BudgetStatus,
    /// The automatic policy, if any.
    pub policy: Option<ReleasePolicy>,
    /// Why the policy's latest release was refused, if it was: the full refusal
    /// for curators and admins, a reason without data-dependent numbers for
    /// viewers and owners.
    pub policy_error: Option<String>,
    /// Newest first.
    pub releases: Vec<Release>,
}

/// The policy now in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyView {
    /// The policy; `null` when none.
    pub policy: Option<ReleasePolicy>,
    /// Why its latest release was refused, if it was: the full refusal for
    /// curators and admins, a reason without data-dependent numbers for viewers
    /// and owners.
    pub policy_error: Option<String>,
}

/// The dataset's groups after a label assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabelsView {
    /// Every label in use or used before, in order of first use.
    pub groups: Vec<String>,
}

fn check_rho(name: &str, rho: f64) -> Result<(), InvalidArgument> {
    if rho.is_finite() && rho > 0.0 && rho <= 1e6 {
        Ok(())
    } else {
        Err(InvalidArgument::new(
            name,
            format!("{rho} is not a zCDP cost in (0, 1e6]"),
        ))
    }
}

impl ReleaseRequest {
    /// Check every parameter, and sort the quantile levels.
    pub fn validate(&mut self) -> Result<(), InvalidArgument> {
        if self.mean.is_none() && self.quantiles.is_none() && self.histogram.is_none() {
            return Err(InvalidArgument::new(
                "release",
                "ask for at least one of mean, quantiles, histogram",
            ));
        }
        if let Some(m) = &self.mean {
            check_rho("mean.rho", m.rho)?;
        }
        if let Some(q) = &mut self.quantiles {
            check_rho("quantiles.rho", q.rho)?;
            if q.levels.is_empty() || q.levels.len() > MAX_LEVELS {
                return Err(InvalidArgument::new(
                    "quantiles.levels",
                    format!("give 1 to {MAX_LEVELS} levels"),
                ));
            }
            if let Some(l) = q.levels.iter().find(|l| !(**l > 0.0 && **l < 1.0)) {
                return Err(InvalidArgument::new(
                    "quantiles.levels",
                    format!("{l} is not in (0, 1)"),
                ));
            }
            q.levels.sort_by(f64::total_cmp);
            if q.levels.windows(2).any(|w| w[0] == w[1]) {
                return Err(InvalidArgument::new(
                    "quantiles.levels",
                    "a level is repeated",
                ));
            }
            match (q.method, q.steps) {
                (QuantileMethod::Kss, Some(_)) => {
                    return Err(InvalidArgument::new(
                        "quantiles.steps",
                        "only the gradient_descent method takes steps",
                    ))
                }
                (QuantileMethod::GradientDescent, Some(s)) if s == 0 || s > MAX_GRADIENT_STEPS => {
                    return Err(InvalidArgument::new(
                        "quantiles.steps",
                        format!("{s} is not in 1..={MAX_GRADIENT_STEPS}"),
                    ))
                }
                _ => {}
            }
        }
        if let Some(h) = &self.histogram {
            check_rho("histogram.rho", h.rho)?;
            if h.bins == 0 || h.bins > MAX_BINS {
                return Err(InvalidArgument::new(
                    "histogram.bins",
                    format!("{} is not in 1..={MAX_BINS}", h.bins),
                ));
            }
        }
        if let Some(d) = self.delta {
            check_delta("delta", d)?;
        }
        Ok(())
    }

    /// The release's total zCDP cost.
    pub fn rho(&self) -> f64 {
        self.mean.as_ref().map_or(0.0, |m| m.rho)
            + self.quantiles.as_ref().map_or(0.0, |q| q.rho)
            + self.histogram.as_ref().map_or(0.0, |h| h.rho)
    }

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

impl ReleasePolicy {
    /// Validate the period and the request.
    pub fn validate(&mut self) -> Result<(), InvalidArgument> {
        if self.every_steps == 0 {
            return Err(InvalidArgument::new("every_steps", "must be at least 1"));
        }
        self.request.validate()
    }
}

impl BudgetRequest {
    /// A budget of `rho` (zCDP).
    pub fn rho(rho: f64) -> Self {
        Self {
            rho: Some(rho),
            epsilon: None,
            delta: None,
        }
    }

    /// A budget that keeps the releases together `(epsilon, delta)`-DP (the
    /// server converts it, exactly and rounded down, to the largest `rho`).
    pub fn epsilon(epsilon: f64, delta: f64) -> Self {
        Self {
            rho: None,
            epsilon: Some(epsilon),
            delta: Some(delta),
        }
    }
}

impl BudgetStatus {
    /// Whether spending `rho` more stays within the budget (a relative slack of
    /// 1e-12 lets a budget be split into equal parts despite rounding).
    pub fn allows(&self, rho: f64) -> bool {
        self.rho_budget
            .is_some_and(|b| self.rho_spent + rho <= b * (1.0 + 1e-12))
    }

    /// The `rho` still to spend (`None` when no budget is set).
    pub fn rho_left(&self) -> Option<f64> {
        self.rho_budget.map(|b| (b - self.rho_spent).max(0.0))
    }
}

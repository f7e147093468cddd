//! What a release asks for, its validation, and its zCDP cost: the cost depends
//! only on the request (never on the data), so it is known and checked against
//! the budget before any data is touched.

use crate::accounting::error::{InvalidArgument, Result};
use serde::{Deserialize, Serialize};

/// Largest number of quantile levels in one release.
pub const MAX_LEVELS: usize = 99;
/// Largest number of histogram bins.
pub const MAX_BINS: usize = 1000;
/// Largest number of gradient steps of the seed's quantile method.
pub const MAX_GRADIENT_STEPS: usize = 1000;

/// The DP mean of the per-example epsilons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeanRequest {
    /// zCDP cost of this statistic (split evenly between the sum and the count).
    pub rho: f64,
}

/// How quantiles are estimated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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

fn check_rho(name: &str, rho: f64) -> Result<()> {
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
    pub fn validate(&mut self) -> Result<()> {
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
            crate::accounting::validate::delta("delta", d)?;
        }
        Ok(())
    }

    /// The release's total zCDP cost.
    pub fn rho(&self) -> f64 {
        self.mean.as_ref().map_or(0.0, |m| m.rho)
            + self.quantiles.as_ref().map_or(0.0, |q| q.rho)
            + self.histogram.as_ref().map_or(0.0, |h| h.rho)
    }
}

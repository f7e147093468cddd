//! The stateless accountant's wire (`/v1/accountant/*`, and the `rdp`,
//! `epsilon`, `noise`, `compare` and `schedule` commands of the CLI): the
//! requests and their answers. The server validates and computes them
//! (`dpledger::engine::accountant`); the Rust client sends and reads them.
//! JSON has no infinity: an unbounded result is `null`, here `None`.
//!
//! With the `cli` feature (the server's) the choices also derive
//! `clap::ValueEnum`, so that the CLI's flags take the very same values.

use crate::config::Conversion;
use serde::{Deserialize, Serialize};

/// Which accountant computes a worst-case number. The default is the tightest
/// valid one, PLD, as for a served dataset's worst case, so the CLI, the stateless
/// endpoints and the service agree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Privacy loss distribution (the default: the tightest; spec §8).
    #[default]
    Pld,
    /// Exact RDP (on request; `orders` and `conversion` apply to it only).
    Rdp,
}

/// RDP of one Poisson-subsampled Gaussian step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RdpRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier >= 0.
    pub noise_multiplier: f64,
    /// Rényi orders (> 1); default: dp-accounting's list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
}

/// RDP at each order (`null` = infinite).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RdpResponse {
    /// The orders, sorted.
    pub orders: Vec<f64>,
    /// RDP of one step at each order.
    pub rdp: Vec<Option<f64>>,
}

/// Worst-case epsilon of `steps` identical Poisson steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EpsilonRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier >= 0.
    pub noise_multiplier: f64,
    /// Number of steps.
    pub steps: u64,
    /// Delta in (0, 1).
    pub delta: f64,
    /// Rényi orders (`rdp` only); default: dp-accounting's list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// RDP-to-DP conversion (`rdp` only; default improved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub conversion: Option<Conversion>,
    /// Accountant: `pld` (default, the tightest) or `rdp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub method: Option<Method>,
    /// PLD grid spacing of the privacy loss (default 1e-3; `pld` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_discretization: Option<f64>,
}

/// An epsilon with its optimal order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EpsilonResponse {
    /// Epsilon (`null` = infinite).
    pub epsilon: Option<f64>,
    /// The Rényi order attaining it (`rdp` only).
    pub order: Option<f64>,
    /// The delta it holds at.
    pub delta: f64,
    /// The accountant that computed it (`pld` or `rdp`).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub method: Method,
}

/// Calibrate the noise multiplier to a target epsilon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NoiseRequest {
    /// Target epsilon > 0.
    pub target_epsilon: f64,
    /// Delta in (0, 1).
    pub delta: f64,
    /// Poisson sampling rate in (0, 1].
    pub sampling_rate: f64,
    /// Number of steps (> 0).
    pub steps: u64,
    /// Rényi orders (`rdp` only); default: dp-accounting's list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// Accountant: `pld` (default, the tightest) or `rdp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub method: Option<Method>,
    /// PLD grid spacing of the privacy loss (default 1e-3; `pld` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_discretization: Option<f64>,
}

/// The calibrated noise multiplier (its epsilon is at most the target).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NoiseResponse {
    /// Noise multiplier: within 1e-9 (rdp) or 1e-4 (pld) relative of the smallest that meets the target.
    pub noise_multiplier: f64,
    /// The accountant that calibrated it (`pld` or `rdp`).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub method: Method,
    /// `pld` only: the noise multiplier RDP would need for the same target.
    pub rdp_noise_multiplier: Option<f64>,
    /// `pld` only: fraction of noise saved against RDP, `1 - pld / rdp`.
    pub noise_saving: Option<f64>,
}

/// Compare accountants for one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier > 0.
    pub noise_multiplier: f64,
    /// Number of steps.
    pub steps: u64,
    /// Delta in (0, 1).
    pub delta: f64,
}

/// One accountant's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompareRow {
    /// Stable machine name of the method.
    pub method: String,
    /// Epsilon (`null` where not applicable or infinite).
    pub epsilon: Option<f64>,
    /// Whether it is a proven upper bound (false: an empirical estimate).
    pub guarantee: bool,
    /// What the method assumes.
    pub description: String,
}

/// The comparison table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompareResponse {
    /// One row per method; the first (`pld`, the tightest) is dpledger's default,
    /// the second (`rdp`) what per-example ledgers use.
    pub rows: Vec<CompareRow>,
}

/// Decay function of a noise schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    /// sigma_t = sigma_0.
    Constant,
    /// sigma_t = sigma_0 / (1 + k t).
    Time,
    /// sigma_t = sigma_0 exp(-k t).
    Exponential,
    /// sigma_t = sigma_0 k^floor(t / period).
    Step,
    /// sigma_t = (sigma_0 - sigma_end)(1 - t/period)^k + sigma_end.
    Polynomial,
}

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum BatchingKind {
    /// Poisson sampling (exact RDP with amplification).
    Poisson,
    /// Shuffled fixed-size batches (one Gaussian charge per epoch).
    Shuffle,
}

/// Plan a noise schedule against a budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Decay function.
    pub kind: ScheduleKind,
    /// Initial noise multiplier.
    pub sigma0: f64,
    /// Decay rate (time, exponential), factor (step) or power (polynomial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay: Option<f64>,
    /// Period in epochs (step, polynomial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<u32>,
    /// Final sigma (polynomial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma_end: Option<f64>,
    /// Batching; default shuffle for a rho budget, poisson for an epsilon budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batching: Option<BatchingKind>,
    /// Poisson sampling rate (poisson batching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<f64>,
    /// Steps per epoch for Poisson batching (default round(1/q)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_epoch: Option<u64>,
    /// Total epsilon budget (with `delta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_epsilon: Option<f64>,
    /// Delta of the epsilon budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// Total rho-zCDP budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_rho: Option<f64>,
    /// Horizon in epochs (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_epochs: Option<u32>,
}

/// One epoch of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleEpoch {
    /// Epoch number (0-based).
    pub epoch: u32,
    /// Its noise multiplier.
    pub sigma: f64,
    /// Cumulative spend after it (epsilon or rho, as the budget).
    pub spent: Option<f64>,
    /// Whether it fits the budget.
    pub within_budget: bool,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleResponse {
    /// The decay function.
    pub kind: ScheduleKind,
    /// The batching accounted.
    pub batching: BatchingKind,
    /// Budget unit: "epsilon" or "rho".
    pub unit: String,
    /// Sigma of every planned epoch.
    pub sigma_per_epoch: Vec<f64>,
    /// Epochs up to and including the first over budget.
    pub epochs: Vec<ScheduleEpoch>,
    /// First epoch that must not run (`null`: all of `max_epochs` fit).
    pub stop_epoch: Option<u32>,
}

impl Method {
    /// The spelling in JSON (`pld` or `rdp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Rdp => "rdp",
            Method::Pld => "pld",
        }
    }
}

impl ScheduleRequest {
    /// A request of `kind` starting at `sigma0`, every optional field unset.
    pub fn new(kind: ScheduleKind, sigma0: f64) -> Self {
        Self {
            kind,
            sigma0,
            decay: None,
            period: None,
            sigma_end: None,
            batching: None,
            sampling_rate: None,
            steps_per_epoch: None,
            budget_epsilon: None,
            delta: None,
            budget_rho: None,
            max_epochs: None,
        }
    }
}

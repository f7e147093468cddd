//! Bodies of the stateless accountant endpoints (`/v1/accountant/*`): the same
//! computations as the `dpledger` CLI, for planning a run before it starts.
//! Unbounded results are `None` (the server's `null`).

use crate::types::Conversion;
use serde::{Deserialize, Serialize};

/// RDP of one Poisson-subsampled Gaussian step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdpRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier >= 0.
    pub noise_multiplier: f64,
    /// Rényi orders (> 1); default: dp-accounting's list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
}

/// RDP at each order (`None` = infinite).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RdpResponse {
    /// The orders, sorted.
    pub orders: Vec<f64>,
    /// RDP of one step at each order.
    pub rdp: Vec<Option<f64>>,
}

/// Which accountant computes a worst-case number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountantMethod {
    /// Privacy loss distribution: the tightest, the server's default.
    Pld,
    /// Exact RDP (`orders` and `conversion` apply to it only).
    Rdp,
}

/// Worst-case epsilon of `steps` identical Poisson steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpsilonRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier >= 0.
    pub noise_multiplier: f64,
    /// Number of steps.
    pub steps: u64,
    /// Delta in (0, 1).
    pub delta: f64,
    /// Rényi orders (`Rdp` only); default: dp-accounting's list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// RDP-to-DP conversion (`Rdp` only; default improved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
    /// The accountant; default `Pld` (the tightest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<AccountantMethod>,
}

/// An epsilon with its optimal order.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EpsilonResponse {
    /// Epsilon (`None` = infinite).
    pub epsilon: Option<f64>,
    /// The Rényi order attaining it (`Rdp` only).
    pub order: Option<f64>,
    /// The delta it holds at.
    pub delta: f64,
    /// The accountant that computed it.
    pub method: AccountantMethod,
}

/// Calibrate the noise multiplier to a target epsilon.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoiseRequest {
    /// Target epsilon > 0.
    pub target_epsilon: f64,
    /// Delta in (0, 1).
    pub delta: f64,
    /// Poisson sampling rate in (0, 1].
    pub sampling_rate: f64,
    /// Number of steps (> 0).
    pub steps: u64,
    /// Rényi orders (`Rdp` only); default: dp-accounting's list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// The accountant; default `Pld` (the tightest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<AccountantMethod>,
}

/// The calibrated noise multiplier (its epsilon is at most the target).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NoiseResponse {
    /// Noise multiplier, within 1e-9 (`Rdp`) or 1e-4 (`Pld`) relative of the
    /// smallest that meets the target.
    pub noise_multiplier: f64,
    /// The accountant that calibrated it.
    pub method: AccountantMethod,
    /// `Pld` only: the noise multiplier RDP would need for the same target.
    #[serde(default)]
    pub rdp_noise_multiplier: Option<f64>,
    /// `Pld` only: the fraction of noise saved against RDP.
    #[serde(default)]
    pub noise_saving: Option<f64>,
}

/// Compare accountants for one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompareRow {
    /// Stable machine name of the method (`pld` is the default, `rdp` what
    /// per-example ledgers use).
    pub method: String,
    /// Epsilon (`None` where not applicable or infinite).
    #[serde(default)]
    pub epsilon: Option<f64>,
    /// Whether it is a proven upper bound (false: an estimate).
    pub guarantee: bool,
    /// What the method assumes.
    pub description: String,
}

/// The comparison table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompareResponse {
    /// One row per method; the first (`pld`, the tightest) is dpledger's default,
    /// the second (`rdp`) what per-example ledgers use.
    pub rows: Vec<CompareRow>,
}

/// Decay function of a noise schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// How batches are formed (for schedules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchingKind {
    /// Poisson sampling.
    Poisson,
    /// Shuffled fixed-size batches.
    Shuffle,
}

/// Plan a noise schedule against a budget. Give exactly one of `budget_epsilon`
/// (with `delta`) or `budget_rho`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleRequest {
    /// Decay function.
    pub kind: ScheduleKind,
    /// Initial noise multiplier.
    pub sigma0: f64,
    /// Decay rate (time, exponential), factor (step) or power (polynomial).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay: Option<f64>,
    /// Period in epochs (step, polynomial).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<u32>,
    /// Final sigma (polynomial).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sigma_end: Option<f64>,
    /// Batching; default shuffle for a rho budget, poisson for an epsilon budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batching: Option<BatchingKind>,
    /// Poisson sampling rate (poisson batching).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<f64>,
    /// Steps per epoch for Poisson batching (default round(1/q)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_per_epoch: Option<u64>,
    /// Total epsilon budget (with `delta`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_epsilon: Option<f64>,
    /// Delta of the epsilon budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// Total rho-zCDP budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_rho: Option<f64>,
    /// Horizon in epochs (default 10,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_epochs: Option<u32>,
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

/// One epoch of a plan.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScheduleEpoch {
    /// Epoch number (0-based).
    pub epoch: u32,
    /// Its noise multiplier.
    pub sigma: f64,
    /// Cumulative spend after it (`None` = infinite).
    #[serde(default)]
    pub spent: Option<f64>,
    /// Whether it fits the budget.
    pub within_budget: bool,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// First epoch that must not run (`None`: all of `max_epochs` fit).
    #[serde(default)]
    pub stop_epoch: Option<u32>,
}

//! The stateless accountant (`rdp`, `epsilon`, `noise`, `compare`, `schedule`):
//! typed requests and responses shared by the CLI and the HTTP API, so both front
//! ends validate and compute identically. Field names in errors are the JSON
//! names; the CLI renames them to its flags.
//!
//! Why one file of about 550 lines: the five request types share their
//! validation (orders, methods, PLD options, the `null`-for-infinity rule),
//! and each is a request, a response and one `compute`; split by request,
//! each piece would import the others' helpers back.

use crate::accounting::calibrate::noise_for_epsilon;
use crate::accounting::compare::{compare, ComparisonRow};
use crate::accounting::composition::{worst_case_epsilon, Event};
use crate::accounting::conversion::Conversion;
use crate::accounting::orders::default_orders;
use crate::accounting::pld::{self, noise_for_epsilon_pld, PldEvent, PldOptions};
use crate::accounting::schedule::{
    plan, Batching, Budget, NoiseSchedule, PlanRequest, PlannedEpoch,
};
use crate::accounting::sgm::sgm_rdp_orders;
use crate::accounting::validate;
use crate::accounting::InvalidArgument;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

type Result<T> = std::result::Result<T, InvalidArgument>;

/// JSON has no infinity: unbounded values are `null`.
pub fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn resolve_orders(orders: &Option<Vec<f64>>) -> Result<Vec<f64>> {
    match orders {
        Some(list) => validate::orders("orders", list),
        None => Ok(default_orders()),
    }
}

/// Which accountant computes a worst-case number. The default is the tightest
/// valid one, PLD, as for a served dataset's worst case, so the CLI, the stateless
/// endpoints and the service agree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Privacy loss distribution (the default: the tightest; spec §8).
    #[default]
    Pld,
    /// Exact RDP (on request; `orders` and `conversion` apply to it only).
    Rdp,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Rdp => "rdp",
            Method::Pld => "pld",
        }
    }
}

/// RDP-only options given to the PLD accountant are refused rather than ignored.
fn rdp_only(method: Method, name: &str, given: bool) -> Result<()> {
    if method == Method::Pld && given {
        return Err(InvalidArgument::new(
            name,
            "applies to the RDP accountant only: ask for method rdp (the default method is pld)",
        ));
    }
    Ok(())
}

/// A composition too long for the PLD grid names the way out.
fn pld_error(mut e: InvalidArgument) -> InvalidArgument {
    if e.name == "steps" {
        e.reason
            .push_str(" (a limit of the PLD accountant, the default; method rdp has none)");
    }
    e
}

fn pld_options(value_discretization: Option<f64>) -> PldOptions {
    PldOptions {
        value_discretization: value_discretization.unwrap_or(pld::DEFAULT_VALUE_DISCRETIZATION),
    }
}

/// RDP of one Poisson-subsampled Gaussian step.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RdpRequest {
    /// Poisson sampling rate in [0, 1].
    pub sampling_rate: f64,
    /// Noise multiplier >= 0.
    pub noise_multiplier: f64,
    /// Rényi orders (> 1); default: dp-accounting's list.
    #[serde(default)]
    pub orders: Option<Vec<f64>>,
}

/// RDP at each order (`null` = infinite).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RdpResponse {
    /// The orders, sorted.
    pub orders: Vec<f64>,
    /// RDP of one step at each order.
    pub rdp: Vec<Option<f64>>,
}

impl RdpRequest {
    /// Validate and compute.
    pub fn compute(&self) -> Result<RdpResponse> {
        let q = validate::sampling_rate("sampling_rate", self.sampling_rate)?;
        let sigma = validate::noise_multiplier("noise_multiplier", self.noise_multiplier)?;
        let orders = resolve_orders(&self.orders)?;
        let rdp = sgm_rdp_orders(q, sigma, &orders)
            .into_iter()
            .map(finite)
            .collect();
        Ok(RdpResponse { orders, rdp })
    }
}

/// Worst-case epsilon of `steps` identical Poisson steps.
#[derive(Debug, Clone, Deserialize, ToSchema)]
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
    #[serde(default)]
    pub orders: Option<Vec<f64>>,
    /// RDP-to-DP conversion (`rdp` only; default improved).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub conversion: Option<Conversion>,
    /// Accountant: `pld` (default, the tightest) or `rdp`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub method: Option<Method>,
    /// PLD grid spacing of the privacy loss (default 1e-3; `pld` only).
    #[serde(default)]
    pub value_discretization: Option<f64>,
}

/// An epsilon with its optimal order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EpsilonResponse {
    /// Epsilon (`null` = infinite).
    pub epsilon: Option<f64>,
    /// The Rényi order attaining it (`rdp` only).
    pub order: Option<f64>,
    /// The delta it holds at.
    pub delta: f64,
    /// The accountant that computed it (`pld` or `rdp`).
    pub method: String,
}

impl EpsilonRequest {
    /// Validate and compute.
    pub fn compute(&self) -> Result<EpsilonResponse> {
        let q = validate::sampling_rate("sampling_rate", self.sampling_rate)?;
        let sigma = validate::noise_multiplier("noise_multiplier", self.noise_multiplier)?;
        let delta = validate::delta("delta", self.delta)?;
        let method = self.method.unwrap_or_default();
        rdp_only(method, "orders", self.orders.is_some())?;
        rdp_only(method, "conversion", self.conversion.is_some())?;
        if method == Method::Pld {
            let eps = pld::worst_case_epsilon(
                &[PldEvent::PoissonGaussian {
                    q,
                    sigma,
                    count: self.steps,
                }],
                delta,
                &pld_options(self.value_discretization),
            )
            .map_err(pld_error)?;
            return Ok(EpsilonResponse {
                epsilon: finite(eps),
                order: None,
                delta,
                method: method.name().into(),
            });
        }
        let orders = resolve_orders(&self.orders)?;
        let e = worst_case_epsilon(
            &[Event::Poisson {
                q,
                sigma,
                count: self.steps,
            }],
            &orders,
            delta,
            self.conversion.unwrap_or_default(),
        );
        Ok(EpsilonResponse {
            epsilon: finite(e.epsilon),
            order: finite(e.order),
            delta,
            method: method.name().into(),
        })
    }
}

/// Calibrate the noise multiplier to a target epsilon.
#[derive(Debug, Clone, Deserialize, ToSchema)]
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
    #[serde(default)]
    pub orders: Option<Vec<f64>>,
    /// Accountant: `pld` (default, the tightest) or `rdp`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub method: Option<Method>,
    /// PLD grid spacing of the privacy loss (default 1e-3; `pld` only).
    #[serde(default)]
    pub value_discretization: Option<f64>,
}

/// The calibrated noise multiplier (its epsilon is at most the target).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NoiseResponse {
    /// Noise multiplier: within 1e-9 (rdp) or 1e-4 (pld) relative of the smallest that meets the target.
    pub noise_multiplier: f64,
    /// The accountant that calibrated it (`pld` or `rdp`).
    pub method: String,
    /// `pld` only: the noise multiplier RDP would need for the same target.
    pub rdp_noise_multiplier: Option<f64>,
    /// `pld` only: fraction of noise saved against RDP, `1 - pld / rdp`.
    pub noise_saving: Option<f64>,
}

impl NoiseRequest {
    /// Validate and compute.
    pub fn compute(&self) -> Result<NoiseResponse> {
        let method = self.method.unwrap_or_default();
        rdp_only(method, "orders", self.orders.is_some())?;
        let orders = resolve_orders(&self.orders)?;
        let sigma = noise_for_epsilon(
            self.target_epsilon,
            self.delta,
            self.sampling_rate,
            self.steps,
            &orders,
            Conversion::Improved,
        )?;
        if method == Method::Rdp {
            return Ok(NoiseResponse {
                noise_multiplier: sigma,
                method: method.name().into(),
                rdp_noise_multiplier: None,
                noise_saving: None,
            });
        }
        let pld_sigma = noise_for_epsilon_pld(
            self.target_epsilon,
            self.delta,
            self.sampling_rate,
            self.steps,
            &pld_options(self.value_discretization),
        )
        .map_err(pld_error)?;
        Ok(NoiseResponse {
            noise_multiplier: pld_sigma,
            method: method.name().into(),
            rdp_noise_multiplier: Some(sigma),
            noise_saving: Some(1.0 - pld_sigma / sigma),
        })
    }
}

/// Compare accountants for one configuration.
#[derive(Debug, Clone, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompareResponse {
    /// One row per method; the first (`pld`, the tightest) is dpledger's default,
    /// the second (`rdp`) what per-example ledgers use.
    pub rows: Vec<CompareRow>,
}

impl CompareRequest {
    /// Validate and compute.
    pub fn compute(&self) -> Result<CompareResponse> {
        let rows = compare(
            self.sampling_rate,
            self.noise_multiplier,
            self.steps,
            self.delta,
        )?;
        Ok(CompareResponse {
            rows: rows
                .into_iter()
                .map(
                    |ComparisonRow {
                         method,
                         description,
                         epsilon,
                         guarantee,
                     }| CompareRow {
                        method,
                        epsilon: epsilon.and_then(finite),
                        guarantee,
                        description,
                    },
                )
                .collect(),
        })
    }
}

/// Decay function of a noise schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, clap::ValueEnum)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BatchingKind {
    /// Poisson sampling (exact RDP with amplification).
    Poisson,
    /// Shuffled fixed-size batches (one Gaussian charge per epoch).
    Shuffle,
}

/// Plan a noise schedule against a budget.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Decay function.
    pub kind: ScheduleKind,
    /// Initial noise multiplier.
    pub sigma0: f64,
    /// Decay rate (time, exponential), factor (step) or power (polynomial).
    #[serde(default)]
    pub decay: Option<f64>,
    /// Period in epochs (step, polynomial).
    #[serde(default)]
    pub period: Option<u32>,
    /// Final sigma (polynomial).
    #[serde(default)]
    pub sigma_end: Option<f64>,
    /// Batching; default shuffle for a rho budget, poisson for an epsilon budget.
    #[serde(default)]
    pub batching: Option<BatchingKind>,
    /// Poisson sampling rate (poisson batching).
    #[serde(default)]
    pub sampling_rate: Option<f64>,
    /// Steps per epoch for Poisson batching (default round(1/q)).
    #[serde(default)]
    pub steps_per_epoch: Option<u64>,
    /// Total epsilon budget (with `delta`).
    #[serde(default)]
    pub budget_epsilon: Option<f64>,
    /// Delta of the epsilon budget.
    #[serde(default)]
    pub delta: Option<f64>,
    /// Total rho-zCDP budget.
    #[serde(default)]
    pub budget_rho: Option<f64>,
    /// Horizon in epochs (default 10,000).
    #[serde(default)]
    pub max_epochs: Option<u32>,
}

/// One epoch of a plan.
#[derive(Debug, Clone, Serialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, ToSchema)]
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

fn required<T>(value: Option<T>, name: &str, why: &str) -> Result<T> {
    value.ok_or_else(|| InvalidArgument::new(name, format!("is required {why}")))
}

impl ScheduleRequest {
    fn schedule(&self) -> Result<NoiseSchedule> {
        let why = |k: &str| format!("for kind {k}");
        Ok(match self.kind {
            ScheduleKind::Constant => NoiseSchedule::Constant,
            ScheduleKind::Time => NoiseSchedule::Time {
                k: required(self.decay, "decay", &why("time"))?,
            },
            ScheduleKind::Exponential => NoiseSchedule::Exponential {
                k: required(self.decay, "decay", &why("exponential"))?,
            },
            ScheduleKind::Step => NoiseSchedule::Step {
                k: required(self.decay, "decay", &why("step"))?,
                period: required(self.period, "period", &why("step"))?,
            },
            ScheduleKind::Polynomial => NoiseSchedule::Polynomial {
                k: required(self.decay, "decay", &why("polynomial"))?,
                period: required(self.period, "period", &why("polynomial"))?,
                sigma_end: required(self.sigma_end, "sigma_end", &why("polynomial"))?,
            },
        })
    }

    /// Validate and compute.
    pub fn compute(&self) -> Result<ScheduleResponse> {
        let schedule = self.schedule()?;
        let budget = match (self.budget_epsilon, self.budget_rho) {
            (Some(epsilon), None) => Budget::Epsilon {
                epsilon,
                delta: required(self.delta, "delta", "with budget_epsilon")?,
            },
            (None, Some(rho)) => Budget::Rho { rho },
            _ => {
                return Err(InvalidArgument::new(
                    "budget_epsilon",
                    "give exactly one of budget_epsilon (with delta) or budget_rho",
                ))
            }
        };
        let batching = match (self.batching, budget) {
            (Some(b), _) => b,
            (None, Budget::Rho { .. }) => BatchingKind::Shuffle,
            (None, Budget::Epsilon { .. }) => BatchingKind::Poisson,
        };
        let (q, steps_per_epoch) = if batching == BatchingKind::Poisson {
            let q = validate::sampling_rate(
                "sampling_rate",
                required(self.sampling_rate, "sampling_rate", "for Poisson batching")?,
            )?;
            if q == 0.0 {
                return Err(InvalidArgument::new(
                    "sampling_rate",
                    "must be > 0 for Poisson batching",
                ));
            }
            (
                q,
                self.steps_per_epoch
                    .unwrap_or((1.0 / q).round().max(1.0) as u64),
            )
        } else {
            (0.0, 0)
        };
        let result = plan(&PlanRequest {
            schedule,
            sigma0: self.sigma0,
            batching: match batching {
                BatchingKind::Poisson => Batching::Poisson,
                BatchingKind::Shuffle => Batching::Shuffle,
            },
            q,
            steps_per_epoch,
            budget,
            max_epochs: self.max_epochs.unwrap_or(10_000),
        })?;
        Ok(ScheduleResponse {
            kind: self.kind,
            batching,
            unit: match budget {
                Budget::Epsilon { .. } => "epsilon".into(),
                Budget::Rho { .. } => "rho".into(),
            },
            sigma_per_epoch: result.epochs.iter().map(|e| e.sigma).collect(),
            epochs: result
                .epochs
                .iter()
                .map(
                    |&PlannedEpoch {
                         epoch,
                         sigma,
                         spent,
                         within_budget,
                     }| ScheduleEpoch {
                        epoch,
                        sigma,
                        spent: finite(spent),
                        within_budget,
                    },
                )
                .collect(),
            stop_epoch: result.stop_epoch,
        })
    }
}

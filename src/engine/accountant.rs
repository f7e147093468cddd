//! The stateless accountant (`rdp`, `epsilon`, `noise`, `compare`, `schedule`):
//! typed requests and responses shared by the CLI and the HTTP API, so both front
//! ends validate and compute identically. Field names in errors are the JSON
//! names; the CLI renames them to its flags.
//!
//! Why one file of about 400 lines: the five request types share their
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

/// The requests and answers, defined once with the Rust client in the
/// workspace crate `dpledger-api` (the CLI's choices derive `clap::ValueEnum`
/// there, feature `cli`).
pub use dpledger_api::accountant::{
    BatchingKind, CompareRequest, CompareResponse, CompareRow, EpsilonRequest, EpsilonResponse,
    Method, NoiseRequest, NoiseResponse, RdpRequest, RdpResponse, ScheduleEpoch, ScheduleKind,
    ScheduleRequest, ScheduleResponse,
};

/// Validate a request and compute its answer: the one computation behind the
/// HTTP endpoint and the CLI command of each request (a trait because the
/// requests are the wire crate's types).
pub trait Compute {
    /// The answer.
    type Answer;
    /// Validate and compute.
    fn compute(&self) -> Result<Self::Answer>;
}

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

impl Compute for RdpRequest {
    type Answer = RdpResponse;
    fn compute(&self) -> Result<RdpResponse> {
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

impl Compute for EpsilonRequest {
    type Answer = EpsilonResponse;
    fn compute(&self) -> Result<EpsilonResponse> {
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
                method,
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
            method,
        })
    }
}

impl Compute for NoiseRequest {
    type Answer = NoiseResponse;
    fn compute(&self) -> Result<NoiseResponse> {
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
                method,
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
            method,
            rdp_noise_multiplier: Some(sigma),
            noise_saving: Some(1.0 - pld_sigma / sigma),
        })
    }
}

impl Compute for CompareRequest {
    type Answer = CompareResponse;
    fn compute(&self) -> Result<CompareResponse> {
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

fn required<T>(value: Option<T>, name: &str, why: &str) -> Result<T> {
    value.ok_or_else(|| InvalidArgument::new(name, format!("is required {why}")))
}

/// The noise schedule a request names, with the parameters its kind needs.
fn schedule_of(request: &ScheduleRequest) -> Result<NoiseSchedule> {
    let why = |k: &str| format!("for kind {k}");
    Ok(match request.kind {
        ScheduleKind::Constant => NoiseSchedule::Constant,
        ScheduleKind::Time => NoiseSchedule::Time {
            k: required(request.decay, "decay", &why("time"))?,
        },
        ScheduleKind::Exponential => NoiseSchedule::Exponential {
            k: required(request.decay, "decay", &why("exponential"))?,
        },
        ScheduleKind::Step => NoiseSchedule::Step {
            k: required(request.decay, "decay", &why("step"))?,
            period: required(request.period, "period", &why("step"))?,
        },
        ScheduleKind::Polynomial => NoiseSchedule::Polynomial {
            k: required(request.decay, "decay", &why("polynomial"))?,
            period: required(request.period, "period", &why("polynomial"))?,
            sigma_end: required(request.sigma_end, "sigma_end", &why("polynomial"))?,
        },
    })
}

impl Compute for ScheduleRequest {
    type Answer = ScheduleResponse;
    fn compute(&self) -> Result<ScheduleResponse> {
        let schedule = schedule_of(self)?;
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

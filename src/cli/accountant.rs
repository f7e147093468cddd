//! The stateless accountant subcommands: `rdp`, `epsilon`, `noise`, `compare`,
//! `schedule`. Their names and JSON keys are a fixed contract (issue 2).

use crate::accounting::calibrate::noise_for_epsilon;
use crate::accounting::compare::compare;
use crate::accounting::composition::{worst_case_epsilon, Event};
use crate::accounting::conversion::Conversion;
use crate::accounting::orders::default_orders;
use crate::accounting::schedule::{plan, Batching, Budget, NoiseSchedule, PlanRequest};
use crate::accounting::sgm::sgm_rdp_orders;
use crate::accounting::validate;
use crate::accounting::InvalidArgument;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};

/// Options shared by the commands that take Rényi orders.
#[derive(Debug, Args)]
pub struct OrdersArg {
    /// Comma-separated Rényi orders (> 1); default: dp-accounting's list.
    #[arg(long)]
    pub orders: Option<String>,
}

impl OrdersArg {
    fn resolve(&self) -> Result<Vec<f64>, InvalidArgument> {
        match &self.orders {
            Some(text) => validate::parse_orders("--orders", text),
            None => Ok(default_orders()),
        }
    }
}

/// `dpledger rdp`: RDP of one Poisson-subsampled Gaussian step.
#[derive(Debug, Args)]
pub struct RdpCmd {
    /// Poisson sampling rate q in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: f64,
    /// Noise multiplier sigma >= 0.
    #[arg(long, allow_negative_numbers = true)]
    pub noise_multiplier: f64,
    #[command(flatten)]
    pub orders: OrdersArg,
}

impl RdpCmd {
    /// Run and return the JSON object and its text rendering.
    pub fn run(&self) -> Result<(Value, String), InvalidArgument> {
        let q = validate::sampling_rate("--sampling-rate", self.sampling_rate)?;
        let sigma = validate::noise_multiplier("--noise-multiplier", self.noise_multiplier)?;
        let orders = self.orders.resolve()?;
        let rdp = sgm_rdp_orders(q, sigma, &orders);
        let mut text = format!(
            "RDP of one step (q = {q}, sigma = {sigma}):\n{:>10}  {:>24}\n",
            "order", "rdp"
        );
        for (a, r) in orders.iter().zip(&rdp) {
            text.push_str(&format!("{a:>10}  {r:>24.17e}\n"));
        }
        Ok((
            json!({ "orders": orders, "rdp": finite_or_null(&rdp) }),
            text,
        ))
    }
}

/// `dpledger epsilon`: epsilon of T steps.
#[derive(Debug, Args)]
pub struct EpsilonCmd {
    /// Poisson sampling rate q in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: f64,
    /// Noise multiplier sigma >= 0.
    #[arg(long, allow_negative_numbers = true)]
    pub noise_multiplier: f64,
    /// Number of steps.
    #[arg(long)]
    pub steps: u64,
    /// Target delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
    #[command(flatten)]
    pub orders: OrdersArg,
    /// RDP to (epsilon, delta) conversion.
    #[arg(long, value_enum, default_value_t = ConversionArg::Improved)]
    pub conversion: ConversionArg,
}

/// CLI spelling of [`Conversion`].
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ConversionArg {
    /// Balle et al. 2020 (tighter).
    Improved,
    /// Mironov 2017.
    Classic,
}

impl From<ConversionArg> for Conversion {
    fn from(c: ConversionArg) -> Self {
        match c {
            ConversionArg::Improved => Conversion::Improved,
            ConversionArg::Classic => Conversion::Classic,
        }
    }
}

impl EpsilonCmd {
    /// Run and return the JSON object and its text rendering.
    pub fn run(&self) -> Result<(Value, String), InvalidArgument> {
        let q = validate::sampling_rate("--sampling-rate", self.sampling_rate)?;
        let sigma = validate::noise_multiplier("--noise-multiplier", self.noise_multiplier)?;
        let delta = validate::delta("--delta", self.delta)?;
        let orders = self.orders.resolve()?;
        let e = worst_case_epsilon(
            &[Event::Poisson {
                q,
                sigma,
                count: self.steps,
            }],
            &orders,
            delta,
            self.conversion.into(),
        );
        let text = format!(
            "epsilon = {} at delta = {delta} (optimal order {}) after {} steps, q = {q}, sigma = {sigma}\n",
            e.epsilon, e.order, self.steps
        );
        Ok((
            json!({ "epsilon": num(e.epsilon), "order": num(e.order), "delta": delta }),
            text,
        ))
    }
}

/// `dpledger noise`: calibrate sigma to a target epsilon.
#[derive(Debug, Args)]
pub struct NoiseCmd {
    /// Target epsilon > 0.
    #[arg(long, allow_negative_numbers = true)]
    pub target_epsilon: f64,
    /// Target delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
    /// Poisson sampling rate q in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: f64,
    /// Number of steps.
    #[arg(long)]
    pub steps: u64,
    #[command(flatten)]
    pub orders: OrdersArg,
}

impl NoiseCmd {
    /// Run and return the JSON object and its text rendering.
    pub fn run(&self) -> Result<(Value, String), InvalidArgument> {
        let orders = self.orders.resolve()?;
        let sigma = noise_for_epsilon(
            self.target_epsilon,
            self.delta,
            self.sampling_rate,
            self.steps,
            &orders,
            Conversion::Improved,
        )
        .map_err(flag_names)?;
        let text = format!(
            "noise multiplier {sigma} reaches epsilon <= {} at delta = {} (q = {}, {} steps)\n",
            self.target_epsilon, self.delta, self.sampling_rate, self.steps
        );
        Ok((json!({ "noise_multiplier": sigma }), text))
    }
}

/// `dpledger compare`: several accountants side by side.
#[derive(Debug, Args)]
pub struct CompareCmd {
    /// Poisson sampling rate q in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: f64,
    /// Noise multiplier sigma > 0.
    #[arg(long, allow_negative_numbers = true)]
    pub noise_multiplier: f64,
    /// Number of steps.
    #[arg(long)]
    pub steps: u64,
    /// Target delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
}

impl CompareCmd {
    /// Run and return the JSON object and its text rendering.
    pub fn run(&self) -> Result<(Value, String), InvalidArgument> {
        let rows = compare(
            self.sampling_rate,
            self.noise_multiplier,
            self.steps,
            self.delta,
        )
        .map_err(flag_names)?;
        let mut text = format!(
            "q = {}, sigma = {}, {} steps, delta = {}\n{:<26} {:>14}  {:<10} {}\n",
            self.sampling_rate,
            self.noise_multiplier,
            self.steps,
            self.delta,
            "method",
            "epsilon",
            "guarantee",
            "how"
        );
        for r in &rows {
            let eps = r
                .epsilon
                .map(|e| format!("{e:.6}"))
                .unwrap_or_else(|| "n/a".into());
            let g = if r.guarantee { "yes" } else { "ESTIMATE" };
            text.push_str(&format!(
                "{:<26} {:>14}  {:<10} {}\n",
                r.method, eps, g, r.description
            ));
        }
        let rows_json: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "method": r.method,
                    "epsilon": r.epsilon.map(num).unwrap_or(Value::Null),
                    "guarantee": r.guarantee,
                    "description": r.description,
                })
            })
            .collect();
        Ok((json!({ "rows": rows_json }), text))
    }
}

/// Decay functions of `dpledger schedule`.
#[derive(Debug, Clone, Copy, ValueEnum)]
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

/// CLI spelling of [`Batching`].
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BatchingArg {
    /// Poisson sampling (RDP with amplification).
    Poisson,
    /// Shuffled fixed-size batches (one Gaussian charge per epoch).
    Shuffle,
}

/// `dpledger schedule`: sigma per epoch and the epoch at which the budget runs out.
#[derive(Debug, Args)]
pub struct ScheduleCmd {
    /// Decay function.
    #[arg(long, value_enum)]
    pub kind: ScheduleKind,
    /// Initial noise multiplier sigma_0.
    #[arg(long, alias = "noise-multiplier", allow_negative_numbers = true)]
    pub sigma0: f64,
    /// Decay rate k (time, exponential), factor (step) or power (polynomial).
    #[arg(long, allow_negative_numbers = true)]
    pub decay: Option<f64>,
    /// Period in epochs (step, polynomial).
    #[arg(long)]
    pub period: Option<u32>,
    /// Final sigma (polynomial).
    #[arg(long, allow_negative_numbers = true)]
    pub sigma_end: Option<f64>,
    /// Batching; default shuffle for a rho budget, poisson for an epsilon budget.
    #[arg(long, value_enum)]
    pub batching: Option<BatchingArg>,
    /// Poisson sampling rate (poisson batching).
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: Option<f64>,
    /// Steps per epoch for Poisson batching (default round(1/q)).
    #[arg(long)]
    pub steps_per_epoch: Option<u64>,
    /// Total epsilon budget (with --delta).
    #[arg(long, allow_negative_numbers = true)]
    pub budget_epsilon: Option<f64>,
    /// Delta of the epsilon budget.
    #[arg(long, allow_negative_numbers = true)]
    pub delta: Option<f64>,
    /// Total rho-zCDP budget.
    #[arg(long, allow_negative_numbers = true)]
    pub budget_rho: Option<f64>,
    /// Horizon: stop planning after this many epochs.
    #[arg(long, default_value_t = 10_000)]
    pub max_epochs: u32,
}

fn required<T>(value: Option<T>, name: &str, why: &str) -> Result<T, InvalidArgument> {
    value.ok_or_else(|| InvalidArgument::new(name, format!("is required {why}")))
}

impl ScheduleCmd {
    fn schedule(&self) -> Result<NoiseSchedule, InvalidArgument> {
        let why = |k: &str| format!("for --kind {k}");
        Ok(match self.kind {
            ScheduleKind::Constant => NoiseSchedule::Constant,
            ScheduleKind::Time => NoiseSchedule::Time {
                k: required(self.decay, "--decay", &why("time"))?,
            },
            ScheduleKind::Exponential => NoiseSchedule::Exponential {
                k: required(self.decay, "--decay", &why("exponential"))?,
            },
            ScheduleKind::Step => NoiseSchedule::Step {
                k: required(self.decay, "--decay", &why("step"))?,
                period: required(self.period, "--period", &why("step"))?,
            },
            ScheduleKind::Polynomial => NoiseSchedule::Polynomial {
                k: required(self.decay, "--decay", &why("polynomial"))?,
                period: required(self.period, "--period", &why("polynomial"))?,
                sigma_end: required(self.sigma_end, "--sigma-end", &why("polynomial"))?,
            },
        })
    }

    /// Run and return the JSON object and its text rendering.
    pub fn run(&self) -> Result<(Value, String), InvalidArgument> {
        let schedule = self.schedule()?;
        let budget = match (self.budget_epsilon, self.budget_rho) {
            (Some(epsilon), None) => Budget::Epsilon {
                epsilon,
                delta: required(self.delta, "--delta", "with --budget-epsilon")?,
            },
            (None, Some(rho)) => Budget::Rho { rho },
            _ => {
                return Err(InvalidArgument::new(
                    "--budget-epsilon",
                    "give exactly one of --budget-epsilon (with --delta) or --budget-rho",
                ))
            }
        };
        let batching = match (self.batching, budget) {
            (Some(BatchingArg::Poisson), _) => Batching::Poisson,
            (Some(BatchingArg::Shuffle), _) | (None, Budget::Rho { .. }) => Batching::Shuffle,
            (None, Budget::Epsilon { .. }) => Batching::Poisson,
        };
        let (q, steps_per_epoch) = if batching == Batching::Poisson {
            let q = required(
                self.sampling_rate,
                "--sampling-rate",
                "for Poisson batching",
            )?;
            let q = validate::sampling_rate("--sampling-rate", q)?;
            if q == 0.0 {
                return Err(InvalidArgument::new(
                    "--sampling-rate",
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
            batching,
            q,
            steps_per_epoch,
            budget,
            max_epochs: self.max_epochs,
        })
        .map_err(flag_names)?;
        let unit = match budget {
            Budget::Epsilon { .. } => "epsilon",
            Budget::Rho { .. } => "rho",
        };
        let mut text = format!("{:>6} {:>12} {:>14}\n", "epoch", "sigma", unit);
        for e in &result.epochs {
            let mark = if e.within_budget {
                ""
            } else {
                "  <- over budget"
            };
            text.push_str(&format!(
                "{:>6} {:>12.6} {:>14.6}{mark}\n",
                e.epoch, e.sigma, e.spent
            ));
        }
        match result.stop_epoch {
            Some(t) => text.push_str(&format!(
                "training must stop before epoch {t} ({t} epochs fit the budget)\n"
            )),
            None => text.push_str(&format!("all {} epochs fit the budget\n", self.max_epochs)),
        }
        let epochs: Vec<Value> = result
            .epochs
            .iter()
            .map(|e| json!({"epoch": e.epoch, "sigma": e.sigma, "spent": num(e.spent), "within_budget": e.within_budget}))
            .collect();
        let sigmas: Vec<f64> = result.epochs.iter().map(|e| e.sigma).collect();
        Ok((
            json!({
                "kind": format!("{:?}", self.kind).to_lowercase(),
                "batching": match batching { Batching::Poisson => "poisson", Batching::Shuffle => "shuffle" },
                "budget": match budget {
                    Budget::Epsilon { epsilon, delta } => json!({"epsilon": epsilon, "delta": delta}),
                    Budget::Rho { rho } => json!({"rho": rho}),
                },
                "sigma_per_epoch": sigmas,
                "epochs": epochs,
                "stop_epoch": result.stop_epoch,
            }),
            text,
        ))
    }
}

/// Library argument names (snake_case) to the CLI's flag spelling.
fn flag_names(mut e: InvalidArgument) -> InvalidArgument {
    if !e.name.starts_with("--") {
        e.name = format!("--{}", e.name.replace('_', "-"));
    }
    e
}

/// JSON has no infinity: unbounded values are written as `null` (documented).
pub fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

fn finite_or_null(xs: &[f64]) -> Vec<Value> {
    xs.iter().map(|&x| num(x)).collect()
}

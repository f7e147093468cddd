//! The stateless accountant subcommands: `rdp`, `epsilon`, `noise`, `compare`,
//! `schedule`. Their names and JSON keys are a fixed contract. The
//! computation lives in [`crate::engine::accountant`], shared with the HTTP API;
//! this module only parses flags and renders text.

use crate::accounting::validate;
use crate::accounting::{Conversion, InvalidArgument};
use crate::engine::accountant::{
    BatchingKind, CompareRequest, Compute, EpsilonRequest, Method, NoiseRequest, RdpRequest,
    ScheduleKind, ScheduleRequest,
};
use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::Value;

/// Output of a command: its JSON form and its text form.
pub type Rendered = (Value, String);

fn json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Library argument names (snake_case) to the CLI's flag spelling.
pub fn flag_names(mut e: InvalidArgument) -> InvalidArgument {
    if !e.name.starts_with("--") {
        e.name = format!("--{}", e.name.replace('_', "-"));
    }
    e
}

/// How the text output names a method: which accountant, and how to get the other.
fn method_name(method: &str) -> String {
    match method {
        "pld" => "PLD (the default, tightest; --method rdp for RDP)".into(),
        "rdp" => "RDP".into(),
        other => other.into(),
    }
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or_else(|| "inf".to_string(), |v| v.to_string())
}

/// `--orders` as given on the command line.
#[derive(Debug, Args)]
pub struct OrdersArg {
    /// Comma-separated Rényi orders (> 1); default: dp-accounting's list.
    #[arg(long)]
    pub orders: Option<String>,
}

impl OrdersArg {
    fn parse(&self) -> Result<Option<Vec<f64>>, InvalidArgument> {
        self.orders
            .as_deref()
            .map(|t| validate::parse_orders("--orders", t))
            .transpose()
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
    /// Run the command.
    pub fn run(&self) -> Result<Rendered, InvalidArgument> {
        let req = RdpRequest {
            sampling_rate: self.sampling_rate,
            noise_multiplier: self.noise_multiplier,
            orders: self.orders.parse()?,
        };
        let out = req.compute().map_err(flag_names)?;
        let mut text = format!(
            "RDP of one step (q = {}, sigma = {}):\n{:>10}  {:>24}\n",
            self.sampling_rate, self.noise_multiplier, "order", "rdp"
        );
        for (a, r) in out.orders.iter().zip(&out.rdp) {
            text.push_str(&format!(
                "{a:>10}  {:>24}\n",
                r.map_or("inf".into(), |v| format!("{v:.17e}"))
            ));
        }
        Ok((json(&out), text))
    }
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

/// The run being accounted: `T` identical Poisson steps, reported at `delta`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Poisson sampling rate q in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub sampling_rate: f64,
    /// Noise multiplier sigma (>= 0; > 0 for compare).
    #[arg(long, allow_negative_numbers = true)]
    pub noise_multiplier: f64,
    /// Number of steps.
    #[arg(long)]
    pub steps: u64,
    /// Target delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
}

/// `--method` and the PLD grid, shared by `epsilon` and `noise`.
#[derive(Debug, Args)]
pub struct MethodArgs {
    /// Accountant: pld (privacy loss distribution, the tightest; default) or rdp (exact RDP).
    #[arg(long, value_enum, default_value_t = Method::Pld)]
    pub method: Method,
    /// PLD grid spacing of the privacy loss (default 1e-3; pld only).
    #[arg(long, allow_negative_numbers = true)]
    pub value_discretization: Option<f64>,
}

/// `dpledger epsilon`: epsilon of T steps.
#[derive(Debug, Args)]
pub struct EpsilonCmd {
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub orders: OrdersArg,
    /// RDP to (epsilon, delta) conversion (rdp only; default improved).
    #[arg(long, value_enum)]
    pub conversion: Option<ConversionArg>,
    #[command(flatten)]
    pub method: MethodArgs,
}

impl EpsilonCmd {
    /// Run the command.
    pub fn run(&self) -> Result<Rendered, InvalidArgument> {
        let req = EpsilonRequest {
            sampling_rate: self.run.sampling_rate,
            noise_multiplier: self.run.noise_multiplier,
            steps: self.run.steps,
            delta: self.run.delta,
            orders: self.orders.parse()?,
            conversion: self.conversion.map(Into::into),
            method: Some(self.method.method),
            value_discretization: self.method.value_discretization,
        };
        let out = req.compute().map_err(flag_names)?;
        let how = match out.order {
            Some(o) => format!("{}, optimal order {o}", method_name(out.method.as_str())),
            None => method_name(out.method.as_str()),
        };
        let text = format!(
            "epsilon = {} at delta = {} by {how} after {} steps, q = {}, sigma = {}\n",
            fmt_opt(out.epsilon),
            out.delta,
            self.run.steps,
            self.run.sampling_rate,
            self.run.noise_multiplier
        );
        Ok((json(&out), text))
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
    #[command(flatten)]
    pub method: MethodArgs,
}

impl NoiseCmd {
    /// Run the command.
    pub fn run(&self) -> Result<Rendered, InvalidArgument> {
        let req = NoiseRequest {
            target_epsilon: self.target_epsilon,
            delta: self.delta,
            sampling_rate: self.sampling_rate,
            steps: self.steps,
            orders: self.orders.parse()?,
            method: Some(self.method.method),
            value_discretization: self.method.value_discretization,
        };
        let out = req.compute().map_err(flag_names)?;
        let mut text = format!(
            "noise multiplier {} reaches epsilon <= {} at delta = {} by {} (q = {}, {} steps)\n",
            out.noise_multiplier,
            self.target_epsilon,
            self.delta,
            method_name(out.method.as_str()),
            self.sampling_rate,
            self.steps,
        );
        if let (Some(rdp), Some(saving)) = (out.rdp_noise_multiplier, out.noise_saving) {
            text.push_str(&format!(
                "RDP needs noise multiplier {rdp} for the same target: PLD needs {:.2}% less noise\n",
                100.0 * saving
            ));
        }
        Ok((json(&out), text))
    }
}

/// `dpledger compare`: several accountants side by side.
#[derive(Debug, Args)]
pub struct CompareCmd {
    #[command(flatten)]
    pub run: RunArgs,
}

impl CompareCmd {
    /// Run the command.
    pub fn run(&self) -> Result<Rendered, InvalidArgument> {
        let req = CompareRequest {
            sampling_rate: self.run.sampling_rate,
            noise_multiplier: self.run.noise_multiplier,
            steps: self.run.steps,
            delta: self.run.delta,
        };
        let out = req.compute().map_err(flag_names)?;
        let mut text = format!(
            "q = {}, sigma = {}, {} steps, delta = {} (pld: the tightest, dpledger's default; rdp: per-example ledgers)\n{:<26} {:>14}  {:<10} {}\n",
            self.run.sampling_rate,
            self.run.noise_multiplier,
            self.run.steps,
            self.run.delta,
            "method",
            "epsilon",
            "guarantee",
            "how"
        );
        for r in &out.rows {
            let eps = r
                .epsilon
                .map_or_else(|| "n/a".into(), |e| format!("{e:.6}"));
            let g = if r.guarantee { "yes" } else { "ESTIMATE" };
            text.push_str(&format!(
                "{:<26} {:>14}  {:<10} {}\n",
                r.method, eps, g, r.description
            ));
        }
        Ok((json(&out), text))
    }
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
    pub batching: Option<BatchingKind>,
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

impl ScheduleCmd {
    /// Run the command.
    pub fn run(&self) -> Result<Rendered, InvalidArgument> {
        let req = ScheduleRequest {
            kind: self.kind,
            sigma0: self.sigma0,
            decay: self.decay,
            period: self.period,
            sigma_end: self.sigma_end,
            batching: self.batching,
            sampling_rate: self.sampling_rate,
            steps_per_epoch: self.steps_per_epoch,
            budget_epsilon: self.budget_epsilon,
            delta: self.delta,
            budget_rho: self.budget_rho,
            max_epochs: Some(self.max_epochs),
        };
        let out = req.compute().map_err(flag_names)?;
        let mut text = format!("{:>6} {:>12} {:>14}\n", "epoch", "sigma", out.unit);
        for e in &out.epochs {
            let mark = if e.within_budget {
                ""
            } else {
                "  <- over budget"
            };
            text.push_str(&format!(
                "{:>6} {:>12.6} {:>14}{mark}\n",
                e.epoch,
                e.sigma,
                fmt_opt(e.spent)
            ));
        }
        match out.stop_epoch {
            Some(t) => text.push_str(&format!(
                "training must stop before epoch {t} ({t} epochs fit the budget)\n"
            )),
            None => text.push_str(&format!("all {} epochs fit the budget\n", self.max_epochs)),
        }
        Ok((json(&out), text))
    }
}

//! Offline replay of a JSON-lines trace. The format is fixed
//! (other tools write it):
//!
//! ```text
//! {"dataset": {"examples": n, "max_grad_norm": C, "rounding": r, "noise_multiplier": s,
//!              "sampling_rate": q, "orders": [...]}}          <- line 1; orders optional;
//!   optional "thresholds": "predictable" | "sampled" (absent: sampled, as
//!   traces written before the choice existed), "refresh": {"full_every": E,
//!   "block": m}, "planned_steps": T, "ex_post": {"orders": [...], "weights": [...]}
//! {"step": t, "ids": [...], "norms": [...]}                    <- optional "noise_multiplier",
//!                                                                 "sampling_rate" overrides
//! {"refresh": {"ids": [...], "norms": [...]}}
//! ```
//!
//! Steps are numbered from 0 and follow the ledger's protocol (in order; an identical
//! repeated line is a retry and changes nothing). Blank lines are ignored. Errors name
//! the 1-based line and what was wrong. A replay is how a ledger is recovered, so it
//! is built for throughput: one reused line buffer, no per-step copies, and JSON
//! parsing on the calling thread overlapped with the ledger's work on a worker.

use super::bounds::{combine_worst_case, pld_worst_case, WorstCaseBounds};
use super::config::{Clipping, DatasetConfig, ExPostOrders, Sampling, ThresholdMode};
use super::dataset::Ledger;
use super::protocol::StepReport;
use super::protocol::{Bound, PrivacyPart};
use super::refresh_schedule::RefreshSchedule;
use crate::accounting::conversion::Conversion;
use crate::accounting::{trace_line, validate};
use crate::ledger::config::DatasetConfigExt;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::BufRead;

/// A replay failure: the trace line (1-based; 0 when the arguments were wrong) and
/// what was wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", if *.line == 0 { message.clone() } else { format!("line {}: {}", line, message) })]
pub struct ReplayError {
    /// The 1-based line of the trace, or 0 for an error in the arguments.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

impl ReplayError {
    fn at(line: usize, message: impl Into<String>) -> Self {
        Self {
            line,
            message: message.into(),
        }
    }
}

/// One example's result, as the server serves it (spec §8).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplayExample {
    /// The example.
    pub id: u64,
    /// Its guarantee's epsilon at the replay's delta, as served.
    pub epsilon: f64,
    /// The bound that gave `epsilon`.
    pub bound: Bound,
    /// The guarantee (worst case, or the individual filter's), as served.
    pub guarantee: PrivacyPart,
    /// The ex-post bound (predictable mode only), as served.
    pub ex_post: Option<PrivacyPart>,
    /// The estimate, as served.
    pub estimate: PrivacyPart,
    /// The ledger's epsilon (`estimate.epsilon`).
    pub rdp_epsilon: f64,
    /// The optimal order of `rdp_epsilon`.
    pub order: f64,
}

/// The result of a replay. Serialises to
/// `{"worst_case": {"epsilon", "method", "steps", "pld", "rdp": {"epsilon", "order", ...}},
/// "examples": [{"id", "epsilon", "bound", "guarantee", "ex_post", "estimate", "rdp_epsilon", "order"}, ...]}`
/// with examples sorted by id (the served shapes); the other fields feed
/// [`ReplayReport::to_text`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The data-independent accountants (PLD and RDP), computed as the server does.
    pub worst_case: WorstCaseBounds,
    /// Every example, by id.
    pub examples: Vec<ReplayExample>,
    /// Steps replayed.
    #[serde(skip)]
    pub steps: u64,
    /// The delta of every epsilon.
    #[serde(skip)]
    pub delta: f64,
    /// The conversion used.
    #[serde(skip)]
    pub conversion: Conversion,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceDataset {
    examples: u64,
    max_grad_norm: f64,
    #[serde(default)]
    rounding: Option<f64>,
    noise_multiplier: f64,
    sampling_rate: f64,
    #[serde(default)]
    orders: Option<Vec<f64>>,
    /// The threshold protocol (absent: the old, sampled one, as every trace
    /// written before there was a choice).
    #[serde(default)]
    thresholds: Option<ThresholdMode>,
    /// The predictable mode's public refresh schedule.
    #[serde(default)]
    refresh: Option<RefreshSchedule>,
    /// The planned steps (they choose the default ex-post orders).
    #[serde(default)]
    planned_steps: Option<u64>,
    /// The ex-post bound's orders and weights as the dataset recorded them.
    #[serde(default)]
    ex_post: Option<ExPostOrders>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceRefresh {
    ids: Vec<u64>,
    norms: Vec<f64>,
}

/// Any line; which fields are present decides what it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    #[serde(default)]
    dataset: Option<TraceDataset>,
    #[serde(default)]
    step: Option<u64>,
    #[serde(default)]
    ids: Option<Vec<u64>>,
    #[serde(default)]
    norms: Option<Vec<f64>>,
    #[serde(default)]
    noise_multiplier: Option<f64>,
    #[serde(default)]
    sampling_rate: Option<f64>,
    #[serde(default)]
    refresh: Option<TraceRefresh>,
}

/// Replay the trace in `reader` and report every example's epsilon and the worst
/// case at `delta` with `conversion`.
pub fn replay<R: BufRead>(
    mut reader: R,
    delta: f64,
    conversion: Conversion,
) -> Result<ReplayReport, ReplayError> {
    validate::delta("delta", delta).map_err(|e| ReplayError::at(0, e.to_string()))?;
    let mut lines = TraceReader {
        reader: &mut reader,
        buf: String::new(),
        line_no: 0,
    };
    let Some(first) = lines.next_line() else {
        return Err(ReplayError::at(
            lines.line_no.saturating_sub(1).max(1),
            "the trace is empty: its first line must be {\"dataset\": {...}}",
        ));
    };
    let (line_no, first) = first?;
    let ledger = start(first, line_no, delta)?;
    // Parsing JSON and applying steps cost about the same: overlap them. This thread
    // keeps the reader (which need not be `Send`) and parses; a worker owns the
    // ledger and applies lines in order.
    let ledger = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, TraceLine)>(PIPELINE_DEPTH);
        let worker = scope.spawn(move || -> Result<Ledger, ReplayError> {
            let mut ledger = ledger;
            for (line_no, line) in rx {
                apply_line(&mut ledger, line, line_no)?;
            }
            Ok(ledger)
        });
        let mut parse_error = None;
        while let Some(next) = lines.next_line() {
            match next {
                Ok(parsed) => {
                    if tx.send(parsed).is_err() {
                        break; // the worker stopped at an error
                    }
                }
                Err(e) => {
                    parse_error = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        // An error the worker met comes from an earlier line than a parse error.
        let ledger = worker
            .join()
            .map_err(|_| ReplayError::at(0, "the replay worker failed unexpectedly"))??;
        match parse_error {
            Some(e) => Err(e),
            None => Ok(ledger),
        }
    })?;
    let rdp_worst = ledger
        .worst_case(delta, conversion)
        .map_err(|e| ReplayError::at(0, e.to_string()))?;
    let pld = match ledger.pld_events() {
        Some(events) => pld_worst_case(&events, delta),
        None => Err("a release without a PLD description was charged".to_string()),
    };
    let worst = combine_worst_case(rdp_worst, pld);
    let pld_epsilon = worst.pld.map(|p| p.epsilon);
    let examples = (0..ledger.examples())
        .map(|id| {
            let p = ledger
                .privacy(id, delta, conversion)
                .map_err(|e| ReplayError::at(0, e.to_string()))?
                .bounded_by(pld_epsilon);
            Ok(ReplayExample {
                id,
                epsilon: p.epsilon,
                bound: p.bound,
                guarantee: p.guarantee,
                ex_post: p.ex_post,
                estimate: p.estimate,
                rdp_epsilon: p.rdp_epsilon,
                order: p.order,
            })
        })
        .collect::<Result<_, ReplayError>>()?;
    Ok(ReplayReport {
        worst_case: worst,
        examples,
        steps: ledger.next_step(),
        delta,
        conversion,
    })
}

/// Parsed lines in flight between the parsing thread and the applying worker.
const PIPELINE_DEPTH: usize = 64;

/// Reads and parses the trace one non-blank line at a time, counting lines.
struct TraceReader<'a, R: BufRead> {
    reader: &'a mut R,
    buf: String,
    line_no: usize,
}

impl<R: BufRead> TraceReader<'_, R> {
    /// The next non-blank line with its 1-based number, `None` at the end.
    fn next_line(&mut self) -> Option<Result<(usize, TraceLine), ReplayError>> {
        loop {
            self.buf.clear();
            self.line_no += 1;
            let line_no = self.line_no;
            match self.reader.read_line(&mut self.buf) {
                Err(e) => {
                    return Some(Err(ReplayError::at(
                        line_no,
                        format!("cannot read the trace: {e}"),
                    )))
                }
                Ok(0) => return None,
                Ok(_) if self.buf.trim().is_empty() => continue,
                Ok(_) => {
                    return Some(
                        trace_line::parse(&self.buf)
                            .map(|line| (line_no, line))
                            .map_err(|e| ReplayError::at(line_no, e)),
                    )
                }
            }
        }
    }
}

/// The ledger described by the first line.
fn start(line: TraceLine, line_no: usize, delta: f64) -> Result<Ledger, ReplayError> {
    let other_fields = line.step.is_some()
        || line.ids.is_some()
        || line.norms.is_some()
        || line.noise_multiplier.is_some()
        || line.sampling_rate.is_some()
        || line.refresh.is_some();
    let Some(d) = line.dataset.filter(|_| !other_fields) else {
        return Err(ReplayError::at(
            line_no,
            "the first line must be {\"dataset\": {...}} and nothing else",
        ));
    };
    let config = DatasetConfig {
        examples: d.examples,
        max_grad_norm: d.max_grad_norm,
        rounding: d.rounding,
        noise_multiplier: d.noise_multiplier,
        sampling: Sampling::Poisson {
            rate: d.sampling_rate,
        },
        orders: d.orders,
        delta,
        clipping: Clipping::PerExample,
        individual_budget: None,
        label_budgets: None,
        thresholds: d.thresholds,
        refresh: d.refresh,
        planned_steps: d.planned_steps,
        ex_post: d.ex_post,
    };
    // A trace that names its protocol gets the creation defaults a dataset
    // would (the ex-post orders); one that does not replays as sampled.
    let config = if config.thresholds.is_some() {
        config
            .with_creation_defaults()
            .map_err(|e| ReplayError::at(line_no, format!("dataset: {e}")))?
    } else {
        config
    };
    Ledger::new(config).map_err(|e| ReplayError::at(line_no, format!("dataset: {e}")))
}

/// Apply one step or refresh line.
fn apply_line(ledger: &mut Ledger, line: TraceLine, line_no: usize) -> Result<(), ReplayError> {
    if line.dataset.is_some() {
        return Err(ReplayError::at(
            line_no,
            "only the first line may be a dataset line",
        ));
    }
    if let Some(refresh) = line.refresh {
        let stray = line.step.is_some()
            || line.ids.is_some()
            || line.norms.is_some()
            || line.noise_multiplier.is_some()
            || line.sampling_rate.is_some();
        if stray {
            return Err(ReplayError::at(
                line_no,
                "a refresh line holds only {\"refresh\": {\"ids\": [...], \"norms\": [...]}}",
            ));
        }
        ledger
            .refresh(&refresh.ids, &refresh.norms)
            .map_err(|e| ReplayError::at(line_no, format!("refresh: {e}")))?;
        return Ok(());
    }
    let Some(step) = line.step else {
        return Err(ReplayError::at(
            line_no,
            "expected a step line {\"step\": t, \"ids\": [...], \"norms\": [...]} or a refresh line",
        ));
    };
    let (Some(ids), Some(norms)) = (line.ids, line.norms) else {
        return Err(ReplayError::at(
            line_no,
            format!("step {step}: missing \"ids\" or \"norms\""),
        ));
    };
    let report = StepReport {
        step,
        ids,
        norms,
        noise_multiplier: line.noise_multiplier,
        sampling_rate: line.sampling_rate,
        part: None,
    };
    ledger
        .step(&report)
        .map_err(|e| ReplayError::at(line_no, format!("step {step}: {e}")))?;
    Ok(())
}

impl ReplayReport {
    /// A human-readable summary: the worst case, quantiles of the per-example
    /// epsilons, and the share of examples at the worst case.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let conversion = match self.conversion {
            Conversion::Improved => "improved",
            Conversion::Classic => "classic",
        };
        let _ = writeln!(
            out,
            "replayed {} steps over {} examples (delta = {:e}, {conversion} conversion)",
            self.steps,
            self.examples.len(),
            self.delta
        );
        let w = &self.worst_case;
        match w.pld {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "worst case (data-independent): epsilon = {:.6} by PLD",
                    p.epsilon
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "worst case (data-independent): no PLD ({})",
                    w.pld_error.as_deref().unwrap_or("unavailable")
                );
            }
        }
        let _ = writeln!(
            out,
            "worst case (data-independent): epsilon = {:.6} by RDP at order {}",
            w.rdp.epsilon, w.rdp.order
        );
        let ex_post = self.examples.iter().any(|e| e.ex_post.is_some());
        let _ = writeln!(
            out,
            "per-example value: {}, capped at the worst case (each example's guarantee \
             is the worst case, or its individual budget; see --json)",
            if ex_post {
                "the ex-post bound (this run, probability 1 - delta)"
            } else {
                "the estimate (thresholds not predictable: no proven per-example statement)"
            }
        );
        if self.examples.is_empty() {
            return out;
        }
        let cap = self.worst_case.epsilon;
        let mut eps: Vec<f64> = self
            .examples
            .iter()
            .map(|e| super::bounds::released_value(e.ex_post, e.estimate, Some(cap)))
            .collect();
        eps.sort_by(f64::total_cmp);
        let quantile = |p: f64| {
            let rank = ((p * eps.len() as f64).ceil() as usize).clamp(1, eps.len());
            eps[rank - 1]
        };
        let mean = eps.iter().sum::<f64>() / eps.len() as f64;
        let _ = writeln!(out, "per-example value:");
        for (label, p) in [
            ("min", 0.0),
            ("p10", 0.10),
            ("p25", 0.25),
            ("median", 0.50),
            ("p75", 0.75),
            ("p90", 0.90),
            ("p99", 0.99),
            ("max", 1.0),
        ] {
            let _ = writeln!(out, "  {label:<7} {:.6}", quantile(p));
        }
        let _ = writeln!(out, "  {:<7} {:.6}", "mean", mean);
        let at_worst = eps
            .iter()
            .filter(|&&e| e >= self.worst_case.epsilon)
            .count();
        let _ = writeln!(
            out,
            "at the worst case: {at_worst} of {} examples ({:.2}%)",
            eps.len(),
            100.0 * at_worst as f64 / eps.len() as f64
        );
        out
    }
}

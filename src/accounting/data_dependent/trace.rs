//! One run read from the JSON-lines trace that `dpledger replay` reads (format in
//! `crate::ledger::replay`): the dataset line, the step lines (only their number
//! and `(q, sigma)` matter here) and the full-batch refreshes, which are the
//! checkpoints of sensitivities.
//!
//! Step lines' sampled ids and norms are ignored: the analysis needs the
//! sensitivity of *every* example at every step, which only refreshes give.

use super::DataDependentError;
use serde::Deserialize;
use std::io::BufRead;

/// The dataset line of a trace: what must agree across runs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// Number of examples `n` (ids `0..n`).
    pub examples: u64,
    /// Clipping norm `C`.
    pub max_grad_norm: f64,
    /// Rounding precision `r` (default `C/100`).
    #[serde(default)]
    pub rounding: Option<f64>,
    /// Default noise multiplier.
    pub noise_multiplier: f64,
    /// Default Poisson sampling rate.
    pub sampling_rate: f64,
    /// The replay's orders (not used here: the analysis has its own).
    #[serde(default)]
    pub orders: Option<Vec<f64>>,
}

/// A refresh of sensitivities taken before step `before_step` (several refresh
/// lines between the same two steps are one checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct RawCheckpoint {
    /// The first step that uses these norms.
    pub before_step: u64,
    /// `(id, unclipped norm)` pairs as reported.
    pub entries: Vec<(u64, f64)>,
}

/// One parsed run, not yet validated against the others.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTrace {
    /// Its dataset line.
    pub config: TraceConfig,
    /// `(q_t, sigma_t)` of every step, in order.
    pub steps: Vec<(f64, f64)>,
    /// Its checkpoints, in order.
    pub checkpoints: Vec<RawCheckpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Refresh {
    ids: Vec<u64>,
    norms: Vec<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    dataset: Option<TraceConfig>,
    #[serde(default)]
    step: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    ids: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    #[allow(dead_code)]
    norms: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    noise_multiplier: Option<f64>,
    #[serde(default)]
    sampling_rate: Option<f64>,
    #[serde(default)]
    refresh: Option<Refresh>,
}

/// Read run number `run` (used in error messages) from a JSON-lines trace.
///
/// Steps must be numbered 0, 1, 2, ...; a repeated step line is a retry and is
/// ignored, as in a replay. Errors name the 1-based line.
pub fn read_run<R: BufRead>(reader: R, run: usize) -> Result<RunTrace, DataDependentError> {
    let err = |line: usize, message: String| DataDependentError::Trace { run, line, message };
    let mut config: Option<TraceConfig> = None;
    let mut steps: Vec<(f64, f64)> = Vec::new();
    let mut checkpoints: Vec<RawCheckpoint> = Vec::new();
    for (i, text) in reader.lines().enumerate() {
        let line_no = i + 1;
        let text = text.map_err(|e| err(line_no, format!("cannot read the trace: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line =
            crate::accounting::trace_line::parse(&text).map_err(|e| err(line_no, e))?;
        let Some(cfg) = &config else {
            let Some(d) = line.dataset else {
                return Err(err(
                    line_no,
                    "the first line must be {\"dataset\": {...}}".into(),
                ));
            };
            config = Some(d);
            continue;
        };
        if line.dataset.is_some() {
            return Err(err(
                line_no,
                "only the first line may be a dataset line".into(),
            ));
        }
        if let Some(refresh) = line.refresh {
            if refresh.ids.len() != refresh.norms.len() {
                return Err(err(
                    line_no,
                    "refresh: ids and norms differ in length".into(),
                ));
            }
            let before_step = steps.len() as u64;
            let entries = refresh.ids.into_iter().zip(refresh.norms);
            match checkpoints.last_mut() {
                Some(c) if c.before_step == before_step => c.entries.extend(entries),
                _ => checkpoints.push(RawCheckpoint {
                    before_step,
                    entries: entries.collect(),
                }),
            }
            continue;
        }
        let Some(step) = line.step else {
            return Err(err(line_no, "expected a step or a refresh line".into()));
        };
        let next = steps.len() as u64;
        if step + 1 == next {
            continue; // a retry of the step just applied
        }
        if step != next {
            return Err(err(
                line_no,
                format!("step {step} out of order: expected {next}"),
            ));
        }
        steps.push((
            line.sampling_rate.unwrap_or(cfg.sampling_rate),
            line.noise_multiplier.unwrap_or(cfg.noise_multiplier),
        ));
    }
    let config = config.ok_or_else(|| err(1, "the trace is empty".into()))?;
    Ok(RunTrace {
        config,
        steps,
        checkpoints,
    })
}

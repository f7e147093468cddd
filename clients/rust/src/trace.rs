//! A local copy of what a run reported, in the JSON-lines trace format that
//! `dpledger replay --trace FILE --delta D --json` reads, so anyone can recompute
//! every example's epsilon offline and compare it with what the server serves.
//!
//! ```text
//! {"dataset": {"examples": n, "max_grad_norm": C, "rounding": r, "noise_multiplier": s, "sampling_rate": q, "orders": [...],
//!              "thresholds": "predictable", "refresh": {...}, "planned_steps": T, "ex_post": {...}}}
//! {"step": 0, "ids": [...], "norms": [...]}
//! {"refresh": {"ids": [...], "norms": [...]}}
//! ```
//!
//! Norms are written in Rust's shortest round-trip form, so the replay sees the
//! same bits the server charged. Only accepted reports are written. The replay
//! knows no individual budget: a run with one retires examples that the replay
//! does not.

use crate::error::{Error, Result};
use crate::types::{
    DatasetConfig, ExPostOrders, RefreshSchedule, Sampling, StepReport, ThresholdMode,
};
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

#[derive(Serialize)]
struct Header<'a> {
    examples: u64,
    max_grad_norm: f64,
    rounding: f64,
    noise_multiplier: f64,
    sampling_rate: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    orders: Option<&'a Vec<f64>>,
    /// The threshold protocol, schedule, planned steps and ex-post orders as
    /// the server recorded them, so that the replay runs the same protocol
    /// (a trace without them replays as the sampled protocol).
    #[serde(skip_serializing_if = "Option::is_none")]
    thresholds: Option<ThresholdMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refresh: Option<RefreshSchedule>,
    #[serde(skip_serializing_if = "Option::is_none")]
    planned_steps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ex_post: Option<&'a ExPostOrders>,
}

#[derive(Serialize)]
struct HeaderLine<'a> {
    dataset: Header<'a>,
}

#[derive(Serialize)]
struct RefreshBody<'a> {
    ids: &'a [u64],
    norms: &'a [f64],
}

#[derive(Serialize)]
struct RefreshLine<'a> {
    refresh: RefreshBody<'a>,
}

/// Writes a replayable trace, one flushed line per accepted report.
#[derive(Debug)]
pub struct TraceWriter {
    out: BufWriter<File>,
}

impl TraceWriter {
    /// Create (truncate) `path` and write the dataset line. Only Poisson datasets
    /// can be replayed.
    pub fn create(path: &Path, config: &DatasetConfig) -> Result<Self> {
        let Sampling::Poisson { rate } = config.sampling else {
            return Err(Error::InvalidRequest(
                "only Poisson-sampled datasets can be replayed from a trace".into(),
            ));
        };
        let mut writer = TraceWriter {
            out: BufWriter::new(File::create(path)?),
        };
        writer.line(&HeaderLine {
            dataset: Header {
                examples: config.examples,
                max_grad_norm: config.max_grad_norm,
                rounding: config.rounding.unwrap_or(config.max_grad_norm / 100.0),
                noise_multiplier: config.noise_multiplier,
                sampling_rate: rate,
                orders: config.orders.as_ref(),
                thresholds: config.thresholds,
                refresh: config.refresh,
                planned_steps: config.planned_steps,
                ex_post: config.ex_post.as_ref(),
            },
        })?;
        Ok(writer)
    }

    fn line(&mut self, value: &impl Serialize) -> Result<()> {
        serde_json::to_writer(&mut self.out, value).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }

    /// Append an accepted (whole) step report.
    pub fn step(&mut self, report: &StepReport) -> Result<()> {
        if report.part.is_some() {
            return Err(Error::InvalidRequest(
                "a trace holds whole steps, not parts".into(),
            ));
        }
        self.line(report)
    }

    /// Append an accepted refresh.
    pub fn refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<()> {
        self.line(&RefreshLine {
            refresh: RefreshBody { ids, norms },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_replay_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let config = DatasetConfig::poisson(10, 2.0, 1.1, 0.1, 1e-5);
        let mut w = TraceWriter::create(&path, &config).unwrap();
        w.step(&StepReport::new(0, vec![1, 4], vec![0.1 + 0.2, 3.0]))
            .unwrap();
        w.refresh(&[2], &[0.5]).unwrap();
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"dataset": {"examples": 10, "max_grad_norm": 2.0, "rounding": 0.02,
                "noise_multiplier": 1.1, "sampling_rate": 0.1}})
        );
        assert_eq!(lines[1]["step"], 0);
        // Shortest round-trip: the exact bits of 0.1 + 0.2 survive.
        assert_eq!(lines[1]["norms"][0].as_f64().unwrap(), 0.1 + 0.2);
        assert_eq!(
            lines[2],
            serde_json::json!({"refresh": {"ids": [2], "norms": [0.5]}})
        );
    }
}

//! `dpledger loadgen`: load against a real server on loopback, with a baseline
//! measured in the same run so figures are ratios, not absolute claims.
//!
//! * Ingest: `streams` datasets are fed binary step reports of `batch` examples
//!   concurrently (durably stored before acknowledgement). Baseline: the same steps
//!   applied to an in-process ledger (no HTTP, no store).
//! * Queries: `concurrency` threads ask for per-example privacy. Baseline: the same
//!   number of `GET /healthz` requests at the same concurrency (pure HTTP cost).
//! * With `--during-releases`: one stream's step latency while a curator asks
//!   for releases back to back, against the same stream's latency without
//!   them (`release_load.rs`).
//! * With `--dataset`: one phase (ingest, then owner queries) against a
//!   dataset the caller created, e.g. a sharded one, through `--nodes` in turn
//!   (`loadgen_phase.rs`; `scripts/bench-shards` alternates such phases).

use crate::ledger::{DatasetConfig, Ledger, StepReport};
use crate::store::codec::StepPayload;
use anyhow::Context;
use clap::Args;
use serde_json::json;
use std::time::{Duration, Instant};

/// `dpledger loadgen`.
#[derive(Debug, Args)]
pub struct LoadgenCmd {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// An admin token (datasets are created for the run).
    #[arg(long, env = "DPLEDGER_TOKEN")]
    pub token: String,
    /// Examples per dataset.
    #[arg(long, default_value_t = 1_000_000)]
    pub examples: u64,
    /// The datasets' rounding `r` (grid of `ceil(1 / r)` levels, `C = 1`);
    /// default: the configuration's default.
    #[arg(long)]
    pub rounding: Option<f64>,
    /// Reported norms per step.
    #[arg(long, default_value_t = 4096)]
    pub batch: usize,
    /// Steps per stream.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Concurrent ingest streams (one dataset each).
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Concurrent query threads.
    #[arg(long, default_value_t = 64)]
    pub concurrency: u32,
    /// Total privacy queries.
    #[arg(long, default_value_t = 20_000)]
    pub queries: u64,
    /// The privacy query's `method` (`guarantee`, or `pld_estimate` for the
    /// per-example PLD estimate); default: none sent.
    #[arg(long)]
    pub query_method: Option<String>,
    /// Instead of the above: step latency of one stream while releases of the
    /// dataset run back to back, against the same without releases.
    #[arg(long)]
    pub during_releases: bool,
    /// Instead of the above: one phase against this existing dataset (sharded
    /// or not): `--steps` steps from `--first-step`, then `--queries` owner
    /// queries; no dataset is created and no baseline measured.
    #[arg(long)]
    pub dataset: Option<String>,
    /// With `--dataset`: the number of the first step sent.
    #[arg(long, default_value_t = 0)]
    pub first_step: u64,
    /// With `--dataset`: the nodes that steps and queries go to in turn
    /// (comma-separated base URLs; default `--url`).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// With `--dataset`: a server data directory whose secret mints an owner
    /// token for each queried example (default: the admin token asks).
    #[arg(long)]
    pub owner_tokens_from: Option<std::path::PathBuf>,
    /// With `--dataset` of a sharded dataset: send each shard's part of a step
    /// straight to the shard's owner, the parts in parallel (what a client
    /// that splits does), instead of whole reports through `--nodes`.
    #[arg(long)]
    pub split: bool,
}

pub(super) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .max_idle_connections_per_host(256)
        .build()
}

/// xorshift: a tiny deterministic generator, enough for synthetic batches.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub(super) fn batch(rng: &mut Rng, n: u64, size: usize, step: u64) -> StepReport {
    let mut ids: Vec<u64> = Vec::with_capacity(size);
    let mut seen = std::collections::HashSet::with_capacity(size);
    while ids.len() < size.min(n as usize) {
        let id = rng.next() % n;
        if seen.insert(id) {
            ids.push(id);
        }
    }
    let norms = ids
        .iter()
        .map(|_| (rng.next() % 1500) as f64 / 1000.0)
        .collect();
    StepReport::new(step, ids, norms)
}

/// Steps `range` of a stream as encoded step reports (encoded up front, so
/// that the client's own cost is not measured).
pub(super) fn encoded_steps(
    rng: &mut Rng,
    examples: u64,
    size: usize,
    range: std::ops::Range<u64>,
) -> Vec<Vec<u8>> {
    range
        .map(|t| {
            let r = batch(rng, examples, size, t);
            StepPayload {
                step: t,
                part: None,
                noise_multiplier: None,
                sampling_rate: None,
                ids: r.ids,
                norms: r.norms,
            }
            .encode()
        })
        .collect()
}

pub(super) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e3
}

/// `total` requests over `threads` threads (request `i` of thread `k` is
/// number `k * per + i`): their latencies, sorted, and the wall time.
pub(super) fn latencies(
    threads: u32,
    total: u64,
    request: impl Fn(u64) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<(Vec<Duration>, f64)> {
    let started = Instant::now();
    let per = total / threads as u64;
    let mut all = std::thread::scope(|scope| -> anyhow::Result<Vec<Duration>> {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let request = &request;
                scope.spawn(move || -> anyhow::Result<Vec<Duration>> {
                    let mut out = Vec::with_capacity(per as usize);
                    for i in 0..per {
                        let t = Instant::now();
                        request(k as u64 * per + i)?;
                        out.push(t.elapsed());
                    }
                    Ok(out)
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("query thread panicked"))??,
            );
        }
        Ok(all)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    all.sort();
    Ok((all, seconds))
}

impl LoadgenCmd {
    /// Run the load and return a text report (and JSON figures).
    pub fn run(&self) -> anyhow::Result<(serde_json::Value, String)> {
        let mut config = json!({
            "examples": self.examples, "max_grad_norm": 1.0, "noise_multiplier": 1.0,
            "sampling": {"kind": "poisson", "rate": self.batch as f64 / self.examples as f64}, "delta": 1e-6,
        });
        if let Some(r) = self.rounding {
            config["rounding"] = json!(r);
        }
        let run_id = std::process::id();
        let names: Vec<String> = (0..self.streams)
            .map(|k| format!("loadgen-{run_id}-{k}"))
            .collect();
        let auth = format!("Bearer {}", self.token);
        for name in &names {
            agent()
                .post(&format!("{}/v1/datasets", self.url))
                .set("Authorization", &auth)
                .send_json(json!({"id": name, "config": config}))
                .with_context(|| format!("creating dataset {name}"))?;
        }
        // Pre-encode every step so the client's own cost is not measured.
        let bodies: Vec<Vec<Vec<u8>>> = (0..self.streams)
            .map(|k| {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (k as u64 + 1));
                encoded_steps(&mut rng, self.examples, self.batch, 0..self.steps)
            })
            .collect();
        let started = Instant::now();
        std::thread::scope(|scope| -> anyhow::Result<()> {
            let handles: Vec<_> = names
                .iter()
                .zip(&bodies)
                .map(|(name, steps)| {
                    let (url, auth) = (
                        format!("{}/v1/datasets/{name}/steps", self.url),
                        auth.clone(),
                    );
                    scope.spawn(move || -> anyhow::Result<()> {
                        let agent = agent();
                        for body in steps {
                            agent
                                .post(&url)
                                .set("Authorization", &auth)
                                .set("Content-Type", "application/octet-stream")
                                .send_bytes(body)
                                .map_err(|e| anyhow::anyhow!("step: {e}"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("ingest thread panicked"))??;
            }
            Ok(())
        })?;
        let ingest_seconds = started.elapsed().as_secs_f64();
        let norms = self.streams as u64 * self.steps * self.batch as u64;
        let ingest_rate = norms as f64 / ingest_seconds;
        // Baseline: one stream's steps applied in process, no HTTP and no store.
        let mut ledger = Ledger::new(serde_json::from_value::<DatasetConfig>(config.clone())?)?;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ 1);
        let reports: Vec<StepReport> = (0..self.steps)
            .map(|t| batch(&mut rng, self.examples, self.batch, t))
            .collect();
        let base_started = Instant::now();
        for r in &reports {
            ledger.step(r)?;
        }
        let baseline_rate =
            (self.steps * self.batch as u64) as f64 / base_started.elapsed().as_secs_f64();
        // Queries against the first dataset, then the /healthz baseline.
        let method = self
            .query_method
            .as_deref()
            .map_or(String::new(), |m| format!("?method={m}"));
        let privacy = |i: u64| -> anyhow::Result<()> {
            let id = (i.wrapping_mul(2_654_435_761)) % self.examples;
            agent_cached()
                .get(&format!(
                    "{}/v1/datasets/{}/examples/{id}/privacy{method}",
                    self.url, names[0]
                ))
                .set("Authorization", &auth)
                .call()
                .map_err(|e| anyhow::anyhow!("query: {e}"))?;
            Ok(())
        };
        // The first query alone: on a fresh server, the first of a new grid.
        let first = Instant::now();
        privacy(self.queries)?;
        let first_ms = first.elapsed().as_secs_f64() * 1e3;
        let (query_lat, query_secs) = latencies(self.concurrency, self.queries, privacy)?;
        let health = |_: u64| -> anyhow::Result<()> {
            agent_cached()
                .get(&format!("{}/healthz", self.url))
                .call()
                .map_err(|e| anyhow::anyhow!("healthz: {e}"))?;
            Ok(())
        };
        let (health_lat, health_secs) = latencies(self.concurrency, self.queries, health)?;
        let figures = json!({
            "ingest": {"norms": norms, "seconds": ingest_seconds, "norms_per_second": ingest_rate,
                       "steps_per_second": (self.streams as u64 * self.steps) as f64 / ingest_seconds,
                       "baseline_in_process_norms_per_second": baseline_rate,
                       "ratio_to_baseline": ingest_rate / baseline_rate},
            "queries": {"count": query_lat.len(), "concurrency": self.concurrency,
                        "per_second": query_lat.len() as f64 / query_secs,
                        "p50_ms": percentile(&query_lat, 0.5), "p99_ms": percentile(&query_lat, 0.99),
                        "max_ms": percentile(&query_lat, 1.0), "first_ms": first_ms,
                        "baseline_healthz_p50_ms": percentile(&health_lat, 0.5),
                        "baseline_healthz_p99_ms": percentile(&health_lat, 0.99),
                        "baseline_healthz_per_second": health_lat.len() as f64 / health_secs,
                        "p99_ratio_to_baseline": percentile(&query_lat, 0.99) / percentile(&health_lat, 0.99)},
        });
        let text = format!(
            "ingest: {norms} norms in {ingest_seconds:.2} s over {} streams = {:.0} norms/s durable \
             (in-process ledger baseline {:.0} norms/s; ratio {:.2})\n\
             owner queries at concurrency {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {:.0}/s, \
             first query alone {first_ms:.2} ms \
             (GET /healthz baseline: p50 {:.2} ms, p99 {:.2} ms, {:.0}/s)\n",
            self.streams, ingest_rate, baseline_rate, ingest_rate / baseline_rate, self.concurrency,
            percentile(&query_lat, 0.5), percentile(&query_lat, 0.99), percentile(&query_lat, 1.0),
            query_lat.len() as f64 / query_secs,
            percentile(&health_lat, 0.5), percentile(&health_lat, 0.99), health_lat.len() as f64 / health_secs,
        );
        Ok((figures, text))
    }
}

fn agent_cached() -> ureq::Agent {
    thread_local! {
        static AGENT: ureq::Agent = agent();
    }
    AGENT.with(|a| a.clone())
}

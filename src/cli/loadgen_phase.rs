//! `dpledger loadgen --dataset D`: one measured phase against a dataset the
//! caller created (sharded or not), so that a script can alternate
//! phases of two datasets in one run and report their ratio.
//!
//! * Ingest: one sequential stream of `--steps` binary step reports of
//!   `--batch` norms, numbered from `--first-step`, sent to `--nodes` in turn
//!   (a cluster's nodes: a sharded dataset's coordinating node splits and
//!   forwards, an unsharded one's non-owners forward).
//! * Queries: `--queries` privacy queries of random examples over the whole id
//!   range at `--concurrency`, through the nodes in turn, each with an owner
//!   token of its own example (minted up front from the server secret in
//!   `--owner-tokens-from`; without it, the admin token asks).
//! * With `--split`: each step is split by the shard map and every shard's
//!   part (empty ones included) is sent straight to its owner, the parts in
//!   parallel, as a client that splits does: the coordinating hop's cost is
//!   the difference to a phase without it.
//!
//! No baseline is measured here: the other dataset's phase of the same run is.

use super::loadgen::{agent, batch, encoded_steps, percentile, LoadgenCmd, Rng};
use super::server::owner_token_minter;
use crate::store::codec::StepPayload;
use serde_json::json;
use std::time::{Duration, Instant};

/// The example queried `i`-th (a fixed scramble over the id range).
fn queried(i: u64, examples: u64) -> u64 {
    i.wrapping_mul(2_654_435_761).wrapping_add(0x5bd1_e995) % examples
}

/// A shard's first id, one past its last, and the URL of its steps at its
/// owner, from the dataset view and the cluster map.
fn shard_routes(cmd: &LoadgenCmd, dataset: &str) -> anyhow::Result<Vec<(u64, u64, String)>> {
    let get = |path: &str| -> anyhow::Result<serde_json::Value> {
        Ok(agent()
            .get(&format!("{}{path}", cmd.url.trim_end_matches('/')))
            .set("Authorization", &format!("Bearer {}", cmd.token))
            .call()
            .map_err(|e| anyhow::anyhow!("GET {path}: {e}"))?
            .into_json()?)
    };
    let view = get(&format!("/v1/datasets/{dataset}"))?;
    let map = get("/v1/cluster")?;
    let shards = view["shards"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("--split: {dataset:?} is not sharded"))?;
    shards
        .iter()
        .map(|s| {
            let name = s["dataset"].as_str().unwrap_or_default();
            let owner = map["datasets"]
                .as_array()
                .and_then(|ds| ds.iter().find(|d| d["dataset"] == name))
                .and_then(|d| d["advertise"].as_str())
                .ok_or_else(|| anyhow::anyhow!("--split: no owner of {name:?} in the map"))?;
            let (start, end) = (s["start"].as_u64(), s["end"].as_u64());
            let (Some(start), Some(end)) = (start, end) else {
                anyhow::bail!("--split: shard {name:?} without its range");
            };
            Ok((
                start,
                end,
                format!("{}/v1/datasets/{name}/steps", owner.trim_end_matches('/')),
            ))
        })
        .collect()
}

/// Steps split by shard: for each step, each shard's encoded part (its own
/// ids, empty when none is its own).
fn split_steps(
    cmd: &LoadgenCmd,
    rng: &mut Rng,
    shards: &[(u64, u64, String)],
) -> Vec<Vec<Vec<u8>>> {
    (cmd.first_step..cmd.first_step + cmd.steps)
        .map(|t| {
            let r = batch(rng, cmd.examples, cmd.batch, t);
            shards
                .iter()
                .map(|(start, end, _)| {
                    let (ids, norms): (Vec<u64>, Vec<f64>) = r
                        .ids
                        .iter()
                        .zip(&r.norms)
                        .filter(|(id, _)| (*start..*end).contains(*id))
                        .map(|(id, norm)| (id - start, *norm))
                        .unzip();
                    StepPayload {
                        step: t,
                        part: None,
                        noise_multiplier: None,
                        sampling_rate: None,
                        ids,
                        norms,
                    }
                    .encode()
                })
                .collect()
        })
        .collect()
}

/// Post every step's parts to their shards' owners, the parts of a step in
/// parallel; each step's latency (its slowest part).
fn post_split(
    admin: &str,
    shards: &[(u64, u64, String)],
    steps: &[Vec<Vec<u8>>],
) -> anyhow::Result<Vec<Duration>> {
    let agents: Vec<ureq::Agent> = shards.iter().map(|_| agent()).collect();
    let mut out = Vec::with_capacity(steps.len());
    for parts in steps {
        let t = Instant::now();
        std::thread::scope(|scope| -> anyhow::Result<()> {
            let handles: Vec<_> = parts
                .iter()
                .zip(shards)
                .zip(&agents)
                .map(|((body, (_, _, url)), agent)| {
                    scope.spawn(move || {
                        agent
                            .post(url)
                            .set("Authorization", admin)
                            .set("Content-Type", "application/octet-stream")
                            .send_bytes(body)
                            .map(|_| ())
                            .map_err(|e| anyhow::anyhow!("step part to {url}: {e}"))
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("step thread panicked"))??;
            }
            Ok(())
        })?;
        out.push(t.elapsed());
    }
    Ok(out)
}

/// Run one phase against `dataset`; the figures and a text line.
pub(super) fn run(cmd: &LoadgenCmd, dataset: &str) -> anyhow::Result<(serde_json::Value, String)> {
    let nodes: Vec<&str> = if cmd.nodes.is_empty() {
        vec![cmd.url.as_str()]
    } else {
        cmd.nodes.iter().map(|u| u.trim_end_matches('/')).collect()
    };
    let admin = format!("Bearer {}", cmd.token);
    // Encoded up front (each phase its own batches), so the client's own
    // cost is not measured.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (cmd.first_step + 1));
    let (bodies, split) = if cmd.split {
        let shards = shard_routes(cmd, dataset)?;
        let parts = split_steps(cmd, &mut rng, &shards);
        (Vec::new(), Some((shards, parts)))
    } else {
        let range = cmd.first_step..cmd.first_step + cmd.steps;
        (
            encoded_steps(&mut rng, cmd.examples, cmd.batch, range),
            None,
        )
    };
    let client = agent();
    let mut step_lat = Vec::with_capacity(bodies.len());
    let started = Instant::now();
    if let Some((shards, parts)) = &split {
        step_lat = post_split(&admin, shards, parts)?;
    }
    for (i, body) in bodies.iter().enumerate() {
        let t = Instant::now();
        client
            .post(&format!(
                "{}/v1/datasets/{dataset}/steps",
                nodes[i % nodes.len()]
            ))
            .set("Authorization", &admin)
            .set("Content-Type", "application/octet-stream")
            .send_bytes(body)
            .map_err(|e| anyhow::anyhow!("step {}: {e}", cmd.first_step + i as u64))?;
        step_lat.push(t.elapsed());
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    step_lat.sort();
    let norms = cmd.steps * cmd.batch.min(cmd.examples as usize) as u64;
    // One bearer per query: an owner token of its example, or the admin's.
    let minter = cmd
        .owner_tokens_from
        .as_deref()
        .map(owner_token_minter)
        .transpose()?;
    let bearers: Vec<String> = (0..cmd.queries)
        .map(|i| match &minter {
            Some(mint) => Ok(format!(
                "Bearer {}",
                mint(dataset, queried(i, cmd.examples))?
            )),
            None => Ok(admin.clone()),
        })
        .collect::<anyhow::Result<_>>()?;
    let threads = cmd.concurrency.max(1);
    let client = agent();
    let (query_lat, query_seconds) = super::loadgen::latencies(threads, cmd.queries, |i| {
        let url = format!(
            "{}/v1/datasets/{dataset}/examples/{}/privacy",
            nodes[i as usize % nodes.len()],
            queried(i, cmd.examples)
        );
        client
            .get(&url)
            .set("Authorization", &bearers[i as usize])
            .call()
            .map_err(|e| anyhow::anyhow!("query {url}: {e}"))?;
        Ok(())
    })?;
    let figures = json!({
        "dataset": dataset, "examples": cmd.examples, "nodes": nodes.len(), "split": cmd.split,
        "ingest": {"steps": cmd.steps, "first_step": cmd.first_step, "batch": cmd.batch,
                   "norms": norms, "seconds": ingest_seconds,
                   "norms_per_second": norms as f64 / ingest_seconds,
                   "steps_per_second": cmd.steps as f64 / ingest_seconds,
                   "step_p50_ms": percentile(&step_lat, 0.5),
                   "step_p99_ms": percentile(&step_lat, 0.99)},
        "queries": {"count": query_lat.len(), "concurrency": threads,
                    "owner_tokens": minter.is_some(),
                    "per_second": query_lat.len() as f64 / query_seconds,
                    "p50_ms": percentile(&query_lat, 0.5),
                    "p99_ms": percentile(&query_lat, 0.99),
                    "max_ms": percentile(&query_lat, 1.0)},
    });
    let text = format!(
        "{dataset}: {norms} norms in {ingest_seconds:.2} s = {:.0} norms/s (step p50 {:.2} ms, \
         p99 {:.2} ms); {} owner queries at concurrency {threads}: p50 {:.2} ms, p99 {:.2} ms, \
         {:.0}/s\n",
        norms as f64 / ingest_seconds,
        percentile(&step_lat, 0.5),
        percentile(&step_lat, 0.99),
        query_lat.len(),
        percentile(&query_lat, 0.5),
        percentile(&query_lat, 0.99),
        query_lat.len() as f64 / query_seconds,
    );
    Ok((figures, text))
}

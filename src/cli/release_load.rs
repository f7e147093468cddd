//! `dpledger loadgen --during-releases`: does a release stop steps? One dataset
//! of `--examples` examples takes `--steps` steps of `--batch` norms from one
//! stream, timing each, three times: alone (the baseline); while another client
//! asks for releases (mean and quantiles) of a second dataset of the same size
//! back to back (the same CPU load, no shared lock); and while it asks for
//! releases of the stepped dataset itself. The figures are the latency
//! distributions and the p99 ratios to the baseline (the goal for releases while
//! steps flow: at most 2), with how many releases ran and how long they took. On a machine
//! with few cores the second phase shows how much of the slowdown is only CPU.

use super::loadgen::{agent, encoded_steps, percentile, LoadgenCmd, Rng};
use anyhow::Context;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Post `steps`, returning each one's latency, sorted.
fn timed_steps(url: &str, auth: &str, steps: &[Vec<u8>]) -> anyhow::Result<Vec<Duration>> {
    let agent = agent();
    let mut out = Vec::with_capacity(steps.len());
    for body in steps {
        let t = Instant::now();
        agent
            .post(url)
            .set("Authorization", auth)
            .set("Content-Type", "application/octet-stream")
            .send_bytes(body)
            .map_err(|e| anyhow::anyhow!("step: {e}"))?;
        out.push(t.elapsed());
    }
    out.sort();
    Ok(out)
}

/// Run the comparison and return its figures and a text report.
pub(super) fn run(cmd: &LoadgenCmd) -> anyhow::Result<(serde_json::Value, String)> {
    let name = format!("loadgen-releases-{}", std::process::id());
    let auth = format!("Bearer {}", cmd.token);
    let config = json!({
        "examples": cmd.examples, "max_grad_norm": 1.0, "noise_multiplier": 1.0,
        "sampling": {"kind": "poisson", "rate": cmd.batch as f64 / cmd.examples as f64},
        "delta": 1e-6,
    });
    let other = format!("{name}-other");
    for id in [&name, &other] {
        agent()
            .post(&format!("{}/v1/datasets", cmd.url))
            .set("Authorization", &auth)
            .send_json(json!({"id": id, "config": config, "release_budget": {"rho": 1e9}}))
            .with_context(|| format!("creating dataset {id}"))?;
    }
    let steps_url = |id: &str| format!("{}/v1/datasets/{id}/steps", cmd.url);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // A few untimed steps first, so that every phase starts from a trained
    // ledger (and the other dataset has something to release).
    let warmup = 5;
    let first = encoded_steps(&mut rng, cmd.examples, cmd.batch, 0..warmup);
    timed_steps(&steps_url(&name), &auth, &first)?;
    timed_steps(&steps_url(&other), &auth, &first)?;
    let mut next = warmup;
    let mut phase = |releasing: Option<&str>| -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
        let steps = encoded_steps(&mut rng, cmd.examples, cmd.batch, next..next + cmd.steps);
        next += cmd.steps;
        match releasing {
            None => Ok((timed_steps(&steps_url(&name), &auth, &steps)?, Vec::new())),
            Some(id) => during_releases(cmd, &auth, id, || {
                timed_steps(&steps_url(&name), &auth, &steps)
            }),
        }
    };
    let (alone, _) = phase(None)?;
    let (beside, other_releases) = phase(Some(&other))?;
    let (during, releases) = phase(Some(&name))?;
    let p99 = |d: &[Duration]| percentile(d, 0.99);
    let ratio = p99(&during) / p99(&alone);
    let figures = json!({
        "examples": cmd.examples, "batch": cmd.batch, "steps_per_phase": cmd.steps,
        "steps_alone": {"p50_ms": percentile(&alone, 0.5), "p99_ms": p99(&alone)},
        "steps_beside_releases_of_another_dataset": {"p50_ms": percentile(&beside, 0.5),
            "p99_ms": p99(&beside), "releases": other_releases.len()},
        "steps_during_releases": {"p50_ms": percentile(&during, 0.5), "p99_ms": p99(&during)},
        "releases": {"count": releases.len(), "p50_ms": percentile(&releases, 0.5),
                     "max_ms": percentile(&releases, 1.0)},
        "p99_ratio_to_baseline": ratio,
        "p99_ratio_beside_to_baseline": p99(&beside) / p99(&alone),
        "p99_ratio_to_beside": p99(&during) / p99(&beside),
    });
    let text = format!(
        "steps of {} norms at n = {}, {} per phase:\n\
         alone: p50 {:.2} ms, p99 {:.2} ms\n\
         beside {} releases of another dataset (CPU load only): p50 {:.2} ms, p99 {:.2} ms (p99 ratio {:.2})\n\
         during {} releases of this dataset (each p50 {:.0} ms): p50 {:.2} ms, p99 {:.2} ms (p99 ratio {ratio:.2}; {:.2} of the CPU-only phase)\n",
        cmd.batch,
        cmd.examples,
        cmd.steps,
        percentile(&alone, 0.5),
        p99(&alone),
        other_releases.len(),
        percentile(&beside, 0.5),
        p99(&beside),
        p99(&beside) / p99(&alone),
        releases.len(),
        percentile(&releases, 0.5),
        percentile(&during, 0.5),
        p99(&during),
        p99(&during) / p99(&beside),
    );
    Ok((figures, text))
}

/// Run `steps` while another thread asks for releases of `dataset` back to
/// back; the steps' latencies and the releases' durations, sorted.
fn during_releases(
    cmd: &LoadgenCmd,
    auth: &str,
    dataset: &str,
    steps: impl FnOnce() -> anyhow::Result<Vec<Duration>>,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let stop = AtomicBool::new(false);
    let url = format!("{}/v1/datasets/{dataset}/releases", cmd.url);
    let request = json!({"mean": {"rho": 1e-4},
                         "quantiles": {"rho": 1e-4, "levels": [0.1, 0.5, 0.9]}});
    std::thread::scope(|scope| {
        let releaser = scope.spawn(|| -> anyhow::Result<Vec<Duration>> {
            let agent = agent();
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                agent
                    .post(&url)
                    .set("Authorization", auth)
                    .send_json(request.clone())
                    .map_err(|e| anyhow::anyhow!("release: {e}"))?;
                took.push(t.elapsed());
            }
            took.sort();
            Ok(took)
        });
        // Steps start once the first release is under way.
        std::thread::sleep(Duration::from_millis(50));
        let during = steps();
        stop.store(true, Ordering::Relaxed);
        let releases = releaser
            .join()
            .map_err(|_| anyhow::anyhow!("release thread panicked"))??;
        Ok((during?, releases))
    })
}

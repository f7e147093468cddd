//! The sharded chaos tests' trainer (`cluster_shard_chaos.rs`,
//! `cluster_shard_release_chaos.rs`): a seeded trace of steps, data-parallel
//! parts and keyed refreshes, posted through the nodes in turn and retried
//! until acknowledged, and the rolling restart among the faults.
#![allow(dead_code)]

use crate::cluster::Cluster;
use crate::common::poisson_trace;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The reports of a seeded trace: step `t` whole, except every fifth step,
/// sent in two data-parallel parts (the first half of its ids, then the rest),
/// and before every seventh step a full-batch refresh (`{"refresh": body,
/// "key": its Idempotency-Key}`).
pub fn reports(seed: u64, n: u64, q: f64, steps: u64) -> Vec<Value> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed + 1);
    let mut out = Vec::new();
    for (t, step) in poisson_trace(seed, n, q, steps).into_iter().enumerate() {
        if t % 7 == 6 {
            let norms: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * 1.3).collect();
            out.push(
                json!({"refresh": {"ids": (0..n).collect::<Vec<u64>>(), "norms": norms},
                            "key": format!("refresh-before-{t}"), "step": t}),
            );
        }
        if t % 5 != 4 {
            out.push(step);
            continue;
        }
        let (ids, norms) = (
            step["ids"].as_array().unwrap(),
            step["norms"].as_array().unwrap(),
        );
        let half = ids.len() / 2;
        for (index, range) in [(0, 0..half), (1, half..ids.len())] {
            out.push(
                json!({"step": t, "ids": ids[range.clone()], "norms": norms[range],
                            "part": {"index": index, "count": 2}}),
            );
        }
    }
    out
}

/// What the trainer saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Reports acknowledged: `reports[..acked]`.
    pub acked: usize,
    /// Acknowledgements that said duplicate (a retry of an applied report).
    pub duplicates: u64,
    /// Retryable answers and transport failures, retried.
    pub retried: u64,
    /// Answers no client would retry, or that contradict the report.
    pub failures: Vec<String>,
}

/// Posts `reports` in order, each through the next node (rotating further on
/// each failure), retrying the same report until it is acknowledged: what the
/// clients retry (429, 502, 503, 504, transport failures, a timeout of 2 s);
/// a 500 is recorded as a failure and retried. `stop` is read only between
/// steps, so a step begun is always finished: none is left applied by some
/// shards only.
pub fn train(
    urls: Vec<String>,
    dataset: &str,
    token: &str,
    reports: &[Value],
    stop: &AtomicBool,
) -> Seen {
    let mut seen = Seen::default();
    // A short timeout: a report sent to a paused node is given up on and sent
    // again elsewhere while the first may still be forwarded when the node
    // resumes, so the shards also see stale copies of parts.
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    let mut which = 0usize;
    while seen.acked < reports.len() {
        let report = &reports[seen.acked];
        // A step's second part always follows its first.
        if report["part"]["index"] != 1 && stop.load(Ordering::SeqCst) {
            break;
        }
        let started = Instant::now();
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "report {} never acknowledged: {seen:?}",
                seen.acked
            );
            which += 1;
            let base = &urls[which % urls.len()];
            let answer = match report.get("refresh") {
                Some(refresh) => agent
                    .post(&format!("{base}/v1/datasets/{dataset}/refresh"))
                    .set("Authorization", &format!("Bearer {token}"))
                    .set("Idempotency-Key", report["key"].as_str().unwrap())
                    .send_json(refresh.clone()),
                None => agent
                    .post(&format!("{base}/v1/datasets/{dataset}/steps"))
                    .set("Authorization", &format!("Bearer {token}"))
                    .send_json(report.clone()),
            };
            match answer {
                Ok(r) => {
                    let body: Value = r.into_json().unwrap_or(Value::Null);
                    // A refresh takes effect at the step that follows it.
                    let step = body.get("effective_step").unwrap_or(&body["step"]);
                    if *step != report["step"] {
                        seen.failures
                            .push(format!("report {}: answered {body}", seen.acked));
                    }
                    if body["duplicate"] == true {
                        seen.duplicates += 1;
                    }
                    seen.acked += 1;
                    break;
                }
                Err(ureq::Error::Status(code @ (429 | 500 | 502 | 503 | 504), r)) => {
                    if code == 500 {
                        let body = r.into_string().unwrap_or_default();
                        seen.failures
                            .push(format!("report {}: 500 {body}", seen.acked));
                    }
                    seen.retried += 1;
                }
                Err(ureq::Error::Transport(_)) => seen.retried += 1,
                Err(ureq::Error::Status(code, r)) => {
                    let body = r.into_string().unwrap_or_default();
                    seen.failures
                        .push(format!("report {}: {code} {body}", seen.acked));
                    if seen.failures.len() > 10 {
                        return seen;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    seen
}

/// Restarts every node in turn: SIGTERM (it drains, handing its shards
/// over), start it again, and wait until all three are active before the next.
pub fn rolling_restart(cluster: &mut Cluster) {
    for i in 0..cluster.nodes.len() {
        let drained = cluster.nodes[i].terminate(Duration::from_secs(30));
        assert!(drained, "node {i} did not drain on SIGTERM");
        cluster.restart(i);
        cluster.wait_active(cluster.nodes.len());
    }
}

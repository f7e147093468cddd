//! Releases of a sharded dataset under chaos: 4 shards on three
//! nodes (1 s leases), the sharded chaos test's trainer posting a seeded
//! trace (data-parallel parts, keyed refreshes) through the nodes in turn,
//! and a curator making releases (population, quantiles, per group) and
//! raising the release budget, each request with an `Idempotency-Key` and
//! retried with it through the next node until it is answered for good, while
//! the test SIGKILLs and restarts nodes, SIGSTOPs one past its lease, and
//! restarts every node in turn. Afterwards:
//!
//! * every shard's log holds the same release and budget records (byte for
//!   byte: ids, steps, values), numbered 1, 2, … without a gap, and every
//!   shard's book says the same (no shard charged alone);
//! * each acknowledged release is in the logs once, as acknowledged (a lost
//!   answer is found again by its key, never made twice), and a release in
//!   the logs was acknowledged unless an attempt of it went unanswered and its
//!   retry was refused (the unanswered attempt may still run to its end);
//! * every shard logged every acknowledged step part once;
//! * an unsharded dataset fed the same reports, with each release requested
//!   when it reaches the release's step, publishes the same values (the
//!   test-only release seed makes the noise a function of the step, so the
//!   values are equal only if every shard's view was at that step), and
//!   answers every example's privacy, the thresholds, the worst case and the
//!   budget the same.
//!
//! Sized for CI (4 faults); `DPLEDGER_CHAOS_FAULTS=30` runs a long version.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/shard_chaos.rs"]
mod shard_chaos;

use cluster::*;
use common::*;
use serde_json::{json, Value};
use shard_chaos::{reports, rolling_restart, train};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEED: u64 = 2627;

/// Poisson, with an individual budget no example reaches in the run (the
/// filter's checks run, and nothing depends on where a release's charge
/// lands among the steps, so the unsharded reference can be compared exactly).
fn config(n: u64, q: f64) -> Value {
    budgeted_config(n, q, 1000.0)
}

fn labels(n: u64) -> Value {
    let labels: Vec<Value> = (0..n)
        .map(|i| match i % 5 {
            0 => Value::Null,
            1 | 3 => json!("a"),
            _ => json!("b"),
        })
        .collect();
    json!(labels)
}

/// The releases the curator asks for, in turn (on average about what a
/// budget raise adds every three: some are refused as over the budget).
fn release_request(k: usize) -> Value {
    match k % 3 {
        0 => json!({"mean": {"rho": 0.005}}),
        1 => json!({
            "mean": {"rho": 0.005},
            "quantiles": {"rho": 0.005, "levels": [0.1, 0.5, 0.9]},
            "histogram": {"rho": 0.005, "bins": 5}
        }),
        _ => json!({"mean": {"rho": 0.005}, "histogram": {"rho": 0.005, "bins": 4},
                    "by_group": true}),
    }
}

/// What the curator saw.
#[derive(Debug, Default)]
struct Curated {
    /// Acknowledged releases (`release` of each answer).
    releases: Vec<Value>,
    /// Acknowledged budgets, in order.
    budgets: Vec<f64>,
    /// Definite refusals (409: over the budget, nothing to release yet).
    refused: u64,
    /// Of those, refusals of a release retried after an attempt without an
    /// answer: that attempt may still be committed later by its coordinator
    /// (paused before it prepared, it resumes and runs the request to its
    /// end), as any request without an answer may.
    refused_after_retry: u64,
    /// Retryable answers and transport failures, retried with the same key.
    retried: u64,
    /// Answers no client would retry, or that contradict the request.
    failures: Vec<String>,
}

/// Every 50–250 ms a change through the next node: a budget raise every
/// fourth, else a release; each sent with its own `Idempotency-Key` and
/// retried with it (rotating nodes) until answered for good. `stop` is read
/// between changes.
fn curate(urls: Vec<String>, dataset: &str, token: &str, stop: &AtomicBool) -> Curated {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(SEED);
    let mut seen = Curated::default();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(3))
        .build();
    let (mut which, mut budget) = (0usize, 0.0f64);
    for k in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(50..250)));
        let (method, path, body, key) = if k % 4 == 0 {
            budget += 0.03;
            let body = json!({ "rho": budget });
            ("PUT", "release-budget", body, format!("budget-{k}"))
        } else {
            (
                "POST",
                "releases",
                release_request(k),
                format!("release-{k}"),
            )
        };
        let started = Instant::now();
        for attempt in 0.. {
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "change {key} never answered for good: {seen:?}"
            );
            which += 1;
            let url = format!("{}/v1/datasets/{dataset}/{path}", urls[which % urls.len()]);
            let answer = agent
                .request(method, &url)
                .set("Authorization", &format!("Bearer {token}"))
                .set("Idempotency-Key", &key)
                .send_json(body.clone());
            match answer {
                Ok(r) => {
                    let answer: Value = r.into_json().unwrap_or(Value::Null);
                    if method == "PUT" {
                        if answer["rho_budget"] != body["rho"] {
                            seen.failures.push(format!("{key}: answered {answer}"));
                        }
                        seen.budgets.push(budget);
                    } else {
                        seen.releases.push(answer["release"].clone());
                    }
                    break;
                }
                Err(ureq::Error::Status(409, _)) => {
                    seen.refused += 1;
                    seen.refused_after_retry += u64::from(attempt > 0);
                    break;
                }
                Err(ureq::Error::Status(code @ (429 | 500 | 502 | 503 | 504), r)) => {
                    if code == 500 {
                        let body = r.into_string().unwrap_or_default();
                        seen.failures.push(format!("{key}: 500 {body}"));
                    }
                    seen.retried += 1;
                }
                Err(ureq::Error::Transport(_)) => seen.retried += 1,
                Err(ureq::Error::Status(code, r)) => {
                    let body = r.into_string().unwrap_or_default();
                    seen.failures.push(format!("{key}: {code} {body}"));
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    seen
}

/// The payloads of `dataset`'s records of kind `kind`, in log order.
fn payloads(cluster: &Cluster, dataset: &str, kind: i16) -> Vec<Value> {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query(
            "SELECT payload FROM dpledger_events WHERE dataset = $1 AND kind = $2 ORDER BY seq",
            &[&dataset, &kind],
        )
        .unwrap()
        .iter()
        .map(|row| serde_json::from_slice(row.get::<_, &[u8]>(0)).unwrap())
        .collect()
    })
    .join()
    .unwrap()
}

/// The fields of a release that describe it (not its wall-clock time).
fn described(r: &Value) -> Value {
    json!({"id": r["id"], "step": r["step"], "request": r["request"], "delta": r["delta"],
           "bound": r["bound"], "rho": r["rho"], "values": r["values"]})
}

/// `a` and `b` equal but for numbers within a relative 1e-12.
fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn releases_under_faults_are_charged_to_every_shard_once_or_to_none() {
    let faults: usize = std::env::var("DPLEDGER_CHAOS_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let Some(mut cluster) = Cluster::start_with(3, 1000, |_| {
        vec!["--insecure-test-release-seed".into(), "20261126".into()]
    }) else {
        return;
    };
    cluster.wait_active(3);
    let (n, q) = (80u64, 0.2);
    let admin = cluster.admin_token();
    let shards = cluster.create_sharded(
        0,
        &json!({"id": "big", "config": config(n, q), "labels": labels(n), "shards": 4}),
    );
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();

    let all = Arc::new(reports(SEED, n, q, 20_000));
    let stop = Arc::new(AtomicBool::new(false));
    let trainer = {
        let (urls, token) = (urls.clone(), cluster.token("trainer", Some("big"), None));
        let (all, stop) = (all.clone(), stop.clone());
        std::thread::spawn(move || train(urls, "big", &token, &all, &stop))
    };
    let curator = {
        let (urls, token) = (urls.clone(), cluster.token("curator", Some("big"), None));
        let stop = stop.clone();
        std::thread::spawn(move || curate(urls, "big", &token, &stop))
    };
    let started = Instant::now();
    let kinds = cluster.inject_faults(SEED, faults, 300..900, |cluster, _, _| {
        rolling_restart(cluster)
    });
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let seen = trainer.join().unwrap();
    let curated = curator.join().unwrap();
    assert!(seen.failures.is_empty(), "{:?}", seen.failures);
    assert!(curated.failures.is_empty(), "{:?}", curated.failures);
    assert!(
        curated.releases.len() >= 3,
        "too few releases acknowledged to say anything: {curated:?}"
    );
    let acked = &all[..seen.acked];

    // Every shard: the same release and budget records, byte for byte,
    // numbered without a gap; every step part once.
    let logged = payloads(&cluster, &shards[0], 4);
    let budgets = payloads(&cluster, &shards[0], 5);
    let steps: Vec<i64> = acked
        .iter()
        .filter(|r| r.get("refresh").is_none())
        .map(|r| r["step"].as_i64().unwrap())
        .collect();
    for shard in &shards {
        assert_eq!(
            payloads(&cluster, shard, 4),
            logged,
            "{shard}: releases differ"
        );
        assert_eq!(
            payloads(&cluster, shard, 5),
            budgets,
            "{shard}: budgets differ"
        );
        let logged_steps: Vec<i64> = cluster
            .logged_steps(shard)
            .iter()
            .map(|(_, step, _)| *step)
            .collect();
        assert_eq!(logged_steps, steps, "{shard}: a part lost or doubled");
        assert_epochs_monotone(&cluster, shard);
    }
    let ids: Vec<u64> = logged.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=logged.len() as u64).collect::<Vec<_>>());
    assert!(logged
        .windows(2)
        .all(|w| w[0]["step"].as_u64() <= w[1]["step"].as_u64()));
    // Each acknowledged release once, as acknowledged, in order; a release
    // logged but not acknowledged only from an attempt answered by nobody
    // whose retry was refused.
    let logged_releases: Vec<Value> = logged.iter().map(described).collect();
    let mut unacked = logged_releases.iter();
    for acked in curated.releases.iter().map(described) {
        assert!(
            unacked.by_ref().any(|l| *l == acked),
            "acknowledged release not logged (once, in order): {acked}"
        );
    }
    let unacknowledged = logged.len() - curated.releases.len();
    assert!(
        unacknowledged as u64 <= curated.refused_after_retry,
        "{unacknowledged} releases logged without an acknowledgement: {curated:?}"
    );
    let budget_values: Vec<f64> = budgets
        .iter()
        .map(|b| b["rho_budget"].as_f64().unwrap())
        .collect();
    assert_eq!(budget_values, curated.budgets);
    // Every shard's book (served from memory) says the same.
    let book = |shard: &str, path: &str| {
        get_retrying(
            &cluster,
            &format!("/v1/datasets/{shard}{path}"),
            &admin,
            Duration::from_secs(30),
        )
    };
    let first_budget = book(&shards[0], "/release-budget");
    assert_eq!(first_budget["releases"], logged.len());
    let first_list = book(&shards[0], "/releases");
    for shard in &shards[1..] {
        assert_eq!(book(shard, "/release-budget"), first_budget, "{shard}");
        assert_eq!(book(shard, "/releases"), first_list, "{shard}");
    }

    // The reference: one ledger, the same reports, each release requested
    // when the ledger reaches its step (before the refresh that precedes it).
    let plain = post_retrying(
        &format!("{}/v1/datasets", cluster.nodes[1].url),
        &admin,
        &json!({"id": "plain", "config": config(n, q), "labels": labels(n)}),
        Duration::from_secs(30),
    );
    assert_eq!(plain.status, 201, "{:?}", plain.body);
    if let Some(rho) = budget_values.last() {
        let r = put(
            &format!("{}/v1/datasets/plain/release-budget", urls[0]),
            Some(&admin),
            &json!({ "rho": rho }),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let mut from = 0;
    for release in &logged {
        let step = release["step"].as_i64().unwrap();
        let to = from
            + acked[from..]
                .iter()
                .position(|r| r["step"].as_i64().unwrap() >= step)
                .unwrap_or(acked.len() - from);
        let fed = train(
            urls.clone(),
            "plain",
            &admin,
            &acked[from..to],
            &AtomicBool::new(false),
        );
        assert!(fed.failures.is_empty(), "{:?}", fed.failures);
        from = to;
        let r = post(
            &format!("{}/v1/datasets/plain/releases", urls[from % 3]),
            Some(&admin),
            &release["request"],
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        let (got, want) = (described(&r.body["release"]), described(release));
        // A refresh is applied when the ledger reaches the step it precedes,
        // and it rewrites its examples' compact state (the same RDP, rounded
        // anew): a view at that step may see either, a few ulps apart.
        if step % 7 == 6 {
            assert!(
                close(&got, &want),
                "release {}: {got} {want}",
                release["id"]
            );
        } else {
            assert_eq!(got, want, "release {}", release["id"]);
        }
    }
    let fed = train(
        urls.clone(),
        "plain",
        &admin,
        &acked[from..],
        &AtomicBool::new(false),
    );
    assert!(fed.failures.is_empty(), "{:?}", fed.failures);
    let read = |d: &str, path: &str| {
        get_retrying(
            &cluster,
            &format!("/v1/datasets/{d}{path}"),
            &admin,
            Duration::from_secs(30),
        )
    };
    for id in 0..n {
        let path = format!("/examples/{id}/privacy");
        assert_eq!(read("big", &path), read("plain", &path), "example {id}");
    }
    for path in ["/thresholds", "/worst-case", "/release-budget"] {
        assert_eq!(read("big", path), read("plain", path), "{path}");
    }
    eprintln!(
        "{faults} faults (kill {}, pause {}, rolling restart {}) in {:.0?}: {} reports, \
         {} releases and {} budgets acknowledged, {} refused, {} retried (steps {})",
        kinds[0],
        kinds[1],
        kinds[2],
        started.elapsed(),
        seen.acked,
        curated.releases.len(),
        curated.budgets.len(),
        curated.refused,
        curated.retried,
        seen.retried,
    );
}

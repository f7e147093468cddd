//! Chaos over a sharded dataset: a 4-shard dataset on three
//! nodes, one trainer posting a seeded trace (some steps in two data-parallel
//! parts, full-batch refreshes with an `Idempotency-Key` between some steps)
//! through the nodes in turn, every report retried until it is
//! acknowledged (as the clients do), while the test injects faults one after
//! another: SIGKILL then restart, SIGSTOP past the lease then SIGCONT, and a
//! rolling restart (every node in turn gets SIGTERM, drains, and is started
//! again). At the end nothing is lost, doubled, or applied to only part of the
//! shards: every shard logged every part of every acknowledged step and every
//! acknowledged refresh exactly once (epochs never going back), the shards'
//! step counters are equal, and
//! every per-example answer, the thresholds and the worst case are
//! byte-identical to those of an unsharded dataset fed the same acknowledged
//! reports.
//!
//! Sized for CI (4 faults, 1 s leases); `DPLEDGER_CHAOS_FAULTS=30` runs a long
//! version (faults after the first three are drawn at random).

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

/// The dataset's configuration: Poisson, with an individual budget so that
/// the filter retires examples during a long trace.
fn config(n: u64, q: f64) -> Value {
    budgeted_config(n, q, 19.0)
}

#[test]
fn faults_under_a_sharded_dataset_lose_double_and_split_nothing() {
    let faults: usize = std::env::var("DPLEDGER_CHAOS_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let ttl_ms = 1000;
    let Some(mut cluster) = Cluster::start(3, ttl_ms) else {
        return;
    };
    cluster.wait_active(3);
    let (n, q) = (80u64, 0.2);
    let admin = cluster.admin_token();
    let shards = cluster.create_sharded(
        0,
        &json!({"id": "big", "config": config(n, q), "shards": 4}),
    );
    assert_eq!(shards.len(), 4);

    let all = Arc::new(reports(2626, n, q, 20_000));
    let stop = Arc::new(AtomicBool::new(false));
    let trainer = {
        let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();
        let token = cluster.token("trainer", Some("big"), None);
        let (all, stop) = (all.clone(), stop.clone());
        std::thread::spawn(move || train(urls, "big", &token, &all, &stop))
    };

    let started = Instant::now();
    let kinds = cluster.inject_faults(2626, faults, 300..900, |cluster, _, _| {
        rolling_restart(cluster)
    });
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let seen = trainer.join().unwrap();
    assert!(seen.failures.is_empty(), "{:?}", seen.failures);
    let acked = &all[..seen.acked];
    assert!(
        seen.acked > 10,
        "too few reports acknowledged to say anything: {seen:?}"
    );

    // Every shard: every acknowledged part exactly once, in order, epochs
    // never going back, and the same step counter.
    let expected: Vec<i64> = acked
        .iter()
        .filter(|r| r.get("refresh").is_none())
        .map(|r| r["step"].as_i64().unwrap())
        .collect();
    let refreshes = acked.iter().filter(|r| r.get("refresh").is_some()).count() as i64;
    // The trainer stops between steps.
    let steps = expected.last().map_or(0, |t| *t as u64 + 1);
    for shard in &shards {
        let logged: Vec<i64> = cluster
            .logged_steps(shard)
            .iter()
            .map(|(_, step, _)| *step)
            .collect();
        assert_eq!(logged, expected, "{shard}: a part lost or doubled");
        assert_eq!(
            refresh_records(&cluster, shard),
            refreshes,
            "{shard}: a refresh lost or doubled"
        );
        assert_epochs_monotone(&cluster, shard);
    }
    let view = get_retrying(
        &cluster,
        "/v1/datasets/big",
        &admin,
        Duration::from_secs(30),
    );
    let counters: Vec<&Value> = view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["steps"])
        .collect();
    assert!(
        counters.iter().all(|c| **c == steps),
        "shards' step counters apart: {counters:?}, {steps} steps acknowledged"
    );
    assert_eq!(view["status"]["pending"], Value::Null, "{view}");

    // The reference: an unsharded dataset fed the same acknowledged reports
    // (the faults are over).
    let plain = post_retrying(
        &format!("{}/v1/datasets", cluster.nodes[1].url),
        &admin,
        &json!({"id": "plain", "config": config(n, q)}),
        Duration::from_secs(30),
    );
    assert_eq!(plain.status, 201, "{:?}", plain.body);
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();
    let reference = train(urls, "plain", &admin, acked, &AtomicBool::new(false));
    assert!(reference.failures.is_empty(), "{:?}", reference.failures);
    assert_eq!(reference.acked, acked.len());

    let read = |d: &str, path: &str| {
        get_retrying(
            &cluster,
            &format!("/v1/datasets/{d}{path}"),
            &admin,
            Duration::from_secs(30),
        )
    };
    let plain_view = read("plain", "");
    let view = read("big", "");
    for field in [
        "steps",
        "examples",
        "retired",
        "over_budget",
        "guarantee",
        "pending",
    ] {
        assert_eq!(
            view["status"][field], plain_view["status"][field],
            "{field}"
        );
    }
    assert_eq!(view["worst_case"], plain_view["worst_case"]);
    for id in 0..n {
        let path = format!("/examples/{id}/privacy");
        assert_eq!(read("big", &path), read("plain", &path), "example {id}");
    }
    for path in ["/thresholds", "/worst-case", "/worst-case?delta=0.001"] {
        assert_eq!(read("big", path), read("plain", path), "{path}");
    }
    eprintln!(
        "{faults} faults (kill {}, pause {}, rolling restart {}) in {:.0?}: {} reports \
         ({steps} steps) acknowledged, {} retried, {} duplicates, {} retired",
        kinds[0],
        kinds[1],
        kinds[2],
        started.elapsed(),
        seen.acked,
        seen.retried,
        seen.duplicates,
        view["status"]["retired"]
    );
}

/// How many refresh records `dataset`'s log holds.
fn refresh_records(cluster: &Cluster, dataset: &str) -> i64 {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        // Kind 3: RecordKind::Refresh.
        c.query_one(
            "SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = 3",
            &[&dataset],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

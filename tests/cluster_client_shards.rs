//! The Rust client splits a sharded dataset's steps itself: three
//! `dpledger serve --cluster` processes on loopback over the real PostgreSQL,
//! an unsharded dataset and a 4-shard one fed the same seeded trace through
//! the client. Every step's answer (thresholds bit for bit, retirements,
//! `complete`, `duplicate`) is the unsharded one; no node forwards anything
//! while the client reports (each part went straight to its shard's owner);
//! a part that landed before its answer was lost, and a whole report resent
//! after its answer was lost, are applied once; every shard logs every part
//! once. And across a failover: the owner of a shard is SIGKILLed mid-run,
//! the client's per-part retries reach the new owner, every part once.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use dpledger_client::shard::{split, ShardLayout};
use dpledger_client::{Client, Part, RetryPolicy, StepReport};
use serde_json::{json, Value};
use std::time::Duration;

/// A Poisson configuration whose individual budget retires examples.
fn config(n: u64, q: f64) -> Value {
    budgeted_config(n, q, 6.0)
}

fn client(url: &str, token: &str) -> Client {
    Client::builder(url)
        .token(token)
        .retry(RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
        })
        .build()
        .unwrap()
}

fn report(line: &Value) -> StepReport {
    let ids = line["ids"].as_array().unwrap().iter();
    let norms = line["norms"].as_array().unwrap().iter();
    StepReport {
        part: line
            .get("part")
            .map(|p| serde_json::from_value::<Part>(p.clone()).unwrap()),
        ..StepReport::new(
            line["step"].as_u64().unwrap(),
            ids.map(|v| v.as_u64().unwrap()).collect(),
            norms.map(|v| v.as_f64().unwrap()).collect(),
        )
    }
}

/// Forwarded requests of every node, summed.
fn forwarded_by_all(cluster: &Cluster, token: &str) -> f64 {
    cluster.nodes.iter().map(|n| forwarded(&n.url, token)).sum()
}

#[test]
fn the_rust_client_splits_sharded_steps_and_sends_each_part_to_its_owner() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let (n, q, steps) = (60u64, 0.3, 24u64);
    let admin = cluster.admin_token();
    let node = |i: usize| cluster.nodes[i % 3].url.clone();
    for (id, shards) in [("plain", None), ("sharded", Some(4))] {
        let mut body = json!({"id": id, "config": config(n, q)});
        if let Some(k) = shards {
            body["shards"] = json!(k);
        }
        let r = post(&format!("{}/v1/datasets", node(0)), Some(&admin), &body);
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let plain = client(&node(0), &cluster.token("trainer", Some("plain"), None));
    let trainer = cluster.token("trainer", Some("sharded"), None);
    let sharded = client(&node(1), &trainer);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The view, read by another client: the reporting client learns the
    // layout at its first step, from the cluster map (which lists the shards)
    // and one read of the view (a read that fans out to the shards: the only
    // hops of its run).
    let view = runtime
        .block_on(client(&node(2), &trainer).dataset("sharded"))
        .unwrap();
    let layout = ShardLayout::of(&view).expect("a shard map");
    assert_eq!(layout.names.len(), 4);
    let owners: std::collections::BTreeSet<_> = view
        .shards
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| s.owner.clone().unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "shards not spread: {view:?}");

    let mut trace = poisson_trace(11, n, q, steps);
    // One step in two parts (data-parallel workers), each split again.
    let last = trace.pop().unwrap();
    let (ids, norms) = (
        last["ids"].as_array().unwrap(),
        last["norms"].as_array().unwrap(),
    );
    let half = ids.len() / 2;
    for (index, range) in [(0, 0..half), (1, half..ids.len())] {
        trace.push(json!({"step": steps - 1, "ids": ids[range.clone()],
                          "norms": norms[range], "part": {"index": index, "count": 2}}));
    }
    let mut hops = 0.0;
    for (t, line) in trace.iter().enumerate() {
        let step = report(line);
        let a = runtime.block_on(plain.report_step("plain", &step)).unwrap();
        if t == 5 {
            // The answer to shard 1's part of this step was lost: the shard
            // applied it (sent here by hand to its owner), the client did not
            // learn it, and the whole step is sent again. That shard answers
            // its part as a duplicate, the others apply theirs.
            let parts = split(&layout, &step).unwrap();
            let shard = &layout.names[1];
            let body = serde_json::to_value(&parts.parts[1]).unwrap();
            let r = post(
                &format!("{}/v1/datasets/{shard}/steps", node(0)),
                Some(&trainer),
                &body,
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
        }
        let before = forwarded_by_all(&cluster, &admin);
        let b = runtime
            .block_on(sharded.report_step("sharded", &step))
            .unwrap();
        if t > 0 {
            hops += forwarded_by_all(&cluster, &admin) - before;
        }
        assert_eq!(a, b, "step {t}");
        if t % 4 == 1 {
            // The answer to the whole report was lost: sent again, every part
            // is a duplicate with its original answer.
            let again = runtime
                .block_on(sharded.report_step("sharded", &step))
                .unwrap();
            assert!(again.duplicate, "step {t}: {again:?}");
            assert_eq!(again.thresholds, b.thresholds);
            assert_eq!(again.retired, b.retired);
        }
        if t == 7 {
            // A node splits the same report into the same parts: a retry
            // through a node is a duplicate too (and is a forwarded hop).
            let before = forwarded_by_all(&cluster, &admin);
            let r = post(
                &format!("{}/v1/datasets/sharded/steps", node(2)),
                Some(&trainer),
                line,
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
            assert_eq!(r.body["duplicate"], true);
            assert!(forwarded_by_all(&cluster, &admin) - before >= 3.0);
        }
    }
    // Straight to the owners: no node forwarded any part the client sent.
    assert_eq!(hops, 0.0, "requests were forwarded between nodes");
    // The same state: thresholds, and the dataset's status.
    let ta = runtime
        .block_on(plain.thresholds("plain", None, None))
        .unwrap();
    let tb = runtime
        .block_on(sharded.thresholds("sharded", None, None))
        .unwrap();
    assert_eq!(ta, tb);
    let va = runtime.block_on(plain.dataset("plain")).unwrap();
    let vb = runtime.block_on(sharded.dataset("sharded")).unwrap();
    assert_eq!(va.status.steps, steps);
    assert_eq!(va.status.retired, vb.status.retired);
    assert!(va.status.retired > 0, "the trace should retire examples");
    assert_eq!(va.worst_case, vb.worst_case);
    // Every shard logged every part once (the last step in its two parts).
    let mut expected: Vec<i64> = (0..steps as i64).collect();
    expected.push(steps as i64 - 1);
    for shard in &layout.names {
        let logged: Vec<i64> = cluster
            .logged_steps(shard)
            .iter()
            .map(|(_, step, _)| *step)
            .collect();
        assert_eq!(logged, expected, "{shard}");
    }
}

/// Exactly once per part across a failover: the node owning one shard (not
/// the client's base node) is SIGKILLed mid-run; the client's per-part
/// retries carry each part to the shard's new owner, and every shard logs
/// every step once, with the same answers as an unsharded dataset fed the
/// same trace.
#[test]
fn split_steps_ride_out_the_failover_of_a_shard_owner_exactly_once() {
    let Some(mut cluster) = Cluster::start(3, 1000) else {
        return;
    };
    cluster.wait_active(3);
    let (n, q, steps) = (40u64, 0.3, 30u64);
    let admin = cluster.admin_token();
    for (id, shards) in [("plain", None), ("sharded", Some(4))] {
        let mut body = json!({"id": id, "config": config(n, q)});
        if let Some(k) = shards {
            body["shards"] = json!(k);
        }
        let r = post(
            &format!("{}/v1/datasets", cluster.nodes[0].url),
            Some(&admin),
            &body,
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let trainer = cluster.token("trainer", Some("sharded"), None);
    let view = get(
        &format!("{}/v1/datasets/sharded", cluster.nodes[0].url),
        Some(&trainer),
    )
    .body;
    // The victim owns shard 0; the client's base is another node.
    let victim_id = view["shards"][0]["owner"].as_str().unwrap().to_string();
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.id == victim_id)
        .unwrap();
    let base = (victim + 1) % 3;
    let plain = client(
        &cluster.nodes[base].url,
        &cluster.token("trainer", Some("plain"), None),
    );
    let sharded = client(&cluster.nodes[base].url, &trainer);
    let trace = poisson_trace(13, n, q, steps);
    for (t, line) in trace.iter().enumerate() {
        if t == steps as usize / 2 {
            cluster.nodes[victim].kill();
        }
        let step = report(line);
        let a = runtime
            .block_on(plain.report_step("plain", &step))
            .unwrap_or_else(|e| panic!("plain step {t}: {e}"));
        let b = runtime
            .block_on(sharded.report_step("sharded", &step))
            .unwrap_or_else(|e| panic!("sharded step {t}: {e}"));
        assert_eq!(a, b, "step {t}");
    }
    let (owner, _) = cluster.wait_owner("sharded~0", None, Duration::from_secs(20));
    assert_ne!(owner, victim_id, "shard 0 did not move");
    let expected: Vec<i64> = (0..steps as i64).collect();
    let names: Vec<String> = view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["dataset"].as_str().unwrap().to_string())
        .collect();
    for shard in &names {
        let logged: Vec<i64> = cluster
            .logged_steps(shard)
            .iter()
            .map(|(_, step, _)| *step)
            .collect();
        assert_eq!(logged, expected, "{shard}");
    }
    let ta = runtime
        .block_on(plain.thresholds("plain", None, None))
        .unwrap();
    let tb = runtime
        .block_on(sharded.thresholds("sharded", None, None))
        .unwrap();
    assert_eq!(ta, tb);
}

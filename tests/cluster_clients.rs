//! The Rust client against a real cluster, three `dpledger serve
//! --cluster` processes on loopback over the real PostgreSQL: the client, given
//! a node that does not own the dataset, reads `GET /v1/cluster` and sends every
//! step straight to the owner (no node forwards anything); when the owner is
//! SIGKILLed mid-run, the client's own retries carry the run across the failover
//! (connection refused -> map read again -> the new owner), every step is in the
//! log exactly once, and the served values equal `dpledger replay`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use dpledger_client::{Client, RetryPolicy, StepReport};
use std::time::Duration;

/// `dpledger_cluster_forwarded_total` of every running node, summed (a counter
/// never incremented is not exported: 0).
fn forwarded_by_all(cluster: &Cluster, token: &str) -> f64 {
    cluster
        .nodes
        .iter()
        .filter(|n| n.is_up())
        .map(|n| forwarded(&n.url, token))
        .sum()
}

#[test]
fn the_rust_client_goes_to_owners_and_rides_out_a_failover() {
    let Some(mut cluster) = Cluster::start(3, 1000) else {
        return;
    };
    let (n, q, steps) = (60u64, 0.1, 40u64);
    cluster.create(0, "d", n, q);
    let (owner, epoch) = cluster.wait_owner("d", None, Duration::from_secs(20));
    let admin = cluster.admin_token();
    let base = cluster
        .nodes
        .iter()
        .position(|n| n.id != owner)
        .expect("a node that does not own d");
    let owner_i = cluster.nodes.iter().position(|n| n.id == owner).unwrap();
    let trace = poisson_trace(5, n, q, steps);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = Client::builder(cluster.nodes[base].url.as_str())
        .token(admin.as_str())
        .retry(RetryPolicy {
            max_attempts: 40,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
        })
        .build()
        .unwrap();
    let report = |t: usize| {
        let line = &trace[t];
        let ids = line["ids"].as_array().unwrap().iter();
        let norms = line["norms"].as_array().unwrap().iter();
        StepReport::new(
            t as u64,
            ids.map(|v| v.as_u64().unwrap()).collect(),
            norms.map(|v| v.as_f64().unwrap()).collect(),
        )
    };
    for t in 0..steps as usize {
        if t == steps as usize / 2 {
            // Before the failover every step went to the owner directly.
            assert_eq!(
                forwarded_by_all(&cluster, &admin),
                0.0,
                "a node forwarded a step"
            );
            cluster.nodes[owner_i].kill();
        }
        let out = runtime
            .block_on(client.report_step("d", &report(t)))
            .unwrap_or_else(|e| panic!("step {t}: {e}"));
        assert_eq!(out.step, t as u64);
    }
    let view = runtime.block_on(client.cluster()).unwrap();
    let d = view.datasets.iter().find(|d| d.dataset == "d").unwrap();
    assert_ne!(d.owner.as_deref(), Some(owner.as_str()), "{view:?}");
    assert!(d.epoch > epoch, "{view:?}");
    // Every step once, in order.
    let logged: Vec<i64> = cluster.logged_steps("d").iter().map(|r| r.1).collect();
    assert_eq!(logged, (0..steps as i64).collect::<Vec<_>>());
    assert_matches_replay(&cluster, "d", n, q, &trace, steps);
}

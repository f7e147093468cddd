//! Thudi et al.'s data-dependent analysis in a cluster: runs owned by
//! different nodes, asked through every node, give the answer of a single node
//! holding all of them — also while one run's owner is dead and its lease
//! moves — and a caller without rights to one of the runs is refused on every
//! node (the runs a node does not serve are read from the shared log).

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::analysis_runs::{assert_same_numbers, run_requests};
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const N: u64 = 12;
const Q: f64 = 0.25;
const STEPS: u64 = 6;
const RUNS: [&str; 3] = ["r1", "r2", "r3"];

const ANALYSIS: &str = "/v1/analyses/data-dependent?runs=r1,r2,r3&delta=1e-5";
const EXAMPLE3: &str = "/v1/analyses/data-dependent/examples/3?runs=r1,r2,r3&delta=1e-5";

/// What node `url` answers for `path` with `token`: status and body.
fn ask(url: &str, path: &str, token: &str) -> (u16, Value) {
    let r = get(&format!("{url}{path}"), Some(token));
    (r.status, r.body)
}

#[test]
fn any_node_analyses_runs_owned_by_any_nodes_as_one_node_would() {
    let Some(mut cluster) = Cluster::start(3, 2000) else {
        return;
    };
    let bound = Duration::from_secs(30);
    // Placement spreads over the nodes it knows as active: all three first.
    cluster.wait_active(3);
    for run in RUNS {
        cluster.create(0, run, N, Q);
    }
    // Three runs on three nodes settle one on each.
    let counts = cluster.wait_balanced(bound);
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), [1, 1, 1]);
    let owners: Vec<String> = RUNS
        .iter()
        .map(|r| cluster.wait_owner(r, None, bound).0)
        .collect();
    let mut distinct = owners.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{owners:?}");

    // The same runs on one single-mode node.
    let dir = tempfile::tempdir().unwrap();
    let single = Server::start(&dir.path().join("data"), None);
    let single_admin = single.admin_token();
    let admin = cluster.admin_token();
    for (i, run) in RUNS.iter().enumerate() {
        let r = post(
            &format!("{}/v1/datasets", single.url),
            Some(&single_admin),
            &json!({"id": run, "config": poisson_config(N, Q, 1.0)}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        for (k, (what, body)) in run_requests(100 + i as u64, N, Q, STEPS, 2, None)
            .into_iter()
            .enumerate()
        {
            let path = format!("/v1/datasets/{run}/{what}");
            let r = post(&format!("{}{path}", single.url), Some(&single_admin), &body);
            assert_eq!(r.status, 200, "{:?}", r.body);
            // Through the nodes in turn: owners and forwarding non-owners.
            let via = &cluster.nodes[k % 3].url;
            let r = post_retrying(&format!("{via}{path}"), &admin, &body, bound);
            assert_eq!(r.status, 200, "{:?}", r.body);
        }
    }
    let (status, want) = ask(&single.url, ANALYSIS, &single_admin);
    assert_eq!(status, 200, "{want:?}");
    assert_eq!(want["runs"], 3);
    assert_eq!(want["steps"], STEPS);
    assert_eq!(want["examples"].as_array().unwrap().len(), N as usize);
    let single_owner3 = single.token_for("owner", &RUNS, Some("3"));
    let (status, want3) = ask(&single.url, EXAMPLE3, &single_owner3);
    assert_eq!(status, 200, "{want3:?}");

    let curator_all = cluster.token_for("curator", &RUNS, None);
    let curator_two = cluster.token_for("curator", &RUNS[..2], None);
    let owner3 = cluster.token_for("owner", &RUNS, Some("3"));
    let owner3_two = cluster.token_for("owner", &RUNS[..2], Some("3"));
    let trainer_all = cluster.token_for("trainer", &RUNS, None);
    // Every node serves one run and reads the other two from the log.
    for node in &cluster.nodes {
        for token in [&admin, &curator_all] {
            let (status, got) = ask(&node.url, ANALYSIS, token);
            assert_eq!(status, 200, "{}: {got:?}", node.id);
            assert_same_numbers(&got, &want, 1e-12, None, &format!("{} analysis", node.id));
        }
        let (status, got) = ask(&node.url, EXAMPLE3, &owner3);
        assert_eq!(status, 200, "{}: {got:?}", node.id);
        assert_same_numbers(&got, &want3, 1e-12, None, &format!("{} example 3", node.id));
        // Rights are per run: one run without them refuses the whole request.
        for (path, token) in [
            (ANALYSIS, &curator_two),
            (ANALYSIS, &trainer_all),
            (ANALYSIS, &owner3),
            (EXAMPLE3, &owner3_two),
            (
                "/v1/analyses/data-dependent/examples/4?runs=r1,r2,r3&delta=1e-5",
                &owner3,
            ),
        ] {
            let (status, body) = ask(&node.url, path, token);
            assert_eq!(status, 403, "{} {path}: {body:?}", node.id);
        }
        let (status, body) = ask(
            &node.url,
            "/v1/analyses/data-dependent?runs=r1,nope&delta=1e-5",
            &admin,
        );
        assert_eq!(status, 404, "{}: {body:?}", node.id);
        let (status, body) = ask(
            &node.url,
            "/v1/analyses/data-dependent?runs=r1,nope&delta=1e-5",
            &curator_two,
        );
        assert_eq!(status, 403, "{}: {body:?}", node.id);
    }

    // r1's owner dies: the survivors answer the same at once (r1 read from
    // the log while its lease expires and moves) and after the takeover.
    let dead = cluster
        .nodes
        .iter()
        .position(|n| n.id == owners[0])
        .unwrap();
    cluster.nodes[dead].kill();
    for node in cluster.nodes.iter().filter(|n| n.is_up()) {
        let (status, got) = ask(&node.url, ANALYSIS, &admin);
        assert_eq!(status, 200, "{}: {got:?}", node.id);
        assert_same_numbers(
            &got,
            &want,
            1e-12,
            None,
            &format!("{} with r1's owner dead", node.id),
        );
    }
    let (taker, _) = cluster.wait_owner("r1", Some(&owners[0]), bound);
    for node in cluster.nodes.iter().filter(|n| n.is_up()) {
        let (status, got) = ask(&node.url, ANALYSIS, &admin);
        assert_eq!(status, 200, "{}: {got:?}", node.id);
        assert_same_numbers(
            &got,
            &want,
            1e-12,
            None,
            &format!("{} after {taker} took r1", node.id),
        );
    }
}

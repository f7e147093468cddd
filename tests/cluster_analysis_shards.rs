//! Thudi et al.'s data-dependent analysis over sharded runs: the same
//! seeded runs created unsharded, with 4 shards on 3 nodes and with 3 shards
//! give identical analyses (every number, every example) through every node,
//! whatever mix of layouts the runs have; rights are checked per run, on the
//! run's name, before anything is read.

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

/// The analysis of `runs` (comma-separated), or of example `example` of them.
fn path(runs: &str, example: Option<u64>) -> String {
    match example {
        None => format!("/v1/analyses/data-dependent?runs={runs}&delta=1e-5"),
        Some(x) => format!("/v1/analyses/data-dependent/examples/{x}?runs={runs}&delta=1e-5"),
    }
}

fn ask(url: &str, path: &str, token: &str) -> (u16, Value) {
    let r = get(&format!("{url}{path}"), Some(token));
    (r.status, r.body)
}

#[test]
fn sharded_runs_analyse_exactly_like_the_same_runs_unsharded() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let bound = Duration::from_secs(30);
    let admin = cluster.admin_token();
    // Run i's training (seed 100 + i) as u{i} (one ledger), s{i} (4 shards on
    // the 3 nodes) and t{i} (3 shards), each request through the nodes in turn.
    for i in 1..=3u64 {
        for (prefix, shards) in [("u", None), ("s", Some(4)), ("t", Some(3))] {
            let id = format!("{prefix}{i}");
            let mut body = json!({"id": id, "config": poisson_config(N, Q, 1.0)});
            if let Some(k) = shards {
                body["shards"] = json!(k);
            }
            let url = format!("{}/v1/datasets", cluster.nodes[i as usize % 3].url);
            let r = post(&url, Some(&admin), &body);
            assert_eq!(r.status, 201, "{id}: {:?}", r.body);
            if let Some(k) = shards {
                assert_eq!(
                    r.body["shards"].as_array().unwrap().len(),
                    k,
                    "{:?}",
                    r.body
                );
            }
            for (k, (what, body)) in run_requests(100 + i, N, Q, STEPS, 2, None)
                .into_iter()
                .enumerate()
            {
                let via = &cluster.nodes[k % 3].url;
                let url = format!("{via}/v1/datasets/{id}/{what}");
                let r = post_retrying(&url, &admin, &body, bound);
                assert_eq!(r.status, 200, "{id} {what}: {:?}", r.body);
            }
        }
    }

    // The unsharded answer (node 0), then every layout mix through every node.
    let (status, want) = ask(&cluster.nodes[0].url, &path("u1,u2,u3", None), &admin);
    assert_eq!(status, 200, "{want:?}");
    assert_eq!(want["steps"], STEPS);
    assert_eq!(want["examples"].as_array().unwrap().len(), N as usize);
    assert!(want["summary"].is_object(), "{want:?}");
    let owner7 = |runs: &[&str]| cluster.token_for("owner", runs, Some("7"));
    let (status, want7) = ask(
        &cluster.nodes[0].url,
        &path("u1,u2,u3", Some(7)),
        &owner7(&["u1", "u2", "u3"]),
    );
    assert_eq!(status, 200, "{want7:?}");
    assert_eq!(want7["example"]["id"], 7, "{want7:?}");
    let skip: &[&str] = &["datasets"];
    for runs in ["s1,s2,s3", "t1,t2,t3", "s1,u2,t3", "u1,s2,s3"] {
        let names: Vec<&str> = runs.split(',').collect();
        let curator = cluster.token_for("curator", &names, None);
        let owner = owner7(&names);
        for node in &cluster.nodes {
            let at = format!("{} {runs}", node.id);
            let (status, got) = ask(&node.url, &path(runs, None), &curator);
            assert_eq!(status, 200, "{at}: {got:?}");
            assert_eq!(got["datasets"], json!(names), "{at}");
            assert_same_numbers(&got, &want, 0.0, Some(skip), &at);
            let (status, got7) = ask(&node.url, &path(runs, Some(7)), &owner);
            assert_eq!(status, 200, "{at}: {got7:?}");
            assert_same_numbers(&got7, &want7, 0.0, Some(skip), &format!("{at} example 7"));
        }
    }

    // Rights are per run (a token without rights to one run is refused), on
    // every node; an example out of range is 404, as for an unsharded run.
    let curator_two = cluster.token_for("curator", &["s1", "s2"], None);
    let owner7_all = owner7(&["s1", "s2", "s3"]);
    let owner7_two = owner7(&["s1", "s2"]);
    for node in &cluster.nodes {
        for (p, token) in [
            (path("s1,s2,s3", None), &curator_two),
            (path("s1,s2,s3", None), &owner7_all),
            (path("s1,s2,s3", Some(7)), &owner7_two),
            (path("s1,s2,s3", Some(8)), &owner7_all),
        ] {
            let (status, body) = ask(&node.url, &p, token);
            assert_eq!(status, 403, "{} {p}: {body:?}", node.id);
        }
        let (status, body) = ask(&node.url, &path("s1,s2,s3", Some(N)), &admin);
        assert_eq!(status, 404, "{}: {body:?}", node.id);
    }
}

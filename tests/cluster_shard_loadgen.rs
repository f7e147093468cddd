//! `dpledger loadgen --dataset` against a sharded dataset on a real cluster
//! (the sharded measurement of `scripts/bench-shards`): one phase sends its steps
//! through the nodes in turn and asks each privacy query with an owner token
//! of its own example (or, with `--split`, sends each shard's part straight
//! to its owner); every shard applies every step; the nodes count the
//! bodies they send each other (`dpledger_cluster_node_*_bytes_total`, what
//! the script reports as bytes moved between nodes).

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::json;
use std::process::Command;

/// Body bytes node `url` sent to other nodes and read back from them.
fn node_bytes(url: &str, token: &str) -> f64 {
    metric_total(
        url,
        token,
        &[
            "dpledger_cluster_node_request_bytes_total",
            "dpledger_cluster_node_answer_bytes_total",
        ],
    )
}

#[test]
fn loadgen_drives_a_sharded_dataset_through_every_node_with_owner_tokens() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let (n, batch, steps, queries) = (400u64, 32u64, 6u64, 12u64);
    let created = post(
        &format!("{}/v1/datasets", cluster.nodes[0].url),
        Some(&admin),
        &json!({"id": "big", "config": poisson_config(n, batch as f64 / n as f64, 1.0), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let total = |c: &Cluster| -> f64 { c.nodes.iter().map(|x| node_bytes(&x.url, &admin)).sum() };
    let before = total(&cluster);
    let urls: Vec<&str> = cluster.nodes.iter().map(|x| x.url.as_str()).collect();
    let figures = json_output(
        Command::new(binary())
            .args(["loadgen", "--json", "--token", &admin, "--dataset", "big"])
            .args(["--examples", &n.to_string(), "--batch", &batch.to_string()])
            .args(["--steps", &steps.to_string(), "--first-step", "0"])
            .args(["--queries", &queries.to_string(), "--concurrency", "3"])
            .arg("--owner-tokens-from")
            .arg(cluster.data_dir())
            .args(["--nodes", &urls.join(",")]),
    );
    assert_eq!(figures["dataset"], "big", "{figures}");
    assert_eq!(figures["nodes"], 3, "{figures}");
    assert_eq!(figures["ingest"]["norms"], steps * batch, "{figures}");
    assert_eq!(figures["queries"]["count"], queries, "{figures}");
    assert_eq!(figures["queries"]["owner_tokens"], true, "{figures}");
    // Every shard applied every step (empty parts included).
    let view = get(
        &format!("{}/v1/datasets/big", cluster.nodes[2].url),
        Some(&admin),
    );
    assert_eq!(view.status, 200, "{:?}", view.body);
    let shards = view.body["shards"].as_array().expect("shard map");
    assert_eq!(shards.len(), 4, "{shards:?}");
    for shard in shards {
        assert_eq!(shard["steps"], steps, "{shards:?}");
    }
    // The parts for shards on other nodes crossed as binary step parts (8
    // bytes a norm) and came back as JSON answers, and the counters saw them;
    // a node's own shards are called in-process and move nothing.
    let moved = total(&cluster) - before;
    assert!(
        moved >= (steps * batch * 8) as f64,
        "{moved} bytes counted between nodes for {} norms",
        steps * batch
    );
    // A second phase continues the step numbers, each step split by the
    // client and its parts sent straight to the shards' owners.
    let again = json_output(
        Command::new(binary())
            .args(["loadgen", "--json", "--token", &admin, "--dataset", "big"])
            .args(["--examples", &n.to_string(), "--batch", &batch.to_string()])
            .args(["--steps", "2", "--first-step", &steps.to_string()])
            .args(["--queries", "3", "--concurrency", "1"])
            .args(["--url", &cluster.nodes[1].url, "--split"]),
    );
    assert_eq!(again["nodes"], 1, "{again}");
    assert_eq!(again["split"], true, "{again}");
    assert_eq!(again["ingest"]["norms"], 2 * batch, "{again}");
    assert_eq!(again["queries"]["owner_tokens"], false, "{again}");
    let view = get(
        &format!("{}/v1/datasets/big", cluster.nodes[0].url),
        Some(&admin),
    );
    assert_eq!(view.body["status"]["steps"], steps + 2, "{:?}", view.body);
    for shard in view.body["shards"].as_array().expect("shard map") {
        assert_eq!(shard["steps"], steps + 2, "{:?}", view.body);
    }
}

/// A node calls the shards it owns in-process: with every shard of a
/// dataset on one node, its creation, steps, refreshes, reads and
/// release-book reads move no body between nodes (the counters stay where they were) and
/// forward nothing, and they answer as the dataset's.
#[test]
fn a_node_calls_its_own_shards_in_process() {
    let Some(cluster) = Cluster::start(1, 4000) else {
        return;
    };
    cluster.wait_active(1);
    let admin = cluster.admin_token();
    let url = &cluster.nodes[0].url;
    let n = 40u64;
    let before = (node_bytes(url, &admin), forwarded(url, &admin));
    let created = post(
        &format!("{url}/v1/datasets"),
        Some(&admin),
        &json!({"id": "own", "config": poisson_config(n, 0.25, 1.0), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let dataset = format!("{url}/v1/datasets/own");
    for step in 0..3u64 {
        let ids: Vec<u64> = (0..n).filter(|i| (i + step) % 3 == 0).collect();
        let norms: Vec<f64> = ids.iter().map(|i| 0.1 * (*i as f64 % 7.0)).collect();
        let r = post(
            &format!("{dataset}/steps"),
            Some(&admin),
            &json!({"step": step, "ids": ids, "norms": norms}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["complete"], true, "{:?}", r.body);
        assert_eq!(
            r.body["thresholds"].as_array().map(Vec::len),
            Some(ids.len()),
            "{:?}",
            r.body
        );
    }
    let view = get(&dataset, Some(&admin));
    assert_eq!(view.status, 200, "{:?}", view.body);
    assert_eq!(view.body["status"]["steps"], 3, "{:?}", view.body);
    let privacy = get(&format!("{dataset}/examples/37/privacy"), Some(&admin));
    assert_eq!(privacy.status, 200, "{:?}", privacy.body);
    assert_eq!(privacy.body["example"]["id"], 37, "{:?}", privacy.body);
    let thresholds = get(
        &format!("{dataset}/thresholds?start=5&end=35"),
        Some(&admin),
    );
    assert_eq!(thresholds.status, 200, "{:?}", thresholds.body);
    assert_eq!(
        thresholds.body["thresholds"].as_array().map(Vec::len),
        Some(30)
    );
    assert_eq!(
        get(&format!("{dataset}/worst-case"), Some(&admin)).status,
        200
    );
    // The release book is its first shard's, read here.
    let budget = get(&format!("{dataset}/release-budget"), Some(&admin));
    assert_eq!(budget.status, 200, "{:?}", budget.body);
    let latest = get(&format!("{dataset}/releases/latest"), Some(&admin));
    assert_eq!(latest.status, 404, "{:?}", latest.body);
    assert_eq!(
        (node_bytes(url, &admin), forwarded(url, &admin)),
        before,
        "a node's own shards were called over HTTP"
    );
}

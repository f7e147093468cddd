//! Node-to-node authentication (`docs/cluster.md`, "Node-to-node
//! authentication"): real node processes on loopback and the real
//! PostgreSQL. The calls of the cross-shard change protocol (prepare,
//! decide) need a node mark, an HMAC with the cluster's secret: a curator's
//! token alone is refused (403) and holds nothing; a forged, stale, replayed
//! or misdirected mark is refused; releases and budgets still work through
//! every node. Also: decided changes older than the horizon are pruned (by
//! the store's statement and by a node's lease loop), the cluster's secret is
//! made once, and the routing's negative cache forgets a name created
//! through the node.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::pg_schema::TestSchema;
use common::*;
use dpledger::engine::cluster::{unix_ms, NodeMarks};
use dpledger::store::cluster::{ClusterDb, DECISIONS_KEPT};
use serde_json::json;
use std::time::{Duration, Instant};

const N: u64 = 40;

fn decisions(url: &str, sql: &'static str) -> Vec<String> {
    let url = url.to_string();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(sql).unwrap();
        c.query("SELECT id FROM dpledger_decisions ORDER BY id", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    })
    .join()
    .unwrap()
}

/// A hand-sent prepare with a curator's token and no mark is refused and
/// holds nothing; forged, stale, replayed and misdirected marks are refused;
/// a node's valid mark (with or without a caller's token) is accepted; a
/// release and a budget change through every node still work.
#[test]
fn protocol_calls_need_a_valid_fresh_node_mark() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let created = post(
        &format!("{}/v1/datasets", cluster.nodes[0].url),
        Some(&admin),
        &json!({"id": "m", "config": poisson_config(N, 0.3, 1.0), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let curator = cluster.token_for("curator", &["m"], None);
    let trainer = cluster.token_for("trainer", &["m"], None);
    let (owner, _) = cluster.wait_owner("m~0", None, Duration::from_secs(20));
    let node = cluster.nodes.iter().find(|n| n.id == owner).unwrap();
    let at = |path: &str| format!("{}{path}", node.url);
    let prepare = |id: &str| format!("/v1/datasets/m~0/shard-changes/{id}/prepare");
    let decide = |id: &str| format!("/v1/datasets/m~0/shard-changes/{id}/decide");
    let budget = json!({"budget": 0.5});
    let refused = |r: &Reply, why: &str| {
        assert_eq!(r.status, 403, "{:?}", r.body);
        assert_eq!(
            r.body["type"], "urn:dpledger:problem:node-mark",
            "{:?}",
            r.body
        );
        assert!(r.content_type.starts_with("application/problem+json"));
        let detail = r.body["detail"].as_str().unwrap_or("");
        assert!(detail.contains(why), "{why}: {detail}");
    };

    // A curator's token alone: refused, nothing held.
    let r = post(&at(&prepare("hand")), Some(&curator), &budget);
    refused(&r, "carries no node mark");
    let r = post(&at(&decide("hand")), Some(&curator), &json!({}));
    refused(&r, "carries no node mark");
    // The shard takes a step through another node at once (nothing holds
    // its writes), and a node's prepare of the shard is not made to wait
    // for a release turn (a held change would answer it 503 after 1 s).
    let step = json!({"step": 0, "ids": [0, 15, 30], "norms": [0.5, 0.5, 0.5]});
    let other = cluster.nodes.iter().find(|n| n.id != owner).unwrap();
    let r = post(
        &format!("{}/v1/datasets/m/steps", other.url),
        Some(&trainer),
        &step,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["complete"], true);
    let mark = cluster.node_mark("n2", &prepare("p1"), &budget, unix_ms());
    let r = post_marked(&at(&prepare("p1")), Some(&curator), &budget, Some(&mark));
    assert_eq!(r.status, 200, "{:?}", r.body);
    // The same mark again: a replay.
    let r = post_marked(&at(&prepare("p1")), Some(&curator), &budget, Some(&mark));
    refused(&r, "used before");
    // A mark of the decide sent with nothing (a node's own call, no token).
    let mark = cluster.node_mark("n2", &decide("p1"), &json!({}), unix_ms());
    let r = post_marked(&at(&decide("p1")), None, &json!({}), Some(&mark));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["decision"], "aborted");

    // Forged: another key; stale: two minutes old; misdirected: the mark of
    // another path, or of another body; malformed.
    let wrong = NodeMarks::new(vec![0; 32]).mark("n2", "POST", &prepare("f"), &[]);
    let r = post_marked(&at(&prepare("f")), Some(&curator), &budget, Some(&wrong));
    refused(&r, "does not match");
    let stale = cluster.node_mark("n2", &prepare("s"), &budget, unix_ms() - 120_000);
    let r = post_marked(&at(&prepare("s")), Some(&curator), &budget, Some(&stale));
    refused(&r, "stale");
    let elsewhere = cluster.node_mark("n2", &decide("e"), &budget, unix_ms());
    let r = post_marked(
        &at(&prepare("e")),
        Some(&curator),
        &budget,
        Some(&elsewhere),
    );
    refused(&r, "does not match");
    let other_body = cluster.node_mark("n2", &prepare("b"), &json!({"budget": 9.0}), unix_ms());
    let r = post_marked(
        &at(&prepare("b")),
        Some(&curator),
        &budget,
        Some(&other_body),
    );
    refused(&r, "does not match");
    let r = post_marked(
        &at(&prepare("g")),
        Some(&curator),
        &budget,
        Some("v1:garbage"),
    );
    refused(&r, "malformed");
    // A valid mark does not lift the token's authorisation.
    let mark = cluster.node_mark("n2", &prepare("t"), &budget, unix_ms());
    let r = post_marked(&at(&prepare("t")), Some(&trainer), &budget, Some(&mark));
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(
        r.body["type"], "urn:dpledger:problem:forbidden",
        "{:?}",
        r.body
    );

    // The protocol itself, through every node: a budget, then a release.
    let r = put(
        &format!("{}/v1/datasets/m/release-budget", cluster.nodes[1].url),
        Some(&curator),
        &json!({"rho": 0.05}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let r = post(
            &format!("{}/v1/datasets/m/releases", node.url),
            Some(&curator),
            &json!({"mean": {"rho": 0.001}}),
        );
        assert_eq!(r.status, 201, "through node {i}: {:?}", r.body);
        assert_eq!(r.body["budget"]["releases"], i as u64 + 1, "{:?}", r.body);
    }
    // Every shard's book has the three releases.
    let view = get(
        &format!("{}/v1/datasets/m", cluster.nodes[2].url),
        Some(&curator),
    );
    assert_eq!(view.body["status"]["releases"], 3, "{:?}", view.body);
}

/// A decided change is kept for `DECISIONS_KEPT`, then pruned (in batches);
/// the cluster's secret is made by the first node to ask and read by the rest.
#[test]
fn old_decisions_are_pruned_and_the_secret_is_made_once() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let _store = dpledger::store::open(&schema.url).expect("store");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt
        .block_on(ClusterDb::connect(&schema.url, Duration::from_secs(5)))
        .expect("cluster tables");
    assert!(DECISIONS_KEPT >= Duration::from_secs(3600));
    let rows = decisions(
        &schema.url,
        "INSERT INTO dpledger_decisions (id, outcome, created) VALUES \
         ('old1', 'abort', now() - interval '2 days'), \
         ('old2', 'commit', now() - interval '25 hours'), \
         ('recent', 'commit', now() - interval '23 hours'), \
         ('new', 'abort', now())",
    );
    assert_eq!(rows.len(), 4);
    // One row per call with a batch of one, then nothing more to do.
    assert_eq!(
        rt.block_on(db.prune_decisions(DECISIONS_KEPT, 1)).unwrap(),
        1
    );
    assert_eq!(
        rt.block_on(db.prune_decisions(DECISIONS_KEPT, 1)).unwrap(),
        1
    );
    assert_eq!(
        rt.block_on(db.prune_decisions(DECISIONS_KEPT, 1)).unwrap(),
        0
    );
    assert_eq!(decisions(&schema.url, ""), ["new", "recent"]);
    // The secret: the first node's, whatever the next one proposes.
    let first = rt.block_on(db.node_secret([1; 32])).unwrap();
    let second = rt.block_on(db.node_secret([2; 32])).unwrap();
    assert_eq!(first, vec![1; 32]);
    assert_eq!(second, first);
}

/// A node prunes old decisions in its lease loop (at its start, then every
/// ten minutes), and a name asked for before it existed is found as soon as
/// it is created through the same node (the negative cache forgets it).
#[test]
fn a_node_prunes_old_decisions_and_forgets_absent_names_it_creates() {
    let Some(mut cluster) = Cluster::start(2, 2000) else {
        return;
    };
    cluster.wait_active(2);
    let url = cluster.schema.url.clone();
    decisions(
        &url,
        "INSERT INTO dpledger_decisions (id, outcome, created) VALUES \
         ('ancient', 'commit', now() - interval '3 days'), ('fresh', 'abort', now())",
    );
    cluster.restart(0);
    let started = Instant::now();
    while decisions(&url, "") != ["fresh"] {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not pruned: {:?}",
            decisions(&url, "")
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let admin = cluster.admin_token();
    let base = cluster.nodes[1].url.clone();
    for _ in 0..2 {
        let r = get(&format!("{base}/v1/datasets/ghost"), Some(&admin));
        assert_eq!(r.status, 404, "{:?}", r.body);
    }
    let created = post(
        &format!("{base}/v1/datasets"),
        Some(&admin),
        &json!({"id": "ghost", "config": poisson_config(N, 0.3, 1.0)}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let r = get(&format!("{base}/v1/datasets/ghost"), Some(&admin));
    assert_eq!(r.status, 200, "{:?}", r.body);
    // And a sharded one.
    let r = get(&format!("{base}/v1/datasets/ghosts"), Some(&admin));
    assert_eq!(r.status, 404, "{:?}", r.body);
    let created = post(
        &format!("{base}/v1/datasets"),
        Some(&admin),
        &json!({"id": "ghosts", "config": poisson_config(N, 0.3, 1.0), "shards": 2}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let r = get(&format!("{base}/v1/datasets/ghosts"), Some(&admin));
    assert_eq!(r.status, 200, "{:?}", r.body);
}

//! Routing: any node answers any request, with the owner's answer
//! (forwarded, `Authorization` passed through, authorisation run by the node
//! that answers); the cluster map; single-node mode unchanged.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::json;

#[test]
fn a_non_owner_forwards_to_the_owner_and_permissions_hold() {
    let Some(cluster) = Cluster::start(2, 2000) else {
        return;
    };
    let (n, q) = (20u64, 0.5);
    let bound = std::time::Duration::from_secs(20);
    cluster.create(0, "d", n, q);
    cluster.create(0, "other", n, q);
    // Two datasets on two nodes settle one on each (placement, then
    // rebalancing); then nothing moves.
    let counts = cluster.wait_balanced(bound);
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), [1, 1]);
    let (owner, _) = cluster.wait_owner("d", None, bound);
    cluster.wait_owner("other", None, bound);
    let owner_i = cluster.nodes.iter().position(|n| n.id == owner).unwrap();
    let admin = cluster.admin_token();
    let trainer = cluster.token("trainer", Some("d"), None);
    let stranger = cluster.token("trainer", Some("other"), None);
    let owner3 = cluster.token("owner", Some("d"), Some("3"));
    let via = &cluster.nodes[1 - owner_i].url;
    for step in poisson_trace(1, n, q, 5) {
        let r = post(&format!("{via}/v1/datasets/d/steps"), Some(&trainer), &step);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let direct = get(
        &format!("{}/v1/datasets/d", cluster.nodes[owner_i].url),
        Some(&trainer),
    );
    let forwarded = get(&format!("{via}/v1/datasets/d"), Some(&trainer));
    assert_eq!(direct.status, 200);
    assert_eq!(forwarded.status, 200);
    assert_eq!(direct.body, forwarded.body);
    assert_eq!(forwarded.body["status"]["steps"], 5);
    // Authorisation through the non-owner is the owner's: same refusals.
    let cases = [
        (None, "/v1/datasets/d", 401),
        (Some(&stranger), "/v1/datasets/d", 403),
        (Some(&owner3), "/v1/datasets/d/examples/4/privacy", 403),
        (Some(&owner3), "/v1/datasets/d/examples/3/privacy", 200),
        (Some(&admin), "/v1/datasets/nope", 404),
        (Some(&stranger), "/v1/datasets/nope", 403),
    ];
    for (token, path, want) in cases {
        for node in &cluster.nodes {
            let r = get(&format!("{}{path}", node.url), token.map(String::as_str));
            assert_eq!(r.status, want, "{} {path}: {:?}", node.id, r.body);
        }
    }
    let r = post(
        &format!("{via}/v1/datasets/d/steps"),
        Some(&stranger),
        &json!({"step": 5, "ids": [], "norms": []}),
    );
    assert_eq!(r.status, 403);
    // The map: every node, and only the datasets the token holds a role on.
    let map = get(&format!("{via}/v1/cluster"), Some(&trainer)).body;
    assert_eq!(map["mode"], "cluster");
    assert_eq!(map["node_id"], cluster.nodes[1 - owner_i].id.as_str());
    assert_eq!(map["lease_ttl_ms"], 2000);
    let nodes = map["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n["alive"] == true), "{map}");
    assert_eq!(nodes[0]["advertise"], cluster.nodes[0].url.as_str());
    assert!(nodes.iter().all(|n| n["datasets_owned"] == 1), "{map}");
    // Each node reports its memory: free for new datasets, and its ledgers'.
    for n in nodes {
        assert!(n["memory_free_bytes"].as_u64().unwrap() > 0, "{map}");
        assert!(n["ledger_memory_bytes"].is_u64(), "{map}");
    }
    let datasets = map["datasets"].as_array().unwrap();
    assert_eq!(datasets.len(), 1, "{map}");
    assert_eq!(datasets[0]["dataset"], "d");
    assert_eq!(datasets[0]["owner"], owner.as_str());
    assert_eq!(
        datasets[0]["advertise"],
        cluster.nodes[owner_i].url.as_str()
    );
    assert!(datasets[0]["lease_expires_in_ms"].as_u64().unwrap() > 0);
    assert_eq!(get(&format!("{via}/v1/cluster"), None).status, 401);
    let all = get(&format!("{via}/v1/cluster"), Some(&admin)).body;
    assert_eq!(all["datasets"].as_array().unwrap().len(), 2);
    // Draining is for admins only, and names a registered node.
    let drain = |node: &str, token: &str| {
        post(
            &format!("{via}/v1/cluster/nodes/{node}/drain"),
            Some(token),
            &json!({}),
        )
        .status
    };
    assert_eq!(drain("n1", &trainer), 403);
    assert_eq!(drain("n9", &admin), 404);
}

#[test]
fn single_node_mode_answers_a_one_node_map() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    create_small_datasets(&server, &["x"]);
    let r = get(
        &format!("{}/v1/cluster", server.url),
        Some(&server.admin_token()),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body["mode"], "single");
    assert_eq!(r.body["node_id"], "local");
    assert!(r.body["lease_ttl_ms"].is_null());
    assert_eq!(r.body["nodes"][0]["node_id"], "local");
    assert_eq!(r.body["nodes"][0]["datasets_owned"], 1);
    assert_eq!(r.body["datasets"], json!([]));
    let drain = post(
        &format!("{}/v1/cluster/nodes/local/drain", server.url),
        Some(&server.admin_token()),
        &json!({}),
    );
    assert_eq!(drain.status, 409);
    // --cluster needs PostgreSQL and a node id.
    let refused = Server::try_start_with(dir.path(), None, &["--cluster", "--node-id", "n1"])
        .err()
        .expect("refused");
    assert!(refused.contains("PostgreSQL"), "{refused}");
}

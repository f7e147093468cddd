//! Sharded datasets: a dataset of k id ranges, each its own ledger
//! and lease on the nodes of a real cluster (processes on loopback, the real
//! PostgreSQL). The test that matters: one seeded trace accounted by one
//! unsharded dataset and by a 4-shard dataset on 3 nodes gives bit-identical
//! per-example RDP vectors, epsilons and thresholds, the same retirements and
//! the same worst case. Also: the shard map, exactly-once steps, routing of
//! per-example queries, authorisation, and clear refusals of what is not
//! supported yet.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::{json, Value};

/// A Poisson configuration with an individual budget small enough that the
/// filter retires examples during the trace.
fn config(n: u64, q: f64) -> Value {
    budgeted_config(n, q, 6.0)
}

#[test]
fn a_four_shard_dataset_on_three_nodes_accounts_exactly_like_one_ledger() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let (n, q, steps) = (60u64, 0.3, 24u64);
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let plain = post(
        &url(0, "/v1/datasets"),
        Some(&admin),
        &json!({"id": "plain", "config": config(n, q)}),
    );
    assert_eq!(plain.status, 201, "{:?}", plain.body);
    assert!(plain.body.get("shards").is_none(), "{:?}", plain.body);
    let created = post(
        &url(1, "/v1/datasets"),
        Some(&admin),
        &json!({"id": "sharded", "config": config(n, q), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    // The shard map: four contiguous ranges covering 0..n, each with an owner
    // at epoch 1, spread over the three nodes.
    let map = created.body["shards"].as_array().unwrap().clone();
    assert_eq!(map.len(), 4, "{map:?}");
    let mut next = 0;
    for shard in &map {
        assert_eq!(shard["start"], next, "{map:?}");
        assert!(shard["end"].as_u64().unwrap() > next);
        next = shard["end"].as_u64().unwrap();
        assert_eq!(shard["dataset"], format!("sharded~{}", shard["start"]));
        assert!(shard["owner"].is_string(), "{map:?}");
        assert_eq!(shard["epoch"], 1);
    }
    assert_eq!(next, n);
    let owners: std::collections::BTreeSet<&str> =
        map.iter().map(|s| s["owner"].as_str().unwrap()).collect();
    assert_eq!(owners.len(), 3, "shards not spread over the nodes: {map:?}");
    assert_eq!(created.body["config"], plain.body["config"]);
    assert_eq!(created.body["status"]["examples"], n);
    assert_eq!(created.body["worst_case"], plain.body["worst_case"]);

    let trainer = cluster.token("trainer", Some("sharded"), None);
    let plain_trainer = cluster.token("trainer", Some("plain"), None);
    let mut trace = poisson_trace(7, n, q, steps);
    // One step in two parts (data-parallel workers), split again by shard.
    let last = trace.pop().unwrap();
    let (ids, norms) = (
        last["ids"].as_array().unwrap(),
        last["norms"].as_array().unwrap(),
    );
    let half = ids.len() / 2;
    for (index, range) in [(0, 0..half), (1, half..ids.len())] {
        trace.push(
            json!({"step": steps - 1, "ids": ids[range.clone()], "norms": norms[range],
                          "part": {"index": index, "count": 2}}),
        );
    }
    for (t, step) in trace.iter().enumerate() {
        let a = post(
            &url(t, "/v1/datasets/plain/steps"),
            Some(&plain_trainer),
            step,
        );
        let b = post(
            &url(t + 1, "/v1/datasets/sharded/steps"),
            Some(&trainer),
            step,
        );
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(b.status, 200, "{:?}", b.body);
        // Thresholds (bit for bit: JSON numbers print every f64 exactly),
        // retirements, completeness: the same answer.
        assert_eq!(a.body, b.body, "step {t}");
        // A retry through another node: every shard answers its part as a
        // duplicate, the same thresholds, nothing applied twice.
        if t % 5 == 0 {
            let again = post(
                &url(t + 2, "/v1/datasets/sharded/steps"),
                Some(&trainer),
                step,
            );
            assert_eq!(again.status, 200, "{:?}", again.body);
            assert_eq!(again.body["duplicate"], true);
            assert_eq!(again.body["thresholds"], b.body["thresholds"]);
        }
    }
    let view = get(&url(2, "/v1/datasets/sharded"), Some(&trainer)).body;
    let plain_view = get(&url(2, "/v1/datasets/plain"), Some(&plain_trainer)).body;
    assert_eq!(view["status"]["steps"], steps);
    assert!(view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["steps"] == steps));
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
    assert!(
        view["status"]["retired"].as_u64().unwrap() > 0,
        "the trace should retire examples: {view}"
    );
    assert_eq!(view["worst_case"], plain_view["worst_case"]);
    // Every example: the same RDP vector, epsilon, threshold, retirement, and
    // the same worst case beside it, whichever node answers.
    for id in 0..n {
        let path = |d: &str| format!("/v1/datasets/{d}/examples/{id}/privacy");
        let a = get(&url(id as usize, &path("plain")), Some(&admin));
        let b = get(&url(id as usize + 1, &path("sharded")), Some(&admin));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    let outside = format!("/examples/{n}/privacy");
    let a = get(
        &url(0, &format!("/v1/datasets/plain{outside}")),
        Some(&admin),
    );
    let b = get(
        &url(1, &format!("/v1/datasets/sharded{outside}")),
        Some(&admin),
    );
    assert_eq!((a.status, &a.body), (400, &b.body));
    let estimate = "/examples/3/privacy?method=pld_estimate&delta=0.0001";
    assert_eq!(
        get(
            &url(0, &format!("/v1/datasets/plain{estimate}")),
            Some(&admin)
        )
        .body,
        get(
            &url(1, &format!("/v1/datasets/sharded{estimate}")),
            Some(&admin)
        )
        .body
    );
    for query in [
        "",
        "?start=5&end=47",
        "?start=14&end=15",
        "?start=20&end=20",
    ] {
        let a = get(
            &url(0, &format!("/v1/datasets/plain/thresholds{query}")),
            Some(&admin),
        );
        let b = get(
            &url(1, &format!("/v1/datasets/sharded/thresholds{query}")),
            Some(&admin),
        );
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "thresholds{query}");
    }
    for query in ["", "?delta=0.001&conversion=classic"] {
        let a = get(
            &url(0, &format!("/v1/datasets/plain/worst-case{query}")),
            Some(&admin),
        );
        let b = get(
            &url(2, &format!("/v1/datasets/sharded/worst-case{query}")),
            Some(&admin),
        );
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "worst-case{query}");
    }
    // Every shard logged every part of every step exactly once (the last
    // step in its two parts), retries included, at epoch 1.
    let mut expected: Vec<i64> = (0..steps as i64).collect();
    expected.push(steps as i64 - 1);
    for shard in &map {
        let logged = cluster.logged_steps(shard["dataset"].as_str().unwrap());
        let numbers: Vec<i64> = logged.iter().map(|(_, step, _)| *step).collect();
        assert_eq!(numbers, expected, "{shard}");
        assert!(
            logged.iter().all(|(_, _, epoch)| *epoch == Some(1)),
            "{shard}"
        );
    }
}

#[test]
fn sharded_requests_are_validated_authorised_and_refused_clearly() {
    let Some(cluster) = Cluster::start(2, 4000) else {
        return;
    };
    let admin = cluster.admin_token();
    let via = |i: usize| cluster.nodes[i].url.clone();
    let create =
        |i: usize, body: Value| post(&format!("{}/v1/datasets", via(i)), Some(&admin), &body);
    let c = poisson_config(10, 0.5, 1.0);
    let refused = |body: Value, field: &str| {
        let r = create(0, body);
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
    };
    refused(json!({"id": "s", "config": c, "shards": 0}), "shards");
    refused(json!({"id": "s", "config": c, "shards": 257}), "shards");
    refused(json!({"id": "s", "config": c, "shards": 11}), "shards");
    // (Shuffled sampling is sharded: tests/cluster_shard_labels.rs; only a
    // shard's epoch_steps is refused on a creation.)
    let mut shuffled = c.clone();
    shuffled["sampling"] = json!({"kind": "shuffle", "batch_size": 2, "epoch_steps": 5});
    refused(
        json!({"id": "s", "config": shuffled, "shards": 2}),
        "sampling.epoch_steps",
    );
    refused(
        json!({"id": "s", "config": c, "shards": 2, "release_budget": {"epsilon": 1.0, "delta": 1e-6}}),
        "release_budget",
    );
    refused(json!({"id": "s~0", "config": c, "shards": 2}), "id");
    // A bad label is refused before the name is taken (the good creation of
    // "s" below then succeeds).
    refused(
        json!({"id": "s", "config": c, "shards": 3, "labels": ["a", "", null, "c"]}),
        "labels",
    );
    // Nobody creates a shard by hand.
    let r = create(0, json!({"id": "x~0", "config": c}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    // Only an admin creates.
    let curator = cluster.token("curator", Some("s"), None);
    let r = post(
        &format!("{}/v1/datasets", via(0)),
        Some(&curator),
        &json!({"id": "s", "config": c, "shards": 2}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);

    let body = json!({"id": "s", "config": c, "shards": 3, "labels": ["a", "b", null, "c"]});
    assert_eq!(create(0, body.clone()).status, 201);
    // The same creation again completes (nothing missing): 201; another is 409.
    assert_eq!(create(1, body.clone()).status, 201);
    assert_eq!(
        create(1, json!({"id": "s", "config": c, "shards": 2})).status,
        409
    );
    // A name is one dataset, sharded or not.
    assert_eq!(create(0, json!({"id": "s", "config": c})).status, 409);
    assert_eq!(create(0, json!({"id": "p", "config": c})).status, 201);
    assert_eq!(
        create(1, json!({"id": "p", "config": c, "shards": 2})).status,
        409
    );
    // Listed once, under its name.
    let list = get(&format!("{}/v1/datasets", via(1)), Some(&admin)).body;
    assert_eq!(list["datasets"], json!(["p", "s"]));

    let trainer = cluster.token("trainer", Some("s"), None);
    let stranger = cluster.token("trainer", Some("p"), None);
    let owner = cluster.token("owner", Some("s"), Some("7"));
    let step = |token: &str, body: Value| {
        post(
            &format!("{}/v1/datasets/s/steps", via(1)),
            Some(token),
            &body,
        )
    };
    assert_eq!(
        step(&stranger, json!({"step": 0, "ids": [1], "norms": [0.5]})).status,
        403
    );
    let r = step(&trainer, json!({"step": 0, "ids": [10], "norms": [0.5]}));
    assert_eq!(
        (r.status, r.body["field"].clone()),
        (400, json!("ids")),
        "{:?}",
        r.body
    );
    let r = step(&trainer, json!({"step": 0, "ids": [1, 2], "norms": [0.5]}));
    assert_eq!(
        (r.status, r.body["field"].clone()),
        (400, json!("norms")),
        "{:?}",
        r.body
    );
    // A gap is refused by every shard alike; nothing is applied.
    assert_eq!(
        step(&trainer, json!({"step": 1, "ids": [], "norms": []})).status,
        409
    );
    let ok = step(
        &trainer,
        json!({"step": 0, "ids": [9, 0, 4], "norms": [0.5, 2.0, 0.1]}),
    );
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.body["thresholds"].as_array().unwrap().len(), 3);
    assert_eq!(ok.body["complete"], true);
    // Per-example access maps to the shard with the dataset's ids.
    let privacy = |id: u64, token: &str| {
        get(
            &format!("{}/v1/datasets/s/examples/{id}/privacy", via(0)),
            Some(token),
        )
    };
    let mine = privacy(7, &owner);
    assert_eq!(mine.status, 200, "{:?}", mine.body);
    assert_eq!(mine.body["example"]["id"], 7);
    assert_eq!(privacy(6, &owner).status, 403);
    assert_eq!(privacy(1, &stranger).status, 403);
    assert_eq!(privacy(10, &admin).status, 400);
    // Going around the dataset to a shard is authorised as the dataset: the
    // owner of example 7 reads it at its shard (start 6, local id 1) only.
    let shard = format!("{}/v1/datasets/s~6/examples", via(0));
    assert_eq!(get(&format!("{shard}/1/privacy"), Some(&owner)).status, 200);
    assert_eq!(get(&format!("{shard}/0/privacy"), Some(&owner)).status, 403);
    let curator = cluster.token("curator", Some("s"), None);
    // (Releases and budgets are exact across shards:
    // tests/cluster_shard_releases.rs; policies: tests/cluster_shard_policy.rs;
    // labels: tests/cluster_shard_labels.rs.) A stranger is refused them.
    for path in ["/labels", "/release-policy", "/release-budget"] {
        let url = format!("{}/v1/datasets/s{path}", via(1));
        let r = put(&url, Some(&stranger), &json!({}));
        assert_eq!(r.status, 403, "PUT {path}: {:?}", r.body);
    }
    // Nor can a change reach one shard by its own id, on any node (it would
    // charge or change that shard alone): only reads and step parts pass.
    for node in 0..cluster.nodes.len() {
        for (method, path) in [
            ("POST", "/releases"),
            ("PUT", "/labels"),
            ("PUT", "/release-policy"),
        ] {
            let url = format!("{}/v1/datasets/s~6{path}", via(node));
            let r = match method {
                "PUT" => put(&url, Some(&curator), &json!({})),
                _ => post(&url, Some(&curator), &json!({})),
            };
            assert_eq!(
                r.status, 409,
                "node {node}: {method} s~6{path}: {:?}",
                r.body
            );
            assert_eq!(r.body["type"], "urn:dpledger:problem:sharded-unsupported");
        }
    }
    let view = get(&format!("{}/v1/datasets/s", via(1)), Some(&admin));
    assert_eq!(view.status, 200, "{:?}", view.body);
    assert_ne!(view.body["archived"], true, "{:?}", view.body);
    // A bad norm in one shard's range is refused before any shard applies
    // the step (it would otherwise be applied in part).
    let r = step(
        &trainer,
        json!({"step": 1, "ids": [1, 9], "norms": [0.5, -1.0]}),
    );
    assert_eq!(
        (r.status, r.body["field"].clone()),
        (400, json!("norms")),
        "{:?}",
        r.body
    );
    // What only a shard's state refuses (an id pending in another part of the
    // step) after other shards applied their part is said to be partial.
    let r = step(
        &trainer,
        json!({"step": 1, "ids": [1], "norms": [0.5], "part": {"index": 0, "count": 2}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["complete"], false, "{:?}", r.body);
    let r = step(
        &trainer,
        json!({"step": 1, "ids": [1, 7], "norms": [0.5, 0.5], "part": {"index": 1, "count": 2}}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(
        r.body["type"], "urn:dpledger:problem:partially-applied",
        "{:?}",
        r.body
    );
    let detail = r.body["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("\"s~0\"") && detail.contains("s~6"),
        "{detail}"
    );
    assert_eq!(get(&format!("{}/v1/datasets/s", via(0)), None).status, 401);
    assert_eq!(
        get(&format!("{}/v1/datasets/s/nothing", via(0)), Some(&admin)).status,
        404
    );
}

/// A shard whose node cannot be reached at all when its dataset is created
/// (killed, but its heartbeat not yet stale: placement still counts it) is
/// created on the coordinating node instead: the creation answers 201 with
/// every shard owned by a live node, and the dataset takes steps.
#[test]
fn a_shard_placed_on_an_unreachable_node_is_created_by_the_coordinator() {
    // Leases and heartbeats of 20 s: the killed node stays in placement for
    // the whole test.
    let Some(mut cluster) = Cluster::start(3, 20_000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let dead = cluster.nodes[2].id.clone();
    cluster.nodes[2].kill();
    let url = cluster.nodes[0].url.clone();
    let created = post(
        &format!("{url}/v1/datasets"),
        Some(&admin),
        &json!({"id": "spread", "config": config(30, 0.5), "shards": 3}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let map = created.body["shards"].as_array().unwrap().clone();
    assert_eq!(map.len(), 3, "{map:?}");
    let owners: Vec<&str> = map.iter().map(|s| s["owner"].as_str().unwrap()).collect();
    assert!(!owners.contains(&dead.as_str()), "{map:?}");
    assert!(owners.contains(&cluster.nodes[0].id.as_str()), "{map:?}");
    let step = post(
        &format!("{url}/v1/datasets/spread/steps"),
        Some(&admin),
        &json!({"step": 0, "ids": [0, 15, 29], "norms": [0.5, 0.5, 0.5]}),
    );
    assert_eq!(step.status, 200, "{:?}", step.body);
    assert_eq!(step.body["complete"], true, "{:?}", step.body);
}

#[test]
fn shards_need_cluster_mode() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": "s", "config": poisson_config(10, 0.5, 1.0), "shards": 2}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "shards");
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": "s~0", "config": poisson_config(10, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
}

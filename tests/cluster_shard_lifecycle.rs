//! A sharded dataset's life beyond steps. Automatic sharding: a
//! creation without `"shards"` whose `examples` exceed the nodes'
//! `--max-shard-examples` becomes ⌈examples / bound⌉ shards; what cannot be
//! sharded within the bound is refused with a clear 400 naming the field to
//! change, and a single server (nothing to shard over) refuses it saying what
//! to do. Archiving: every shard is archived, a retry completes a partial
//! archive, and the dataset's view, list and answers stay consistent.
//! Refreshes: split by id range, exactly once per shard with the caller's
//! `Idempotency-Key`, accounted exactly like one ledger's.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn a_creation_above_the_bound_is_sharded_automatically_or_refused_clearly() {
    let bound = |_| vec!["--max-shard-examples".to_string(), "25".to_string()];
    let Some(cluster) = Cluster::start_with(2, 4000, bound) else {
        return;
    };
    cluster.wait_active(2);
    let admin = cluster.admin_token();
    let create = |i: usize, body: Value| {
        post(
            &format!("{}/v1/datasets", cluster.nodes[i].url),
            Some(&admin),
            &body,
        )
    };
    let refused = |body: Value, field: &str, says: &str| {
        let r = create(0, body);
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
        let detail = r.body["detail"].as_str().unwrap_or("");
        assert!(detail.contains(says), "{detail}");
    };

    // 60 examples, at most 25 a shard: three shards of 20, spread.
    let r = create(
        1,
        json!({"id": "auto", "config": poisson_config(60, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let map = r.body["shards"].as_array().expect("a shard map").clone();
    let ranges: Vec<(u64, u64)> = map
        .iter()
        .map(|s| (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranges, vec![(0, 20), (20, 40), (40, 60)], "{map:?}");
    assert_eq!(r.body["config"]["examples"], 60);
    // The same creation again is a retry (the same layout): 201.
    let again = create(
        0,
        json!({"id": "auto", "config": poisson_config(60, 0.5, 1.0)}),
    );
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert_eq!(again.body["shards"].as_array().unwrap().len(), 3);
    // It is a sharded dataset like any other: a step reaches every shard.
    let step = post(
        &format!("{}/v1/datasets/auto/steps", cluster.nodes[0].url),
        Some(&admin),
        &json!({"step": 0, "ids": [0, 59, 25], "norms": [0.5, 0.2, 2.0]}),
    );
    assert_eq!(step.status, 200, "{:?}", step.body);
    assert_eq!(step.body["complete"], true);
    for shard in &map {
        let logged = cluster.logged_steps(shard["dataset"].as_str().unwrap());
        assert_eq!(logged.len(), 1, "{shard}");
    }

    // At or below the bound: one ledger, as before.
    let r = create(
        0,
        json!({"id": "small", "config": poisson_config(25, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body.get("shards").is_none(), "{:?}", r.body);

    // Explicit shards too large for the bound: the field to change.
    refused(
        json!({"id": "two", "config": poisson_config(60, 0.5, 1.0), "shards": 2}),
        "shards",
        "at least 3 shards",
    );
    let r = create(
        0,
        json!({"id": "four", "config": poisson_config(60, 0.5, 1.0), "shards": 4}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["shards"].as_array().unwrap().len(), 4);
    // More shards than a dataset may have.
    refused(
        json!({"id": "huge", "config": poisson_config(25 * 256 + 1, 0.5, 1.0)}),
        "examples",
        "257 shards",
    );
    // Shuffled sampling is sharded too, each shard counting the dataset's
    // epochs (`epoch_steps` = ceil(60 / 6) = 10; tests/cluster_shard_labels.rs
    // checks its accounting against one ledger).
    let mut shuffled = poisson_config(60, 0.5, 1.0);
    shuffled["sampling"] = json!({"kind": "shuffle", "batch_size": 6});
    let r = create(0, json!({"id": "shuffled", "config": shuffled}));
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["shards"].as_array().unwrap().len(), 3);
    let shard = r.body["shards"][1]["dataset"].as_str().unwrap().to_string();
    let view = get(
        &format!("{}/v1/datasets/{shard}", cluster.nodes[1].url),
        Some(&admin),
    );
    assert_eq!(view.status, 200, "{:?}", view.body);
    assert_eq!(
        view.body["config"]["sampling"]["epoch_steps"], 10,
        "{:?}",
        view.body
    );
    // Nothing refused took a name.
    let list = get(
        &format!("{}/v1/datasets", cluster.nodes[1].url),
        Some(&admin),
    );
    assert_eq!(
        list.body["datasets"],
        json!(["auto", "four", "shuffled", "small"])
    );
}

#[test]
fn a_single_server_refuses_a_dataset_above_a_bound_it_was_given_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_flags(dir.path(), None, &["--max-shard-examples", "25"]);
    let admin = server.admin_token();
    let create = |id: &str, n: u64| {
        post(
            &format!("{}/v1/datasets", server.url),
            Some(&admin),
            &json!({"id": id, "config": poisson_config(n, 0.5, 1.0)}),
        )
    };
    let r = create("big", 26);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "examples", "{:?}", r.body);
    let detail = r.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("--cluster") && detail.contains("--max-shard-examples"),
        "{detail}"
    );
    assert_eq!(create("fits", 25).status, 201);
    // Without the flag a single server keeps accepting what it always did:
    // the cluster's default bound (2·10⁷ examples) does not apply to it.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": "big", "config": poisson_config(20_000_001, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
}

#[test]
fn archiving_a_sharded_dataset_archives_every_shard_once_and_for_all() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let shards = cluster.create_sharded(
        0,
        &json!({"id": "a", "config": poisson_config(40, 0.5, 1.0), "shards": 4}),
    );
    let trace = poisson_trace(5, 40, 0.5, 3);
    for step in &trace {
        let r = post(&url(1, "/v1/datasets/a/steps"), Some(&admin), step);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let before = get(&url(2, "/v1/datasets/a/examples/33/privacy"), Some(&admin));
    assert_eq!(before.status, 200, "{:?}", before.body);
    // Only a curator (or admin) of the dataset archives it.
    let trainer = cluster.token("trainer", Some("a"), None);
    let r = post(
        &url(0, "/v1/datasets/a/archive"),
        Some(&trainer),
        &json!({}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);

    // A partial archive (one shard, as a fan-out cut short would leave it):
    // the dataset is read-only at once and says so.
    let r = post(
        &url(1, &format!("/v1/datasets/{}/archive", shards[2])),
        Some(&admin),
        &json!({}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let view = get(&url(0, "/v1/datasets/a"), Some(&admin));
    assert_eq!(view.body["archived"], true, "{:?}", view.body);
    // The dataset's archive completes it, through any node, and is
    // idempotent: a retry answers the same view, nothing logged twice.
    let curator = cluster.token("curator", Some("a"), None);
    let first = post(
        &url(2, "/v1/datasets/a/archive"),
        Some(&curator),
        &json!({}),
    );
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(first.body["archived"], true);
    assert_eq!(first.body["status"]["steps"], 3);
    assert_eq!(first.body["shards"].as_array().unwrap().len(), 4);
    let again = post(
        &url(0, "/v1/datasets/a/archive"),
        Some(&curator),
        &json!({}),
    );
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(again.body["archived"], first.body["archived"]);
    assert_eq!(again.body["status"], first.body["status"]);
    for shard in &shards {
        assert_eq!(records(&cluster, shard, 6), 1, "{shard}");
        let r = get(&url(1, &format!("/v1/datasets/{shard}")), Some(&admin));
        assert_eq!(r.body["archived"], true, "{shard}: {:?}", r.body);
    }
    // Read-only: a step is refused by every shard alike (nothing applied);
    // reads answer as before; the list still names it once.
    let r = post(
        &url(1, "/v1/datasets/a/steps"),
        Some(&admin),
        &json!({"step": 3, "ids": [1, 39], "norms": [0.5, 0.5]}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_ne!(r.body["type"], "urn:dpledger:problem:partially-applied");
    for shard in &shards {
        assert_eq!(cluster.logged_steps(shard).len(), 3, "{shard}");
    }
    let after = get(&url(0, "/v1/datasets/a/examples/33/privacy"), Some(&admin));
    assert_eq!(after.body, before.body);
    let list = get(&url(1, "/v1/datasets"), Some(&admin));
    assert_eq!(list.body["datasets"], json!(["a"]));
}

/// Archiving while a trainer keeps reporting: the archive is one change
/// across the shards (prepared at one step, committed in one transaction), so
/// every shard is archived after the same steps: no step is applied by some
/// shards and refused by others (`partially-applied`), every shard logs the
/// same steps and one archive record.
#[test]
fn archiving_while_steps_flow_archives_every_shard_after_the_same_steps() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let shards = cluster.create_sharded(
        0,
        &json!({"id": "flow", "config": poisson_config(40, 0.5, 1.0), "shards": 4}),
    );
    let trace = poisson_trace(8, 40, 0.5, 400);
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();
    let trainer = {
        let (admin, urls) = (admin.clone(), urls.clone());
        std::thread::spawn(move || {
            // (acknowledged steps, answers that were neither 200 nor the
            // archive's 409)
            let mut acknowledged = 0usize;
            let mut odd = Vec::new();
            for (t, step) in trace.iter().enumerate() {
                loop {
                    let r = post(
                        &format!("{}/v1/datasets/flow/steps", urls[t % urls.len()]),
                        Some(&admin),
                        step,
                    );
                    match r.status {
                        200 => {
                            acknowledged += 1;
                            break;
                        }
                        409 if r.body["type"] != "urn:dpledger:problem:partially-applied" => {
                            return (acknowledged, odd);
                        }
                        503 => continue,
                        _ => {
                            odd.push(r.body.clone());
                            return (acknowledged, odd);
                        }
                    }
                }
            }
            (acknowledged, odd)
        })
    };
    // Archive once steps are flowing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cluster.logged_steps(&shards[0]).len() < 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let curator = cluster.token("curator", Some("flow"), None);
    let archived = post(
        &url(1, "/v1/datasets/flow/archive"),
        Some(&curator),
        &json!({}),
    );
    assert_eq!(archived.status, 200, "{:?}", archived.body);
    assert_eq!(archived.body["archived"], true);
    let (acknowledged, odd) = trainer.join().unwrap();
    assert!(
        odd.is_empty(),
        "answers other than 200 or archived: {odd:?}"
    );
    assert!(
        acknowledged >= 10,
        "only {acknowledged} steps before the archive"
    );
    assert!(acknowledged < 400, "the archive came after the whole trace");
    // Every shard logs the same steps: the acknowledged ones (and at most one
    // more, a step whose answer was lost before the archive refused its retry).
    let logged = cluster.logged_steps(&shards[0]).len();
    assert!(
        logged == acknowledged || logged == acknowledged + 1,
        "{logged} steps logged, {acknowledged} acknowledged"
    );
    for shard in &shards {
        assert_eq!(records(&cluster, shard, 6), 1, "{shard}");
        assert_eq!(cluster.logged_steps(shard).len(), logged, "{shard}");
    }
    assert_eq!(archived.body["status"]["steps"], logged as u64);
}

/// How many records of `kind` (6: archived, 3: refresh) `dataset`'s log holds.
fn records(cluster: &Cluster, dataset: &str, kind: i16) -> i64 {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(
            &format!("SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = {kind}"),
            &[&dataset],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

#[test]
fn refreshes_of_a_sharded_dataset_account_like_one_ledger_and_once_per_shard() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let (n, q) = (40u64, 0.4);
    let mut config = poisson_config(n, q, 1.0);
    config["individual_budget"] = json!({"epsilon": 5.0, "delta": 1e-5});
    for (id, shards) in [("plain", Value::Null), ("big", json!(4))] {
        let r = post(
            &url(0, "/v1/datasets"),
            Some(&admin),
            &json!({"id": id, "config": config, "shards": shards}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let shards: Vec<String> = (0..4).map(|s| format!("big~{}", s * 10)).collect();
    let trace = poisson_trace(11, n, q, 16);
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(26);
    let mut refreshes = 0;
    for (t, step) in trace.iter().enumerate() {
        let a = post(&url(t, "/v1/datasets/plain/steps"), Some(&admin), step);
        let b = post(&url(t + 1, "/v1/datasets/big/steps"), Some(&admin), step);
        assert_eq!((a.status, &a.body), (200, &b.body), "step {t}");
        if t % 4 != 3 {
            continue;
        }
        // A full-batch refresh, ids in a shuffled order, with a key; the
        // same request again through another node is answered the same.
        let mut ids: Vec<u64> = (0..n).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        let norms: Vec<f64> = ids.iter().map(|_| rng.random::<f64>() * 1.5).collect();
        let body = json!({"ids": ids, "norms": norms});
        let key = format!("refresh-{t}");
        let a = post_keyed(&url(t, "/v1/datasets/plain/refresh"), &admin, &key, &body);
        let b = post_keyed(&url(t + 2, "/v1/datasets/big/refresh"), &admin, &key, &body);
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(b.status, 200, "{:?}", b.body);
        assert_eq!(a.body["thresholds"], b.body["thresholds"], "refresh at {t}");
        assert_eq!(a.body["effective_step"], b.body["effective_step"]);
        assert_eq!(sorted(&a.body["retired"]), sorted(&b.body["retired"]));
        let again = post_keyed(&url(t + 1, "/v1/datasets/big/refresh"), &admin, &key, &body);
        assert_eq!(again.status, 200, "{:?}", again.body);
        assert_eq!(again.body["thresholds"], b.body["thresholds"]);
        refreshes += 1;
    }
    // A refresh of ids of one shard, and one of none, reach every shard (the
    // same checkpoints in every shard's log, as in one ledger's).
    for (key, body) in [
        ("one", json!({"ids": [12, 17], "norms": [0.3, 0.9]})),
        ("none", json!({"ids": [], "norms": []})),
    ] {
        let a = post_keyed(&url(0, "/v1/datasets/plain/refresh"), &admin, key, &body);
        let b = post_keyed(&url(1, "/v1/datasets/big/refresh"), &admin, key, &body);
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "{key}");
        refreshes += 1;
    }
    for shard in &shards {
        assert_eq!(records(&cluster, shard, 3), refreshes, "{shard}");
    }
    // A bad refresh is refused before any shard sees it.
    let r = post_keyed(
        &url(2, "/v1/datasets/big/refresh"),
        &admin,
        "bad",
        &json!({"ids": [1, 39], "norms": [0.5, -1.0]}),
    );
    assert_eq!((r.status, r.body["field"].clone()), (400, json!("norms")));
    // Then the same accounting everywhere: one more step, every example, the
    // thresholds, the status.
    let step = json!({"step": 16, "ids": [1, 12, 17, 33], "norms": [0.2, 0.4, 0.6, 0.8]});
    let a = post(&url(0, "/v1/datasets/plain/steps"), Some(&admin), &step);
    let b = post(&url(1, "/v1/datasets/big/steps"), Some(&admin), &step);
    assert_eq!((a.status, &a.body), (200, &b.body));
    for id in 0..n {
        let path = |d: &str| format!("/v1/datasets/{d}/examples/{id}/privacy");
        let a = get(&url(id as usize, &path("plain")), Some(&admin));
        let b = get(&url(id as usize + 1, &path("big")), Some(&admin));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    let a = get(&url(0, "/v1/datasets/plain/thresholds"), Some(&admin));
    let b = get(&url(1, "/v1/datasets/big/thresholds"), Some(&admin));
    assert_eq!(a.body, b.body);
    let a = get(&url(0, "/v1/datasets/plain"), Some(&admin));
    let b = get(&url(1, "/v1/datasets/big"), Some(&admin));
    for field in ["steps", "retired", "over_budget", "guarantee"] {
        assert_eq!(a.body["status"][field], b.body["status"][field], "{field}");
    }
}

fn sorted(ids: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    v.sort_unstable();
    v
}

/// POST with an `Idempotency-Key`.
fn post_keyed(url: &str, token: &str, key: &str, body: &Value) -> Reply {
    let r = ureq::post(url)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Idempotency-Key", key)
        .send_json(body.clone());
    let (status, r) = match r {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("POST {url}: {e}"),
    };
    Reply {
        status,
        content_type: r.content_type().to_string(),
        body: r.into_json().unwrap_or(Value::Null),
    }
}

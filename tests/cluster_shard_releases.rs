//! Releases of a sharded dataset (`docs/sharding.md`
//! "Releases"): real node processes on loopback and the
//! real PostgreSQL. One seeded trace is accounted by one unsharded dataset and
//! by a 4-shard dataset on 3 nodes; with the test-only release seed
//! (`--insecure-test-release-seed`, the same random stream for both) every
//! release must publish the same values, which it does only when its
//! mechanisms received bit-identical merged statistics, and charge every shard
//! exactly once: per-example privacy, the worst case and the budget stay
//! identical. Also: a retried release (idempotency key) is charged once; an
//! owner that prepared a change and is told to decide without a commit aborts
//! it and lets its writes go; a SIGKILL of a shard owner during releases
//! leaves every shard with the same releases; under an individual budget each
//! shard leaves out of a release's input the examples one ledger leaves out.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::pg_schema::TestSchema;
use common::*;
use dpledger::ledger::IdempotencyKey;
use dpledger::store::cluster::{new_change_id, ClusterDb, CrossCommit, Decision};
use dpledger::store::{Record, RecordKind};
use serde_json::{json, Value};
use std::time::Duration;

const N: u64 = 60;
const Q: f64 = 0.3;

fn config() -> Value {
    budgeted_config(N, Q, 40.0)
}

/// Labels whose first use in the dataset (`x`, then `y`) differs from the
/// order in which later shards meet them (`y` first).
fn labels() -> Value {
    mixed_labels(N)
}

/// The cluster with the test-only release seed on every node.
fn seeded_cluster() -> Option<Cluster> {
    let cluster = Cluster::start_with(3, 4000, |_| {
        vec!["--insecure-test-release-seed".into(), "20261126".into()]
    })?;
    cluster.wait_active(3);
    Some(cluster)
}

/// `(plain, sharded)` created with the same configuration and labels.
fn create_both(cluster: &Cluster, sharded: &str) {
    let admin = cluster.admin_token();
    let plain = post(
        &format!("{}/v1/datasets", cluster.nodes[0].url),
        Some(&admin),
        &json!({"id": format!("{sharded}-plain"), "config": config(), "labels": labels()}),
    );
    assert_eq!(plain.status, 201, "{:?}", plain.body);
    let created = post(
        &format!("{}/v1/datasets", cluster.nodes[1].url),
        Some(&admin),
        &json!({"id": sharded, "config": config(), "labels": labels(), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
}

/// Release records of `dataset` in the log.
fn logged_releases(cluster: &Cluster, dataset: &str) -> i64 {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = 4",
            &[&dataset],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

/// A release answer without its wall-clock time.
fn timeless(mut v: Value) -> Value {
    if let Some(r) = v.get_mut("release").and_then(Value::as_object_mut) {
        r.remove("released_at");
    }
    if let Some(r) = v.as_object_mut() {
        r.remove("released_at");
    }
    v
}

/// A refusal without its prose (which names the dataset or the shard).
fn refusal(r: &Reply) -> Value {
    let mut v = r.body.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("detail");
        o.remove("instance");
    }
    json!({"status": r.status, "body": v})
}

#[test]
fn releases_of_four_shards_on_three_nodes_equal_one_ledgers() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    create_both(&cluster, "big");
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let curator = cluster.token_for("curator", &["big", "big-plain"], None);
    let trainer = cluster.token_for("trainer", &["big", "big-plain"], None);
    let both = |i: usize, path: &str, f: &dyn Fn(&str) -> Reply| -> (Reply, Reply) {
        let plain = f(&url(i, &format!("/v1/datasets/big-plain{path}")));
        let sharded = f(&url(i + 1, &format!("/v1/datasets/big{path}")));
        (plain, sharded)
    };
    let request = json!({
        "mean": {"rho": 0.004},
        "quantiles": {"rho": 0.004, "levels": [0.1, 0.5, 0.9]},
        "histogram": {"rho": 0.004, "bins": 6}
    });

    // Before any budget and before any step: refused alike.
    let (a, b) = both(0, "/releases", &|u| post(u, Some(&curator), &request));
    assert_eq!(a.status, 409, "{:?}", a.body);
    assert_eq!(refusal(&a), refusal(&b));
    let (a, b) = both(1, "/release-budget", &|u| {
        put(u, Some(&curator), &json!({"rho": 0.05}))
    });
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body, b.body);
    let (a, b) = both(2, "/releases", &|u| post(u, Some(&curator), &request));
    assert_eq!(
        a.status, 409,
        "nothing to release before a step: {:?}",
        a.body
    );
    assert_eq!(refusal(&a), refusal(&b));

    for (t, step) in poisson_trace(11, N, Q, 12).iter().enumerate() {
        let (a, b) = both(t, "/steps", &|u| post(u, Some(&trainer), step));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "step {t}");
    }

    // A population release, then a per-group one sent with a key whose answer
    // is "lost" and retried through another node.
    let (a, b) = both(0, "/releases", &|u| post(u, Some(&curator), &request));
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert_eq!(b.status, 201, "{:?}", b.body);
    assert_eq!(timeless(a.body.clone()), timeless(b.body.clone()));
    assert!(a.body["release"]["values"]["population"]["quantiles"].is_array());

    let mut grouped = request.clone();
    grouped["by_group"] = json!(true);
    let (a, b) = both(1, "/releases", &|u| {
        send_keyed("POST", u, &curator, "group-release-1", &grouped)
    });
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert_eq!(b.status, 201, "{:?}", b.body);
    assert_eq!(timeless(a.body.clone()), timeless(b.body.clone()));
    let groups = b.body["release"]["values"]["groups"].as_array().unwrap();
    let names: Vec<&Value> = groups.iter().map(|g| &g["label"]).collect();
    assert_eq!(names, [&json!("x"), &json!("y"), &Value::Null]);
    let retry = send_keyed(
        "POST",
        &url(2, "/v1/datasets/big/releases"),
        &curator,
        "group-release-1",
        &grouped,
    );
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert_eq!(
        retry.body, b.body,
        "a retry is answered with the release it made"
    );
    let reused = send_keyed(
        "POST",
        &url(0, "/v1/datasets/big/releases"),
        &curator,
        "group-release-1",
        &request,
    );
    assert_eq!(reused.status, 422, "{:?}", reused.body);

    // Charged once per shard: the logs, the per-example privacy, the worst
    // case and the budget.
    for s in [0, 15, 30, 45] {
        assert_eq!(logged_releases(&cluster, &format!("big~{s}")), 2);
    }
    assert_eq!(logged_releases(&cluster, "big-plain"), 2);
    for id in 0..N {
        let (a, b) = both(id as usize, &format!("/examples/{id}/privacy"), &|u| {
            get(u, Some(&curator))
        });
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    let (a, b) = both(2, "/worst-case", &|u| get(u, Some(&curator)));
    assert_eq!(a.body, b.body);
    let (a, b) = both(0, "/release-budget", &|u| get(u, Some(&curator)));
    assert_eq!(a.body, b.body);
    assert_eq!(b.body["releases"], 2);
    let (a, b) = both(1, "/releases", &|u| get(u, Some(&curator)));
    assert_eq!(a.status, 200, "{:?}", a.body);
    let list = |r: &Reply| -> Vec<Value> {
        r.body["releases"]
            .as_array()
            .unwrap()
            .iter()
            .cloned()
            .map(timeless)
            .collect()
    };
    assert_eq!(list(&a), list(&b));

    // Over the budget: refused alike, nothing charged.
    let mut big = request.clone();
    big["mean"]["rho"] = json!(0.03);
    let (a, b) = both(2, "/releases", &|u| post(u, Some(&curator), &big));
    assert_eq!(a.status, 409, "{:?}", a.body);
    assert_eq!(refusal(&a), refusal(&b));
    assert_eq!(logged_releases(&cluster, "big~30"), 2);
    // The budget cannot drop below what is spent, on either.
    let (a, b) = both(0, "/release-budget", &|u| {
        put(u, Some(&curator), &json!({"rho": 0.001}))
    });
    assert_eq!(a.status, 409, "{:?}", a.body);
    assert_eq!(refusal(&a), refusal(&b));
    // What has no sufficient statistics is refused on the sharded dataset.
    let gd = json!({"quantiles": {"rho": 0.001, "levels": [0.5], "method": "gradient_descent"}});
    let r = post(&url(0, "/v1/datasets/big/releases"), Some(&curator), &gd);
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(r.body["field"], "quantiles.method");
}

/// The examples each release record of `dataset` left out of its input, in
/// the dataset's ids: an unsharded dataset's records, or the union of its
/// shards' (`{dataset}~{start}`, whose records name the shard's own ids).
fn logged_left_out(cluster: &Cluster, dataset: &str) -> Vec<Vec<u64>> {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    let rows: Vec<(String, Vec<u8>)> = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query(
            "SELECT dataset, payload FROM dpledger_events \
             WHERE (dataset = $1 OR dataset LIKE $1 || '~%') AND kind = 4 ORDER BY seq",
            &[&dataset],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    })
    .join()
    .unwrap();
    let mut by_release: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for (name, payload) in rows {
        let start: u64 = name.split_once('~').map_or(0, |(_, s)| s.parse().unwrap());
        let record: Value = serde_json::from_slice(&payload).unwrap();
        let ids = by_release
            .entry(record["id"].as_u64().unwrap())
            .or_default();
        for run in record["left_out"].as_array().into_iter().flatten() {
            let (a, b) = (run[0].as_u64().unwrap(), run[1].as_u64().unwrap());
            ids.extend((a..b).map(|i| start + i));
        }
    }
    by_release
        .into_values()
        .map(|mut ids| {
            ids.sort_unstable();
            ids
        })
        .collect()
}

/// Under an individual budget, a release of a sharded dataset leaves out of
/// its input the examples its cost would take past their budget (spec §6),
/// each shard its own, exactly as one ledger does: the same released values
/// (which hold only when the merged statistics are bit-identical, left-out
/// terms 0 included), the same examples left out in the logs, the same
/// per-example privacy after it; a release that would leave out everyone is
/// refused alike.
#[test]
fn releases_leave_out_examples_near_their_budget_as_one_ledger() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    let admin = cluster.admin_token();
    let q = 0.1;
    let mut config = poisson_config(N, q, 2.0);
    config["individual_budget"] = json!({"epsilon": 2.0, "delta": 1e-5});
    for (id, shards) in [("near-plain", Value::Null), ("near", json!(4))] {
        let r = post(
            &format!("{}/v1/datasets", cluster.nodes[0].url),
            Some(&admin),
            &json!({"id": id, "config": config, "shards": shards}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let url = |i: usize, d: &str, what: &str| {
        format!("{}/v1/datasets/{d}/{what}", cluster.nodes[i % 3].url)
    };
    let both = |i: usize, what: &str, f: &dyn Fn(&str) -> Reply| -> (Reply, Reply) {
        (f(&url(i, "near-plain", what)), f(&url(i + 1, "near", what)))
    };
    // Steps until a few examples retired, a retired example's id no longer
    // sent (as a trainer drops it).
    let mut retired: Vec<u64> = Vec::new();
    for (t, step) in poisson_trace(41, N, q, 300).iter().enumerate() {
        if retired.len() >= 4 {
            break;
        }
        let mut step = step.clone();
        let pairs: Vec<(Value, Value)> = step["ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(step["norms"].as_array().unwrap())
            .filter(|(id, _)| !retired.contains(&id.as_u64().unwrap()))
            .map(|(id, n)| (id.clone(), n.clone()))
            .collect();
        step["ids"] = pairs.iter().map(|p| p.0.clone()).collect();
        step["norms"] = pairs.iter().map(|p| p.1.clone()).collect();
        let (a, b) = both(t, "steps", &|u| post(u, Some(&admin), &step));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "step {t}");
        retired.extend(
            a.body["retired"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap()),
        );
    }
    assert!(retired.len() >= 4, "the run retired {retired:?}");
    let (a, b) = both(0, "release-budget", &|u| {
        put(u, Some(&admin), &json!({"rho": 100.0}))
    });
    assert_eq!(
        (a.status, b.status),
        (200, 200),
        "{:?} {:?}",
        a.body,
        b.body
    );

    // A release that leaves some out: the same values, the same examples
    // left out, the same per-example privacy after it.
    let request = json!({
        "mean": {"rho": 0.02},
        "quantiles": {"rho": 0.02, "levels": [0.25, 0.5, 0.75]}
    });
    let (a, b) = both(1, "releases", &|u| post(u, Some(&admin), &request));
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert_eq!(b.status, 201, "{:?}", b.body);
    assert_eq!(timeless(a.body.clone()), timeless(b.body.clone()));
    let (plain, sharded) = (
        logged_left_out(&cluster, "near-plain"),
        logged_left_out(&cluster, "near"),
    );
    assert_eq!(plain.len(), 1);
    assert_eq!(plain, sharded, "the examples left out");
    let out = &plain[0];
    assert!(
        !out.is_empty() && out.len() < N as usize,
        "the release should leave some examples out, not all: {out:?}"
    );
    assert!(
        retired.iter().all(|i| out.contains(i)),
        "{retired:?} {out:?}"
    );
    for id in 0..N {
        let (a, b) = both(id as usize, &format!("examples/{id}/privacy"), &|u| {
            get(u, Some(&admin))
        });
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    let (a, b) = both(2, "worst-case", &|u| get(u, Some(&admin)));
    assert_eq!(a.body, b.body);

    // A release whose cost passes every example's budget is refused alike
    // (it would tell nothing), and nothing is charged.
    let huge = json!({"mean": {"rho": 50.0}});
    let (a, b) = both(2, "releases", &|u| post(u, Some(&admin), &huge));
    assert_eq!(a.status, 409, "{:?}", a.body);
    assert_eq!(refusal(&a), refusal(&b));
    assert!(
        b.body["detail"]
            .as_str()
            .unwrap_or("")
            .contains("every example"),
        "{:?}",
        b.body
    );
    assert_eq!(logged_left_out(&cluster, "near").len(), 1);
    let (a, b) = both(0, "release-budget", &|u| get(u, Some(&admin)));
    assert_eq!(a.body, b.body);
    assert_eq!(b.body["releases"], 1);
}

/// An owner that prepared a change and is asked to decide before any commit
/// decides it aborted (in PostgreSQL), and its shard's steps flow again.
#[test]
fn a_prepared_change_without_a_commit_is_aborted_and_releases_the_shard() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    create_both(&cluster, "held");
    let curator = cluster.token_for("curator", &["held"], None);
    let trainer = cluster.token_for("trainer", &["held"], None);
    let (owner, _) = cluster.wait_owner("held~0", None, Duration::from_secs(20));
    let node = cluster.nodes.iter().find(|n| n.id == owner).unwrap();
    // The protocol's calls by hand, with node marks made from the cluster's
    // secret (as a node makes them; each mark is good once).
    let sent = std::cell::Cell::new(0u64);
    let marked = |path: &str, token: &str, body: &Value| {
        sent.set(sent.get() + 1);
        let at = dpledger::engine::cluster::unix_ms() + sent.get();
        let mark = cluster.node_mark("n1", path, body, at);
        post_marked(
            &format!("{}{path}", node.url),
            Some(token),
            body,
            Some(&mark),
        )
    };
    let prepare = "/v1/datasets/held~0/shard-changes/abc123/prepare";
    let r = marked(prepare, &curator, &json!({"budget": 0.5}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["budget"]["releases"], 0);
    let again = marked(prepare, &curator, &json!({"budget": 0.5}));
    assert_eq!(
        again.status, 409,
        "one prepare per change id: {:?}",
        again.body
    );
    let decide = "/v1/datasets/held~0/shard-changes/abc123/decide";
    let d = marked(decide, &curator, &json!({}));
    assert_eq!(d.status, 200, "{:?}", d.body);
    assert_eq!(d.body["decision"], "aborted");
    // Decided once: asking again gives the same.
    let d = marked(decide, &curator, &json!({}));
    assert_eq!(d.body["decision"], "aborted");
    // Nothing was written, and the shard takes steps again.
    let step = json!({"step": 0, "ids": [0, 20, 40], "norms": [0.5, 0.5, 0.5]});
    let r = post(
        &format!("{}/v1/datasets/held/steps", cluster.nodes[2].url),
        Some(&trainer),
        &step,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let budget = get(
        &format!("{}/v1/datasets/held/release-budget", cluster.nodes[0].url),
        Some(&curator),
    );
    assert_eq!(budget.body["rho_budget"], Value::Null, "{:?}", budget.body);
    // A trainer's token on a node's call is refused: the token is still
    // authorised when one is sent.
    let r = marked(
        "/v1/datasets/held~0/shard-changes/x/prepare",
        &trainer,
        &json!({"budget": 0.5}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(
        r.body["type"], "urn:dpledger:problem:forbidden",
        "{:?}",
        r.body
    );
    // A prepare is validated by the owner as the coordinator validates a
    // release: a clear 4xx, never a computation on it.
    for (body, field) in [
        (
            json!({"release": {"histogram": {"rho": 0.1, "bins": 0}}}),
            "bins",
        ),
        (json!({"budget": -1.0}), "rho"),
    ] {
        let r = marked(
            "/v1/datasets/held~0/shard-changes/v/prepare",
            &curator,
            &body,
        );
        assert_eq!(r.status, 400, "{body}: {:?}", r.body);
        assert!(
            r.body["detail"].as_str().unwrap_or("").contains(field),
            "{body}: {:?}",
            r.body
        );
    }
    // The node still serves: its shard takes the next step.
    let step = json!({"step": 1, "ids": [1], "norms": [0.5]});
    let r = post(
        &format!("{}/v1/datasets/held/steps", cluster.nodes[2].url),
        Some(&trainer),
        &step,
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
}

/// SIGKILL of one shard's owner while releases are being made: whatever each
/// release's outcome, every shard ends with the same releases.
#[test]
fn a_killed_owner_leaves_every_shard_charged_or_none() {
    let Some(mut cluster) = seeded_cluster() else {
        return;
    };
    create_both(&cluster, "kill");
    let curator = cluster.token_for("curator", &["kill"], None);
    let trainer = cluster.token_for("trainer", &["kill"], None);
    let url = |c: &Cluster, i: usize, path: &str| format!("{}{path}", c.nodes[i].url);
    let r = put(
        &url(&cluster, 0, "/v1/datasets/kill/release-budget"),
        Some(&curator),
        &json!({"rho": 10.0}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    for step in poisson_trace(3, N, Q, 4) {
        let r = post(
            &url(&cluster, 0, "/v1/datasets/kill/steps"),
            Some(&trainer),
            &step,
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // The victim owns shard kill~15; releases go through another node.
    let (victim, _) = cluster.wait_owner("kill~15", None, Duration::from_secs(20));
    let v = cluster.nodes.iter().position(|n| n.id == victim).unwrap();
    let coordinator = (v + 1) % 3;
    let target = url(&cluster, coordinator, "/v1/datasets/kill/releases");
    let token = curator.clone();
    let releases = std::thread::spawn(move || {
        (0..6)
            .map(|_| post(&target, Some(&token), &json!({"mean": {"rho": 0.01}})).status)
            .collect::<Vec<u16>>()
    });
    std::thread::sleep(Duration::from_millis(150));
    cluster.nodes[v].kill();
    let statuses = releases.join().unwrap();
    eprintln!("releases around the kill: {statuses:?}");
    assert!(
        statuses.iter().all(|s| [201, 503].contains(s)),
        "{statuses:?}"
    );
    cluster.wait_owner("kill~15", Some(&victim), Duration::from_secs(30));
    // One more release after the takeover succeeds (retrying while leases move).
    let after = post_retrying(
        &url(&cluster, coordinator, "/v1/datasets/kill/releases"),
        &curator,
        &json!({"mean": {"rho": 0.01}}),
        Duration::from_secs(30),
    );
    assert_eq!(after.status, 201, "{:?}", after.body);
    let counts: Vec<i64> = [0, 15, 30, 45]
        .iter()
        .map(|s| logged_releases(&cluster, &format!("kill~{s}")))
        .collect();
    assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
    let committed = statuses.iter().filter(|&&s| s == 201).count() as i64;
    // The committed ones and the one after the takeover, at least.
    assert!(counts[0] > committed, "{counts:?} {statuses:?}");
    // Every shard's book in memory says the same as the logs.
    for s in [0, 15, 30, 45] {
        let budget = get_retrying(
            &cluster,
            &format!("/v1/datasets/kill~{s}/release-budget"),
            &curator,
            Duration::from_secs(30),
        );
        assert_eq!(budget["releases"], counts[0], "kill~{s}: {budget:?}");
    }
}

fn release_record(dataset: &str) -> Record {
    Record {
        dataset: dataset.into(),
        kind: RecordKind::Release,
        step: None,
        part: None,
        payload: b"{}".to_vec(),
    }
}

/// The commit across shards at the database: all records or none (a stale
/// epoch on one shard refuses every shard's), and exactly one of an owner's
/// abort and the coordinator's commit (whichever comes first) decides.
#[test]
fn the_database_commits_a_change_to_every_shard_or_to_none() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let store = dpledger::store::open(&schema.url).expect("store");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ttl = Duration::from_secs(30);
    let db = rt
        .block_on(ClusterDb::connect(&schema.url, Duration::from_secs(5)))
        .expect("cluster tables");
    for shard in ["t~0", "t~5"] {
        assert_eq!(rt.block_on(db.claim_new(shard, "a", ttl)).unwrap(), Some(1));
    }
    let count = |dataset: &str| -> i64 {
        let (url, dataset) = (schema.url.clone(), dataset.to_string());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.query_one(
                "SELECT count(*) FROM dpledger_events WHERE dataset = $1",
                &[&dataset],
            )
            .unwrap()
            .get(0)
        })
        .join()
        .unwrap()
    };
    let both = |e0: u64, e1: u64| vec![(release_record("t~0"), e0), (release_record("t~5"), e1)];
    // Change ids carry the time they were made (`new_change_id`).
    let (c1, c2, c3, c4) = (
        new_change_id(),
        new_change_id(),
        new_change_id(),
        new_change_id(),
    );
    // One shard's epoch is stale: nothing is written, to any shard.
    let fenced = rt
        .block_on(db.commit_across(&c1, both(1, 7), None))
        .unwrap();
    assert!(matches!(fenced, CrossCommit::Fenced(_)), "{fenced:?}");
    assert_eq!((count("t~0"), count("t~5")), (0, 0));
    assert_eq!(rt.block_on(db.decide(&c1)).unwrap(), Decision::Aborted);
    // An owner decided first (its wait ran out): the commit writes nothing.
    assert_eq!(rt.block_on(db.decide(&c2)).unwrap(), Decision::Aborted);
    let late = rt
        .block_on(db.commit_across(&c2, both(1, 1), None))
        .unwrap();
    assert_eq!(late, CrossCommit::Decided);
    assert_eq!((count("t~0"), count("t~5")), (0, 0));
    // The commit first: every shard has its record, and owners read "commit".
    let key = IdempotencyKey {
        key: "k1".into(),
        request: b"digest".to_vec(),
        answer: b"{}".to_vec(),
    };
    let done = rt
        .block_on(db.commit_across(&c3, both(1, 1), Some(("t".into(), key.clone()))))
        .unwrap();
    let CrossCommit::Committed(seqs) = done else {
        panic!("{done:?}")
    };
    assert_eq!(seqs.len(), 2);
    assert_eq!((count("t~0"), count("t~5")), (1, 1));
    assert_eq!(rt.block_on(db.decide(&c3)).unwrap(), Decision::Committed);
    let stored = store
        .find_key("t", "k1")
        .unwrap()
        .expect("the key is stored");
    assert_eq!(stored.request, b"digest");
    // The same key again (a retry that raced): nothing more is written.
    let again = rt
        .block_on(db.commit_across(&c4, both(1, 1), Some(("t".into(), key))))
        .unwrap();
    assert_eq!(again, CrossCommit::KeyUsed);
    assert_eq!((count("t~0"), count("t~5")), (1, 1));
    // A change older than half the decisions' keep (a coordinator frozen
    // between its prepare and its commit, whose `abort` row may have been
    // pruned), or an id without a time, is refused and writes nothing.
    let made = new_change_id();
    let old_ms = u64::from_str_radix(&made[..12], 16).unwrap() - 13 * 3600 * 1000;
    let old = format!("{old_ms:012x}{}", &made[12..]);
    for id in [old.as_str(), "c5"] {
        let late = rt.block_on(db.commit_across(id, both(1, 1), None)).unwrap();
        assert_eq!(late, CrossCommit::Decided, "{id}");
    }
    assert_eq!((count("t~0"), count("t~5")), (1, 1));
    // One made now commits.
    let fresh = rt
        .block_on(db.commit_across(&made, both(1, 1), None))
        .unwrap();
    assert!(matches!(fresh, CrossCommit::Committed(_)), "{fresh:?}");
}

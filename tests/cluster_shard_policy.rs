//! Release policies of a sharded dataset (`docs/sharding.md`
//! "Release policies"): real node processes on loopback
//! and the real PostgreSQL. A 4-shard dataset on 3 nodes and an unsharded one
//! with the same policy (set at creation) are fed one seeded trace, a step at
//! a time, each due release waited for: under the test-only release seed both
//! publish the same policy releases (steps, trigger, values), every shard is
//! charged once per release, and the release the budget does not cover is
//! refused and recorded alike. The policy is then changed and removed through
//! any node (one record per shard). Steps sent without waiting, a policy
//! release due at every step: the releases coalesce, never pile up, and every
//! shard holds the same ones.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const N: u64 = 60;
const Q: f64 = 0.3;
const SHARDS: [u64; 4] = [0, 15, 30, 45];

fn config() -> Value {
    budgeted_config(N, Q, 40.0)
}

fn labels() -> Value {
    mixed_labels(N)
}

/// What the policy releases (rho 0.008 in all).
fn request() -> Value {
    json!({
        "mean": {"rho": 0.002},
        "quantiles": {"rho": 0.002, "levels": [0.1, 0.5, 0.9]},
        "histogram": {"rho": 0.004, "bins": 6},
        "by_group": true
    })
}

fn seeded_cluster() -> Option<Cluster> {
    let cluster = Cluster::start_with(3, 4000, |_| {
        vec!["--insecure-test-release-seed".into(), "20261127".into()]
    })?;
    cluster.wait_active(3);
    Some(cluster)
}

/// Records of `kind` of `dataset` in the log.
fn logged(cluster: &Cluster, dataset: &str, kind: i16) -> i64 {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = $2",
            &[&dataset, &kind],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

fn timeless(mut v: Value) -> Value {
    if let Some(r) = v.as_object_mut() {
        r.remove("released_at");
    }
    v
}

/// The release list of `path`'s dataset, newest first, without times.
fn releases(url: &str, token: &str) -> (Vec<Value>, Value) {
    let r = get(&format!("{url}/releases?limit=100"), Some(token));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let list = r.body["releases"]
        .as_array()
        .unwrap()
        .iter()
        .cloned()
        .map(timeless)
        .collect();
    (list, r.body)
}

/// Waits (at most 30 s) until `done` holds of the dataset's release list.
fn wait_for(url: &str, token: &str, what: &str, done: &dyn Fn(&[Value], &Value) -> bool) {
    let started = Instant::now();
    loop {
        let (list, body) = releases(url, token);
        if done(&list, &body) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{url}: no {what} after 30 s: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_policy_on_four_shards_releases_as_one_ledgers_policy() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    let admin = cluster.admin_token();
    let policy = json!({"every_steps": 3, "request": request()});
    for (i, (id, shards)) in [("pol-plain", Value::Null), ("pol", json!(4))]
        .iter()
        .enumerate()
    {
        let mut body = json!({"id": id, "config": config(), "labels": labels(),
                              "release_policy": policy});
        if !shards.is_null() {
            body["shards"] = shards.clone();
        }
        let r = post(
            &format!("{}/v1/datasets", cluster.nodes[i].url),
            Some(&admin),
            &body,
        );
        assert_eq!(r.status, 201, "{id}: {:?}", r.body);
    }
    let curator = cluster.token_for("curator", &["pol", "pol-plain"], None);
    let trainer = cluster.token_for("trainer", &["pol", "pol-plain"], None);
    let viewer = cluster.token_for("viewer", &["pol", "pol-plain"], None);
    let url = |i: usize, d: &str| format!("{}/v1/datasets/{d}", cluster.nodes[i % 3].url);
    // Every shard's book holds the creation's policy.
    for d in ["pol", "pol-plain"] {
        let r = get(&format!("{}/release-policy", url(2, d)), Some(&viewer));
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["policy"]["every_steps"], 3, "{:?}", r.body);
    }
    for s in SHARDS {
        assert_eq!(logged(&cluster, &format!("pol~{s}"), 8), 1);
    }
    // A budget for three releases of 0.008: the fourth is refused.
    for (i, d) in ["pol", "pol-plain"].iter().enumerate() {
        let r = put(
            &format!("{}/release-budget", url(i, d)),
            Some(&curator),
            &json!({"rho": 0.03}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }

    // One step at a time through the nodes in turn; each due release waited
    // for on both before the next step, so both describe the same steps.
    for (t, step) in poisson_trace(17, N, Q, 12).iter().enumerate() {
        for (i, d) in ["pol-plain", "pol"].iter().enumerate() {
            let r = post(&format!("{}/steps", url(t + i, d)), Some(&trainer), step);
            assert_eq!(r.status, 200, "{d} step {t}: {:?}", r.body);
        }
        let done = t as u64 + 1;
        if done % 3 != 0 {
            continue;
        }
        let due = (done / 3) as usize;
        for d in ["pol-plain", "pol"] {
            if due <= 3 {
                wait_for(&url(t, d), &curator, "policy release", &|l, _| {
                    l.len() == due
                });
            } else {
                wait_for(&url(t, d), &curator, "budget refusal", &|_, b| {
                    b["policy_error"].is_string()
                });
            }
        }
    }

    let (plain, plain_body) = releases(&url(0, "pol-plain"), &curator);
    let (sharded, sharded_body) = releases(&url(1, "pol"), &curator);
    let steps: Vec<&Value> = sharded.iter().map(|r| &r["step"]).collect();
    assert_eq!(steps, [&json!(9), &json!(6), &json!(3)]);
    assert!(
        sharded.iter().all(|r| r["trigger"] == "policy"),
        "{sharded:?}"
    );
    assert_eq!(plain, sharded, "the same releases, value for value");
    assert_eq!(plain_body["budget"], sharded_body["budget"]);
    assert_eq!(sharded_body["budget"]["releases"], 3);
    let refusal = sharded_body["policy_error"].as_str().unwrap();
    assert!(refusal.contains("budget"), "{refusal}");
    for s in SHARDS {
        assert_eq!(logged(&cluster, &format!("pol~{s}"), 4), 3, "shard {s}");
    }
    // A viewer sees the data-independent reason, alike.
    let seen = |d: &str| get(&format!("{}/release-policy", url(2, d)), Some(&viewer)).body;
    assert_eq!(seen("pol"), seen("pol-plain"));
    for id in 0..N {
        let path = format!("/examples/{id}/privacy");
        let a = get(
            &format!("{}{path}", url(id as usize, "pol-plain")),
            Some(&curator),
        );
        let b = get(
            &format!("{}{path}", url(id as usize + 1, "pol")),
            Some(&curator),
        );
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }

    // Changed through any node, with a key: one record per shard; a retry
    // is answered alike and writes nothing.
    let every2 = json!({"policy": {"every_steps": 2, "request": {"mean": {"rho": 0.001}}}});
    let set = send_keyed(
        "PUT",
        &format!("{}/release-policy", url(2, "pol")),
        &curator,
        "policy-1",
        &every2,
    );
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert_eq!(set.body["policy"]["every_steps"], 2);
    let again = send_keyed(
        "PUT",
        &format!("{}/release-policy", url(0, "pol")),
        &curator,
        "policy-1",
        &every2,
    );
    assert_eq!(again.body, set.body);
    for s in SHARDS {
        assert_eq!(logged(&cluster, &format!("pol~{s}"), 8), 2, "shard {s}");
    }
    let r = get(&format!("{}/release-policy", url(1, "pol")), Some(&curator));
    assert_eq!(r.body["policy"], set.body["policy"]);
    assert_eq!(
        r.body["policy_error"],
        Value::Null,
        "a new policy clears it"
    );
    // What cannot be merged across shards is refused; a trainer may not set it.
    let gd = json!({"policy": {"every_steps": 2, "request":
        {"quantiles": {"rho": 0.001, "levels": [0.5], "method": "gradient_descent"}}}});
    let r = put(
        &format!("{}/release-policy", url(0, "pol")),
        Some(&curator),
        &gd,
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(r.body["field"], "quantiles.method");
    let r = put(
        &format!("{}/release-policy", url(0, "pol")),
        Some(&trainer),
        &every2,
    );
    assert_eq!(r.status, 403, "{:?}", r.body);
    // Removed: later steps release nothing.
    let r = put(
        &format!("{}/release-policy", url(1, "pol")),
        Some(&curator),
        &json!({"policy": null}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["policy"], Value::Null);
    for (t, step) in poisson_trace(18, N, Q, 4).iter().enumerate() {
        let mut step = step.clone();
        step["step"] = json!(12 + t);
        let r = post(&format!("{}/steps", url(t, "pol")), Some(&trainer), &step);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // A curator's release after them: the book has no policy release since.
    let r = post(
        &format!("{}/releases", url(2, "pol")),
        Some(&curator),
        &json!({"mean": {"rho": 0.001}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let (list, _) = releases(&url(0, "pol"), &curator);
    let steps: Vec<(&Value, &Value)> = list.iter().map(|r| (&r["step"], &r["trigger"])).collect();
    assert_eq!(steps[0], (&json!(16), &json!("request")));
    assert_eq!(steps[1], (&json!(9), &json!("policy")));
}

/// Steps sent as fast as they answer with a policy release due at every
/// step: no step waits or is refused, releases coalesce (each describes a
/// distinct, later step), and every shard holds every one of them.
#[test]
fn due_releases_faster_than_releases_coalesce_and_charge_every_shard() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    let admin = cluster.admin_token();
    let created = post(
        &format!("{}/v1/datasets", cluster.nodes[0].url),
        Some(&admin),
        &json!({"id": "fast", "config": config(), "labels": labels(), "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let curator = cluster.token_for("curator", &["fast"], None);
    let trainer = cluster.token_for("trainer", &["fast"], None);
    let url = |i: usize| format!("{}/v1/datasets/fast", cluster.nodes[i % 3].url);
    let r = put(
        &format!("{}/release-budget", url(1)),
        Some(&curator),
        &json!({"rho": 1.0}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = put(
        &format!("{}/release-policy", url(2)),
        Some(&curator),
        &json!({"policy": {"every_steps": 1, "request": {"mean": {"rho": 0.001}}}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let trace = poisson_trace(19, N, Q, 30);
    for (t, step) in trace.iter().enumerate() {
        // Plain posts: a step is never refused or made to fail because
        // releases fall due faster than they are made.
        let r = post(&format!("{}/steps", url(t)), Some(&trainer), step);
        assert_eq!(r.status, 200, "step {t}: {:?}", r.body);
    }
    // The last step's release (or the one deferred behind it) describes step 30.
    wait_for(&url(0), &curator, "release of step 30", &|l, _| {
        l.first().is_some_and(|r| r["step"] == 30)
    });
    let (list, body) = releases(&url(1), &curator);
    assert!(body["policy_error"].is_null(), "{body}");
    let steps: Vec<u64> = list.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert!(
        steps.windows(2).all(|w| w[0] > w[1]),
        "one release per step at most, newest first: {steps:?}"
    );
    assert!(list.iter().all(|r| r["trigger"] == "policy"));
    assert_eq!(body["budget"]["releases"], list.len());
    for s in SHARDS {
        assert_eq!(
            logged(&cluster, &format!("fast~{s}"), 4),
            list.len() as i64,
            "shard {s}"
        );
    }
}

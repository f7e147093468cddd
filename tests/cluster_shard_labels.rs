//! Labels after creation and shuffled sampling on a sharded dataset (
//! `docs/sharding.md` "Labels after creation and shuffled sampling"): real node processes on loopback and the real PostgreSQL. One
//! trace is accounted by one unsharded dataset and by a 4-shard dataset on 3
//! nodes; every answer must be identical.
//!
//! * Labels set after creation (new names whose first use is in a later shard,
//!   in list order rather than id order; a relabel; a removal) answer the same
//!   groups, are charged to every shard once (a retried key included), refuse
//!   alike, and per-group releases (with the test-only release seed) publish
//!   the same values in the same group order.
//! * Shuffled sampling: every shard counts the dataset's epochs (`ceil(n/b)`
//!   steps), so steps, epoch refusals, per-example privacy, thresholds and the
//!   worst case are bit-identical to the unsharded ledger's.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::{json, Value};

const N: u64 = 60;
const SHARDS: [u64; 4] = [0, 15, 30, 45];

/// The cluster with the test-only release seed on every node.
fn seeded_cluster() -> Option<Cluster> {
    let cluster = Cluster::start_with(3, 4000, |_| {
        vec!["--insecure-test-release-seed".into(), "20261127".into()]
    })?;
    cluster.wait_active(3);
    Some(cluster)
}

/// Creation labels of the first 40 examples: `y` first used (id 1) before `x`
/// (id 12); shard 1 (15..30) and shard 2 (30..45) meet only `x`, shard 3 none.
fn creation_labels() -> Value {
    let labels: Vec<Value> = (0..40u64)
        .map(|i| match i {
            i if i < 10 && i % 4 == 1 => json!("y"),
            i if i >= 10 && i % 3 == 0 => json!("x"),
            _ => Value::Null,
        })
        .collect();
    json!(labels)
}

/// `f(u)`, again while it answers 503 (a lease moving while the cluster
/// balances, shards apart, a fenced change: nothing was applied), at most 100
/// times.
fn settled(f: &dyn Fn(&str) -> Reply, u: &str) -> Reply {
    let mut r = f(u);
    for _ in 0..100 {
        if r.status != 503 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        r = f(u);
    }
    r
}

/// A reply without its prose (which names the dataset).
fn refusal(r: &Reply) -> Value {
    let mut v = r.body.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("detail");
        o.remove("instance");
    }
    json!({"status": r.status, "body": v})
}

/// A release answer without its wall-clock time.
fn timeless(mut v: Value) -> Value {
    if let Some(r) = v.get_mut("release").and_then(Value::as_object_mut) {
        r.remove("released_at");
    }
    v
}

/// Labels records (kind 7) of `dataset` in the log.
fn logged_labels(cluster: &Cluster, dataset: &str) -> i64 {
    let (url, dataset) = (cluster.schema.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = 7",
            &[&dataset],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

#[test]
fn labels_after_creation_on_four_shards_equal_one_ledgers() {
    let Some(cluster) = seeded_cluster() else {
        return;
    };
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let config = poisson_config(N, 0.3, 1.0);
    // "lab" with creation labels, "bare" without any.
    for (id, labels) in [("lab", creation_labels()), ("bare", Value::Null)] {
        let plain = post(
            &url(0, "/v1/datasets"),
            Some(&admin),
            &json!({"id": format!("{id}-plain"), "config": config, "labels": labels}),
        );
        assert_eq!(plain.status, 201, "{:?}", plain.body);
        let sharded = post(
            &url(1, "/v1/datasets"),
            Some(&admin),
            &json!({"id": id, "config": config, "labels": labels, "shards": 4}),
        );
        assert_eq!(sharded.status, 201, "{:?}", sharded.body);
    }
    let all = ["lab", "lab-plain", "bare", "bare-plain"];
    let curator = cluster.token_for("curator", &all, None);
    let trainer = cluster.token_for("trainer", &all, None);
    let both = |d: &str, i: usize, path: &str, f: &dyn Fn(&str) -> Reply| -> (Reply, Reply) {
        let plain = settled(f, &url(i, &format!("/v1/datasets/{d}-plain{path}")));
        let sharded = settled(f, &url(i + 1, &format!("/v1/datasets/{d}{path}")));
        (plain, sharded)
    };
    for d in ["lab", "bare"] {
        let (a, b) = both(d, 0, "/release-budget", &|u| {
            put(u, Some(&curator), &json!({"rho": 0.5}))
        });
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body);
    }
    let trace = poisson_trace(5, N, 0.3, 10);
    let step_both = |steps: &[Value], offset: usize| {
        for (t, step) in steps.iter().enumerate() {
            for d in ["lab", "bare"] {
                let (a, b) = both(d, t + offset, "/steps", &|u| post(u, Some(&trainer), step));
                assert_eq!(a.status, 200, "{:?}", a.body);
                assert_eq!(a.body, b.body, "{d} step {t}");
            }
        }
    };
    step_both(&trace[..5], 0);

    let request = json!({
        "mean": {"rho": 0.004},
        "quantiles": {"rho": 0.004, "levels": [0.25, 0.5, 0.75]},
        "histogram": {"rho": 0.004, "bins": 5},
        "by_group": true
    });
    // Groups of a dataset without labels: refused alike.
    let (a, b) = both("bare", 2, "/releases", &|u| {
        post(u, Some(&curator), &request)
    });
    assert_eq!(a.status, 409, "{:?}", a.body);
    assert_eq!(refusal(&a), refusal(&b));
    assert_eq!(b.body["field"], "by_group");

    // Bad assignments: refused alike (the whole dataset's ids and names).
    for (body, field) in [
        (json!({"ids": [60], "labels": ["a"]}), "ids"),
        (json!({"ids": [1, 2], "labels": ["a"]}), "labels"),
        (json!({"ids": [1], "labels": [""]}), "labels"),
        (json!({"ids": [1], "labels": ["a"], "x": 1}), ""),
    ] {
        for d in ["lab", "bare"] {
            let (a, b) = both(d, 1, "/labels", &|u| put(u, Some(&curator), &body));
            assert_eq!(a.status / 100, 4, "{body}: {:?}", a.body);
            assert_eq!(refusal(&a), refusal(&b), "{d} {body}");
            if !field.is_empty() {
                assert_eq!(b.body["field"], field, "{body}: {:?}", b.body);
            }
        }
    }
    // A viewer may not label.
    let viewer = cluster.token("viewer", Some("lab"), None);
    let r = put(
        &url(0, "/v1/datasets/lab/labels"),
        Some(&viewer),
        &json!({"ids": [1], "labels": ["a"]}),
    );
    assert_eq!(r.status, 403, "{:?}", r.body);

    // New names first used in later shards, in list order (z at id 50 in
    // shard 3 before w at id 17 in shard 1), a label removed (id 1).
    let first = json!({"ids": [50, 17, 1, 58, 20], "labels": ["z", "w", null, "z", "x"]});
    let (a, b) = both("lab", 0, "/labels", &|u| put(u, Some(&curator), &first));
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body, b.body);
    assert_eq!(b.body["groups"], json!(["y", "x", "z", "w"]));
    let (a, b) = both("bare", 0, "/labels", &|u| put(u, Some(&curator), &first));
    assert_eq!(a.body, b.body);
    assert_eq!(b.body["groups"], json!(["z", "w", "x"]));

    step_both(&trace[5..8], 5);

    // With a key, answered once and retried through another node; a relabel
    // (id 0 from null to z, id 44 from none to y) and a name new to every
    // shard but the one that uses it (v at 31).
    let second = json!({"ids": [31, 0, 44], "labels": ["v", "z", "y"]});
    let (a, b) = both("lab", 1, "/labels", &|u| {
        send_keyed("PUT", u, &curator, "labels-2", &second)
    });
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.body, b.body);
    assert_eq!(b.body["groups"], json!(["y", "x", "z", "w", "v"]));
    let before: Vec<i64> = SHARDS
        .iter()
        .map(|s| logged_labels(&cluster, &format!("lab~{s}")))
        .collect();
    let retry = settled(
        &|u| send_keyed("PUT", u, &curator, "labels-2", &second),
        &url(0, "/v1/datasets/lab/labels"),
    );
    assert_eq!((retry.status, &retry.body), (200, &b.body));
    let reused = settled(
        &|u| send_keyed("PUT", u, &curator, "labels-2", &first),
        &url(2, "/v1/datasets/lab/labels"),
    );
    assert_eq!(reused.status, 422, "{:?}", reused.body);
    // One record per shard per change: the creation's slice (shards 0-2),
    // then one for each of the two changes; the retry wrote nothing.
    for (s, count) in SHARDS.iter().zip(&before) {
        let created = i64::from(*s < 40);
        assert_eq!(*count, created + 2, "lab~{s}");
        assert_eq!(logged_labels(&cluster, &format!("lab~{s}")), *count);
    }
    let (a, b) = both("bare", 1, "/labels", &|u| put(u, Some(&curator), &second));
    assert_eq!(a.body, b.body);

    step_both(&trace[8..], 8);

    // Per-group releases: the same values, in the unsharded group order.
    for d in ["lab", "bare"] {
        let (a, b) = both(d, 2, "/releases", &|u| post(u, Some(&curator), &request));
        assert_eq!(a.status, 201, "{:?}", a.body);
        assert_eq!(b.status, 201, "{:?}", b.body);
        assert_eq!(timeless(a.body.clone()), timeless(b.body.clone()), "{d}");
        let labels: Vec<Value> = b.body["release"]["values"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["label"].clone())
            .collect();
        let expected = if d == "lab" {
            json!(["y", "x", "z", "w", "v", null])
        } else {
            json!(["z", "w", "x", "v", "y", null])
        };
        assert_eq!(json!(labels), expected, "{d}");
    }
    // Per-example privacy and the budget are unchanged by labels and equal.
    for id in (0..N).step_by(7) {
        let path = format!("/examples/{id}/privacy");
        let (a, b) = both("lab", id as usize, &path, &|u| get(u, Some(&curator)));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    let (a, b) = both("lab", 0, "/release-budget", &|u| get(u, Some(&curator)));
    assert_eq!(a.body, b.body);
    // A shard's own labels cannot be changed around its dataset.
    let r = put(
        &url(0, "/v1/datasets/lab~15/labels"),
        Some(&curator),
        &json!({"ids": [0], "labels": ["q"]}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(r.body["type"], "urn:dpledger:problem:sharded-unsupported");
}

/// Shuffled batches of `b` over `n` examples for `epochs` epochs (a seeded
/// permutation per epoch, the last batch short), with the noise multiplier
/// raised on some steps; then one report that uses an example twice in an
/// epoch (refused).
fn shuffled_trace(n: u64, b: u64, epochs: u64) -> Vec<Value> {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(17);
    let mut out = Vec::new();
    let mut t = 0u64;
    for _ in 0..epochs {
        let mut ids: Vec<u64> = (0..n).collect();
        ids.shuffle(&mut rng);
        for batch in ids.chunks(b as usize) {
            let norms: Vec<f64> = batch.iter().map(|_| rng.random::<f64>() * 1.3).collect();
            let mut step = json!({"step": t, "ids": batch, "norms": norms});
            if t % 5 == 3 {
                step["noise_multiplier"] = json!(1.7);
            }
            out.push(step);
            t += 1;
        }
    }
    out
}

#[test]
fn shuffled_sampling_on_four_shards_accounts_exactly_like_one_ledger() {
    let Some(cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let admin = cluster.admin_token();
    let url = |i: usize, path: &str| format!("{}{path}", cluster.nodes[i % 3].url);
    let b = 8u64;
    let mut config = poisson_config(N, 0.3, 1.0);
    config["sampling"] = json!({"kind": "shuffle", "batch_size": b});
    config["individual_budget"] = json!({"epsilon": 9.0, "delta": 1e-5});
    // epoch_steps belongs to shards only: refused on any creation.
    let mut forged = config.clone();
    forged["sampling"]["epoch_steps"] = json!(2);
    for body in [
        json!({"id": "forged", "config": forged}),
        json!({"id": "forged", "config": forged, "shards": 4}),
    ] {
        let r = post(&url(0, "/v1/datasets"), Some(&admin), &body);
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.body["field"], "sampling.epoch_steps", "{:?}", r.body);
    }
    let plain = post(
        &url(0, "/v1/datasets"),
        Some(&admin),
        &json!({"id": "shuf-plain", "config": config}),
    );
    assert_eq!(plain.status, 201, "{:?}", plain.body);
    let created = post(
        &url(1, "/v1/datasets"),
        Some(&admin),
        &json!({"id": "shuf", "config": config, "shards": 4}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    // The dataset shows its own configuration; each shard (15 examples, an
    // epoch of its own would be 2 steps) counts the dataset's 8.
    assert_eq!(created.body["config"], plain.body["config"]);
    let owners: std::collections::BTreeSet<&str> = created.body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["owner"].as_str().unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "{:?}", created.body);
    let shard = get(&url(2, "/v1/datasets/shuf~15"), Some(&admin));
    assert_eq!(shard.status, 200, "{:?}", shard.body);
    assert_eq!(
        shard.body["config"]["sampling"],
        json!({"kind": "shuffle", "batch_size": b, "epoch_steps": N.div_ceil(b)})
    );

    let trainer = cluster.token_for("trainer", &["shuf", "shuf-plain"], None);
    let both = |i: usize, path: &str, f: &dyn Fn(&str) -> Reply| -> (Reply, Reply) {
        let plain = settled(f, &url(i, &format!("/v1/datasets/shuf-plain{path}")));
        let sharded = settled(f, &url(i + 1, &format!("/v1/datasets/shuf{path}")));
        (plain, sharded)
    };
    let trace = shuffled_trace(N, b, 5);
    for (t, step) in trace.iter().enumerate() {
        let (a, b) = both(t, "/steps", &|u| post(u, Some(&trainer), step));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "step {t}");
        // Step 36 is in epoch 4 (steps 32..40) as steps 32 and 33 are: a
        // report of one of their examples in each shard is an epoch violation
        // on every shard as on the unsharded ledger, refused before any
        // change. (A shard counting its own 15 examples, 2 steps an epoch,
        // would put step 36 in another epoch than 32 and 33, and accept.)
        if t == 35 {
            let earlier: Vec<u64> = trace[32..34]
                .iter()
                .flat_map(|s| s["ids"].as_array().unwrap().iter())
                .map(|v| v.as_u64().unwrap())
                .collect();
            let ids: Vec<u64> = SHARDS
                .iter()
                .map(|&s| {
                    *earlier
                        .iter()
                        .find(|&&i| (s..s + 15).contains(&i))
                        .expect("the seeded trace has an example of every shard in steps 32-33")
                })
                .collect();
            let again = json!({"step": 36, "ids": ids, "norms": [0.5, 0.5, 0.5, 0.5]});
            let (a, b) = both(t, "/steps", &|u| post(u, Some(&trainer), &again));
            assert_eq!(a.status / 100, 4, "{:?}", a.body);
            assert_eq!(
                (a.status, &a.body["type"], &a.body["field"]),
                (b.status, &b.body["type"], &b.body["field"]),
                "{:?} {:?}",
                a.body,
                b.body
            );
        }
    }
    let view = get(&url(0, "/v1/datasets/shuf"), Some(&admin)).body;
    let plain_view = get(&url(1, "/v1/datasets/shuf-plain"), Some(&admin)).body;
    for field in ["steps", "examples", "retired", "over_budget", "pending"] {
        assert_eq!(
            view["status"][field], plain_view["status"][field],
            "{field}"
        );
    }
    assert_eq!(view["worst_case"], plain_view["worst_case"]);
    for query in ["", "?delta=0.001&conversion=classic"] {
        let (a, b) = both(2, &format!("/worst-case{query}"), &|u| get(u, Some(&admin)));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "worst-case{query}");
    }
    for id in 0..N {
        let path = format!("/examples/{id}/privacy");
        let (a, b) = both(id as usize, &path, &|u| get(u, Some(&admin)));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "example {id}");
    }
    for query in ["", "?start=5&end=47"] {
        let (a, b) = both(0, &format!("/thresholds{query}"), &|u| get(u, Some(&admin)));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "thresholds{query}");
    }
}

//! The predictable mode's refresh schedule on a sharded dataset (spec §3.2,
//! docs/sharding.md "Refresh schedules"), against three real nodes over the
//! real PostgreSQL: a round-robin block and full passes are defined over the
//! dataset's ids, each shard is due its part of them, and every answer (what
//! is due, the refreshes, the steps, every example's privacy) is the one an
//! unsharded dataset fed the same requests gives. A step before its refresh
//! and an id off the schedule are refused alike, and the bookkeeping of a
//! refresh that arrived in parts survives a node's restart (its shards move
//! or are reclaimed, replaying their logs). Shuffled batches in the
//! predictable mode (the default): every shard books each epoch at its first
//! step, as one ledger does.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const N: u64 = 40;
const Q: f64 = 0.4;
const BOUND: Duration = Duration::from_secs(60);

/// POST with an `Idempotency-Key`, retried while the answer is `503` or the
/// node is unreachable (a shard moving after a restart).
fn post_keyed_retrying(cluster: &Cluster, path: &str, key: Option<&str>, body: &Value) -> Reply {
    let started = Instant::now();
    let token = cluster.admin_token();
    let mut i = 0;
    loop {
        let url = format!("{}{path}", cluster.nodes[i % cluster.nodes.len()].url);
        let mut request = ureq::post(&url).set("Authorization", &format!("Bearer {token}"));
        if let Some(key) = key {
            request = request.set("Idempotency-Key", key);
        }
        let r = request.send_json(body.clone());
        match r {
            Ok(r) => return reply(r),
            Err(ureq::Error::Status(503, _)) | Err(ureq::Error::Transport(_)) => {}
            Err(ureq::Error::Status(_, r)) => return reply(r),
        }
        assert!(started.elapsed() < BOUND, "POST {path} kept failing");
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reply(r: ureq::Response) -> Reply {
    Reply {
        status: r.status(),
        content_type: r.content_type().to_string(),
        body: r.into_json().unwrap_or(Value::Null),
    }
}

/// The ids a `refresh_due` names.
fn due_ids(due: &Value) -> Vec<u64> {
    if due.is_null() {
        return Vec::new();
    }
    let (first, count) = (
        due["first_id"].as_u64().unwrap(),
        due["count"].as_u64().unwrap(),
    );
    (0..count).map(|j| (first + j) % N).collect()
}

/// Two refresh answers agree: the same thresholds, effective step and what
/// is due, and the same retirements, except that a refresh retried after its
/// answer was lost (a node restarting) is answered from its stored key with
/// every refreshed id retired now, which may add ids retired earlier.
fn assert_same_refresh(plain: &Value, sharded: &Value, what: &str) {
    let retired = |v: &Value| -> Vec<u64> {
        let mut ids: Vec<u64> = v["retired"]
            .as_array()
            .expect("retired")
            .iter()
            .map(|i| i.as_u64().expect("an id"))
            .collect();
        ids.sort_unstable();
        ids
    };
    let (a, b) = (retired(plain), retired(sharded));
    assert!(a.iter().all(|i| b.contains(i)), "{what}: {a:?} {b:?}");
    let without = |v: &Value| {
        let mut v = v.clone();
        v["retired"] = json!([]);
        v
    };
    assert_eq!(without(plain), without(sharded), "{what}");
}

/// Feeds `trace` to an unsharded dataset `plain` and a 4-shard one `big` of
/// `config`, through nodes in turn, as a trainer following the schedule does:
/// before each step it reads what is due, checks that the step is held and
/// that an id not due is refused, sends the due ids' norms in
/// two parts, then the step; every answer of `big` must be `plain`'s. At step
/// `restart_at` node 1 restarts between the two parts. Returns how many
/// round-robin blocks wrapped past the last id.
fn follow_the_schedule(
    cluster: &mut Cluster,
    config: &Value,
    trace: &[Value],
    restart_at: Option<usize>,
) -> usize {
    let admin = cluster.admin_token();
    for (id, shards) in [("plain", Value::Null), ("big", json!(4))] {
        let r = post(
            &format!("{}/v1/datasets", cluster.nodes[0].url),
            Some(&admin),
            &json!({"id": id, "config": config, "shards": shards}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.body["config"]["thresholds"], "predictable");
    }
    let both = |f: &mut dyn FnMut(&str) -> Reply| (f("plain"), f("big"));
    let path = |d: &str, what: &str| format!("/v1/datasets/{d}/{what}");
    let mut blocks_that_wrapped = 0;
    for (t, step) in trace.iter().enumerate() {
        let thresholds = |d: &str| get_retrying(cluster, &path(d, "thresholds"), &admin, BOUND);
        let (a, b) = (thresholds("plain"), thresholds("big"));
        assert_eq!(a, b, "the thresholds and what is due before step {t}");
        let ids = due_ids(&a["refresh_due"]);
        blocks_that_wrapped += usize::from(ids.windows(2).any(|w| w[1] < w[0]));

        // An id the schedule does not call for is refused, by both alike.
        if let Some(off) = (0..N).find(|i| !ids.contains(i)) {
            let body = json!({"ids": [off], "norms": [0.5]});
            let key = format!("off-{t}");
            let (a, b) =
                both(&mut |d| post_keyed_retrying(cluster, &path(d, "refresh"), Some(&key), &body));
            assert_eq!(a.status, 409, "{:?}", a.body);
            assert_eq!((b.status, &b.body["type"]), (a.status, &a.body["type"]));
        }

        // Held until its refresh arrived. A shard none of whose ids are due
        // applies its part: the sharded answer is then `partially-applied`,
        // and the step sent again after the refresh completes.
        if !ids.is_empty() {
            let (a, b) = both(&mut |d| post_keyed_retrying(cluster, &path(d, "steps"), None, step));
            assert_eq!(a.status, 409, "{:?}", a.body);
            assert_eq!(a.body["type"], "urn:dpledger:problem:conflict");
            assert_eq!(b.status, 409, "{:?}", b.body);
            let held =
                ["conflict", "partially-applied"].map(|t| format!("urn:dpledger:problem:{t}"));
            assert!(held.iter().any(|t| b.body["type"] == *t), "{:?}", b.body);
            let detail = b.body["detail"].as_str().unwrap_or("");
            assert!(detail.contains("refresh"), "{detail}");
        }
        // The refresh in two parts.
        let norm = |id: u64| ((id * 7919 + t as u64 * 104_729) % 1000) as f64 / 1000.0 * 1.5;
        let half = ids.len() / 2;
        for (k, part) in [&ids[..half], &ids[half..]].into_iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let norms: Vec<f64> = part.iter().map(|&i| norm(i)).collect();
            let body = json!({"ids": part, "norms": norms});
            let key = format!("refresh-{t}-{k}");
            let (a, b) =
                both(&mut |d| post_keyed_retrying(cluster, &path(d, "refresh"), Some(&key), &body));
            assert_eq!(a.status, 200, "{:?}", a.body);
            assert_eq!(b.status, 200, "{:?}", b.body);
            assert_same_refresh(&a.body, &b.body, &format!("refresh {k} before {t}"));
            if restart_at == Some(t) && k == 0 {
                cluster.restart(1);
                // What arrived before the restart is still received: sent
                // again (a new request), it is refused as a second refresh.
                let (a, b) = both(&mut |d| {
                    post_keyed_retrying(cluster, &path(d, "refresh"), Some("again"), &body)
                });
                assert_eq!(a.status, 409, "{:?}", a.body);
                assert_eq!((b.status, &b.body["type"]), (a.status, &a.body["type"]));
                let detail = b.body["detail"].as_str().unwrap_or("");
                assert!(detail.contains("already refreshed"), "{detail}");
            }
        }
        let key = format!("step-{t}");
        let (a, b) =
            both(&mut |d| post_keyed_retrying(cluster, &path(d, "steps"), Some(&key), step));
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.body, b.body, "step {t}");
    }
    for id in 0..N {
        let privacy = |d: &str| {
            get_retrying(
                cluster,
                &path(d, &format!("examples/{id}/privacy")),
                &admin,
                BOUND,
            )
        };
        assert_eq!(privacy("plain"), privacy("big"), "example {id}");
    }
    let worst = |d: &str| get_retrying(cluster, &path(d, "worst-case"), &admin, BOUND);
    assert_eq!(worst("plain"), worst("big"));
    blocks_that_wrapped
}

#[test]
fn a_round_robin_block_is_cut_by_shard_and_kept_across_a_restart() {
    let Some(mut cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let mut config = poisson_config(N, Q, 1.5);
    config["individual_budget"] = json!({"epsilon": 5.0, "delta": 1e-5});
    config["thresholds"] = json!("predictable");
    config["refresh"] = json!({"full_every": 6, "block": 7});
    let trace = poisson_trace(35, N, Q, 14);
    let wrapped = follow_the_schedule(&mut cluster, &config, &trace, Some(5));
    assert!(wrapped > 0, "some block wrapped past the last id");
}

#[test]
fn shuffled_batches_book_each_epoch_on_every_shard_like_one_ledger() {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let Some(mut cluster) = Cluster::start(3, 4000) else {
        return;
    };
    cluster.wait_active(3);
    let b = 6u64;
    let mut config = poisson_config(N, Q, 2.0);
    config["individual_budget"] = json!({"epsilon": 4.0, "delta": 1e-5});
    config["sampling"] = json!({"kind": "shuffle", "batch_size": b});
    config.as_object_mut().unwrap().remove("thresholds");
    // Epochs of ceil(40 / 6) = 7 steps; a full pass before every other one.
    config["refresh"] = json!({"full_every": 14});
    let mut rng = rand_pcg::Pcg64::seed_from_u64(36);
    let mut trace = Vec::new();
    for _ in 0..5 {
        let mut ids: Vec<u64> = (0..N).collect();
        ids.shuffle(&mut rng);
        for batch in ids.chunks(b as usize) {
            let norms: Vec<f64> = batch.iter().map(|_| rng.random::<f64>() * 1.3).collect();
            trace.push(json!({"step": trace.len(), "ids": batch, "norms": norms}));
        }
    }
    follow_the_schedule(&mut cluster, &config, &trace, Some(14));
}

#[test]
fn only_the_cluster_sets_a_shards_place_in_the_schedule() {
    let Some(cluster) = Cluster::start(1, 4000) else {
        return;
    };
    cluster.wait_active(1);
    let mut config = budgeted_config(N, Q, 3.0);
    config["thresholds"] = json!("predictable");
    config["refresh"] = json!({"block": 7, "shard": {"start": 0, "dataset_examples": N}});
    for shards in [Value::Null, json!(2)] {
        let r = post(
            &format!("{}/v1/datasets", cluster.nodes[0].url),
            Some(&cluster.admin_token()),
            &json!({"id": "mine", "config": config, "shards": shards}),
        );
        assert_eq!(r.status, 400, "{:?}", r.body);
        assert_eq!(r.body["field"], "refresh.shard", "{:?}", r.body);
    }
}

//! Predictable thresholds with shuffled batches (spec §3.6), through the HTTP
//! API of a real server: an epoch's charge is booked at its first step for
//! every example at the threshold in force for the whole epoch (a report
//! lowers nothing, an example not yet processed is charged all the same),
//! thresholds change only at epoch boundaries, a smaller noise multiplier
//! waits for the next epoch, and the filter retires examples only at epoch
//! boundaries, within their budget, across a restart.

mod common;

use common::{example_privacy, post, refresh, Reply, Server};
use serde_json::{json, Value};

const DELTA: f64 = 1e-5;
const ORDERS: [f64; 5] = [2.0, 4.0, 8.0, 16.0, 32.0];
const N: u64 = 8;
/// Batches of 2 of 8 examples: 4 steps per epoch.
const BATCH: u64 = 2;
const EPOCH: u64 = N / BATCH;
const SIGMA: f64 = 2.0;

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn config(extra: Value) -> Value {
    let mut c = json!({
        "examples": N,
        "max_grad_norm": 1.0,
        "rounding": 0.01,
        "noise_multiplier": SIGMA,
        "sampling": {"kind": "shuffle", "batch_size": BATCH},
        "orders": ORDERS,
        "delta": DELTA,
        "refresh": {"full_every": EPOCH},
    });
    for (k, v) in extra.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

fn create(server: &Server, id: &str, config: Value) -> Reply {
    post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": id, "config": config}),
    )
}

fn step(server: &Server, id: &str, body: Value) -> Reply {
    post(
        &format!("{}/v1/datasets/{id}/steps", server.url),
        Some(&server.admin_token()),
        &body,
    )
}

/// `epochs` Gaussian charges at threshold `v` (C = 1): `alpha v² / (2 σ²)` each.
fn booked(v: f64, epochs: f64) -> Vec<f64> {
    ORDERS
        .iter()
        .map(|a| epochs * a * v * v / (2.0 * SIGMA * SIGMA))
        .collect()
}

fn assert_rdp(ex: &Value, want: &[f64], what: &str) {
    let got: Vec<f64> = ex["rdp"].as_array().unwrap().iter().map(f).collect();
    for (g, w) in got.iter().zip(want) {
        // Never below the charge; rounded up by at most a few 1e-12.
        assert!(
            *g >= *w && *g <= *w * (1.0 + 1e-9),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

/// Odd examples have small gradients (0.5), even ones large (above C).
fn norm(i: u64) -> f64 {
    if i % 2 == 1 {
        0.5
    } else {
        3.0
    }
}

#[test]
fn an_epoch_is_booked_at_its_first_step_at_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let r = create(&server, "shuf", config(json!({})));
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["config"]["thresholds"], "predictable", "the default");
    let all: Vec<u64> = (0..N).collect();
    let norms: Vec<f64> = all.iter().map(|&i| norm(i)).collect();

    // The first epoch's refresh is due before step 0.
    let r = step(
        &server,
        "shuf",
        json!({"step": 0, "ids": [0, 1], "norms": [0.0, 0.0]}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    let r = refresh(&server, "shuf", &all, &norms);
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A report at norm 0 moves nothing.
    let r = step(
        &server,
        "shuf",
        json!({"step": 0, "ids": [0, 1], "norms": [0.0, 0.0]}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["thresholds"], json!([1.0, 0.5]));

    // After the epoch's first step every example bears the whole epoch at
    // its threshold, processed or not.
    for i in 0..N {
        let ex = example_privacy(&server, "shuf", i, DELTA)["example"].clone();
        assert_eq!(ex["ledger"], "threshold");
        assert_eq!(ex["ex_post"]["kind"], "ex_post");
        let v = if i % 2 == 1 { 0.5 } else { 1.0 };
        assert_rdp(&ex, &booked(v, 1.0), &format!("example {i} after step 0"));
    }
    // The rest of the epoch adds nothing; an example processed twice in one
    // epoch is refused.
    let r = step(
        &server,
        "shuf",
        json!({"step": 1, "ids": [1, 2], "norms": [0.1, 0.1]}),
    );
    assert!(r.status >= 400 && r.status < 500, "{:?}", r.body);
    for (t, ids) in [(1u64, [2u64, 3u64]), (2, [4, 5]), (3, [6, 7])] {
        let r = step(
            &server,
            "shuf",
            json!({"step": t, "ids": ids, "norms": [0.1, 0.1]}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    assert_rdp(
        &example_privacy(&server, "shuf", 7, DELTA)["example"].clone(),
        &booked(0.5, 1.0),
        "end of epoch 0",
    );

    // Epoch 1: its refresh, then its first step books it.
    let r = refresh(&server, "shuf", &all, &norms);
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = step(
        &server,
        "shuf",
        json!({"step": 4, "ids": [7, 6], "norms": [0.1, 0.1]}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let before: Vec<Value> = (0..N)
        .map(|i| example_privacy(&server, "shuf", i, DELTA)["example"].clone())
        .collect();
    assert_rdp(&before[0], &booked(1.0, 2.0), "two epochs at C");
    assert_rdp(&before[1], &booked(0.5, 2.0), "two epochs at 0.5");

    // The worst case counts each epoch as one Gaussian at C.
    let answer = example_privacy(&server, "shuf", 0, DELTA);
    assert_rdp(
        &answer["worst_case"]["rdp"],
        &booked(1.0, 2.0),
        "the worst case",
    );

    server.restart();
    for (i, ex) in (0..N).zip(&before) {
        assert_eq!(
            &example_privacy(&server, "shuf", i, DELTA)["example"].clone(),
            ex,
            "example {i} after a restart"
        );
    }
}

#[test]
fn the_schedule_and_the_noise_follow_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let r = create(&server, "block", config(json!({"refresh": {"block": 2}})));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "refresh.block");
    let r = create(
        &server,
        "odd",
        config(json!({"refresh": {"full_every": 3}})),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "refresh.full_every");

    let r = create(&server, "noise", config(json!({"refresh": null})));
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = step(
        &server,
        "noise",
        json!({"step": 0, "ids": [0, 1], "norms": [1.0, 1.0]}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    // Less noise within the epoch would exceed the booked charge.
    let body = json!({"step": 1, "ids": [2, 3], "norms": [1.0, 1.0], "noise_multiplier": 1.0});
    let r = step(&server, "noise", body);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "noise_multiplier");
    // More noise is fine, and less may start at the next epoch.
    let body = json!({"step": 1, "ids": [2, 3], "norms": [1.0, 1.0], "noise_multiplier": 4.0});
    assert_eq!(step(&server, "noise", body).status, 200);
    for t in 2..4u64 {
        let ids = [2 * t, 2 * t + 1];
        let r = step(
            &server,
            "noise",
            json!({"step": t, "ids": ids, "norms": [1.0, 1.0]}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let body = json!({"step": 4, "ids": [0, 1], "norms": [1.0, 1.0], "noise_multiplier": 1.0});
    let r = step(&server, "noise", body);
    assert_eq!(r.status, 200, "{:?}", r.body);
    let ex = example_privacy(&server, "noise", 5, DELTA)["example"].clone();
    let want: Vec<f64> = ORDERS
        .iter()
        .zip(booked(1.0, 1.0))
        .map(|(a, first)| first + a / 2.0)
        .collect();
    assert_rdp(&ex, &want, "an epoch at sigma 2, then one at sigma 1");
}

#[test]
fn the_filter_retires_shuffled_examples_only_at_epoch_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let budget = json!({"epsilon": 3.0, "delta": DELTA});
    let r = create(
        &server,
        "filt",
        config(json!({"individual_budget": budget})),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let filter = r.body["status"]["filter"].clone();
    let (order, rdp_budget) = (f(&filter["order"]), f(&filter["rdp_budget"]));
    let j = ORDERS.iter().position(|&a| a == order).expect("an order");

    let mut retired = std::collections::BTreeMap::new();
    let ids_in = |r: &Reply| -> Vec<u64> {
        r.body["retired"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    for t in 0..EPOCH * 40 {
        if t % EPOCH == 0 {
            let live: Vec<u64> = (0..N).filter(|i| !retired.contains_key(i)).collect();
            let norms: Vec<f64> = live.iter().map(|&i| norm(i)).collect();
            let r = refresh(&server, "filt", &live, &norms);
            assert_eq!(r.status, 200, "{:?}", r.body);
            for i in ids_in(&r) {
                retired.insert(i, t);
            }
        }
        let e = t % EPOCH;
        let ids = [2 * e, 2 * e + 1];
        let norms: Vec<f64> = ids.iter().map(|&i| norm(i)).collect();
        let r = step(
            &server,
            "filt",
            json!({"step": t, "ids": ids, "norms": norms}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        for i in ids_in(&r) {
            // Retired from step t + 1 on, which must begin an epoch.
            assert_eq!((t + 1) % EPOCH, 0, "{i} retired after step {t}, mid-epoch");
            retired.insert(i, t + 1);
        }
    }
    assert!(
        (0..N)
            .filter(|i| i % 2 == 0)
            .all(|i| retired.contains_key(&i)),
        "large-gradient examples retire: {retired:?}"
    );
    let first_large = (0..N).filter(|i| i % 2 == 0).map(|i| retired[&i]).min();
    assert!(
        (0..N)
            .filter(|i| i % 2 == 1)
            .all(|i| retired.get(&i).is_none_or(|&at| Some(at) > first_large)),
        "small-gradient examples train longer: {retired:?}"
    );
    let answers: Vec<Value> = (0..N)
        .map(|i| example_privacy(&server, "filt", i, DELTA)["example"].clone())
        .collect();
    for (i, ex) in (0..N).zip(&answers) {
        let r = f(&ex["rdp"][j]);
        assert!(r <= rdp_budget, "example {i}: {r} > {rdp_budget}");
        assert_eq!(ex["over_budget"], false);
        assert_eq!(ex["guarantee"]["kind"], "individual_filter", "{ex}");
        assert!(f(&ex["epsilon"]) <= 3.0 * (1.0 + 1e-9));
    }
    server.restart();
    for (i, ex) in (0..N).zip(&answers) {
        assert_eq!(
            &example_privacy(&server, "filt", i, DELTA)["example"].clone(),
            ex,
            "example {i} after a restart"
        );
    }
}

/// The booked epoch and its noise multiplier survive a ledger snapshot.
#[test]
fn a_snapshot_keeps_the_booked_epoch() {
    use dpledger::accounting::Conversion;
    use dpledger::ledger::{DatasetConfig, DatasetConfigExt, Ledger, StepReport};
    let config: DatasetConfig = serde_json::from_value(config(json!({"refresh": null}))).unwrap();
    let mut ledger = Ledger::new(config.with_creation_defaults().unwrap()).unwrap();
    ledger
        .step(&StepReport::new(0, vec![0, 1], vec![0.2, 0.2]))
        .unwrap();
    let mut back = Ledger::from_snapshot(&ledger.to_snapshot()).unwrap();
    for i in 0..N {
        let a = ledger.privacy(i, DELTA, Conversion::Improved).unwrap();
        let b = back.privacy(i, DELTA, Conversion::Improved).unwrap();
        assert_eq!(a.rdp, b.rdp, "example {i}");
        assert_eq!(a.estimate, b.estimate, "example {i}");
        assert!(a.rdp[0] > 0.0, "example {i} is charged for the epoch");
    }
    // Processed at 0.2 below its threshold C: the discounted ledger, which
    // the estimate reads, charges the epoch at 0.2.
    let at = |i: u64| back.privacy(i, DELTA, Conversion::Improved).unwrap();
    assert_eq!(at(0).rdp, at(2).rdp);
    assert!(at(0).estimate.epsilon < at(2).estimate.epsilon);
    let mut less_noise = StepReport::new(1, vec![2, 3], vec![0.2, 0.2]);
    less_noise.noise_multiplier = Some(1.0);
    assert!(ledger.step(&less_noise).is_err());
    assert!(back.step(&less_noise).is_err(), "the booked noise survives");
}

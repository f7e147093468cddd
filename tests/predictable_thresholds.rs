//! Per-example numbers that are true (spec §3, §7, §10), through the HTTP API
//! of a real server: predictable thresholds (a step report never moves one;
//! refreshes only on the public schedule, a step held until its refresh
//! arrived), the three labelled parts of every per-example answer, the ex-post
//! bound checked exactly against the mechanism's privacy loss in the
//! full-batch counterexample, the individual filter's guarantee, and datasets
//! of the old protocol replaying as `sampled`.

mod common;

use common::{example_privacy, example_privacy_with, get, post, refresh, Server};
use serde_json::{json, Value};

const DELTA: f64 = 1e-5;

fn config(n: u64, q: f64, extra: Value) -> Value {
    let mut c = json!({
        "examples": n,
        "max_grad_norm": 1.0,
        "rounding": 0.01,
        "noise_multiplier": 1.0,
        "sampling": {"kind": "poisson", "rate": q},
        "delta": DELTA,
    });
    for (k, v) in extra.as_object().expect("object") {
        c[k] = v.clone();
    }
    c
}

fn create(server: &Server, id: &str, config: Value) -> Value {
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": id, "config": config}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    r.body
}

fn step(server: &Server, id: &str, t: u64, ids: &[u64], norms: &[f64]) -> common::Reply {
    post(
        &format!("{}/v1/datasets/{id}/steps", server.url),
        Some(&server.admin_token()),
        &json!({"step": t, "ids": ids, "norms": norms}),
    )
}

/// The ids an answer says were retired.
fn retired_in(answer: &Value) -> Vec<u64> {
    answer["retired"]
        .as_array()
        .expect("retired")
        .iter()
        .map(|v| v.as_u64().expect("an id"))
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Spec §10, hidden sampling: norm 0 at step 0, C at step 1, the example
/// sampled both times. The old protocol served epsilon 0; in the predictable
/// mode the report at norm 0 lowers nothing (the example is charged at its
/// threshold C at both steps), and in the sampled mode the low number is only
/// an estimate while the guarantee is the worst case.
#[test]
fn a_sampled_report_at_norm_zero_does_not_lower_later_charges() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let q = 256.0 / 60000.0;
    create(&server, "pred", config(4, q, json!({})));
    create(
        &server,
        "old",
        config(4, q, json!({"thresholds": "sampled"})),
    );
    for id in ["pred", "old"] {
        let r = step(&server, id, 0, &[0], &[0.0]);
        assert_eq!(r.status, 200, "{:?}", r.body);
        let th = f(&r.body["thresholds"][0]);
        if id == "pred" {
            assert_eq!(th, 1.0, "a step report never moves a threshold");
        } else {
            assert_eq!(th, 0.0, "the sampled protocol moves it");
        }
        let r = step(&server, id, 1, &[0], &[1.0]);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let pred = example_privacy(&server, "pred", 0, DELTA);
    let ex = &pred["example"];
    assert_eq!(ex["ledger"], "threshold");
    assert_eq!(ex["guarantee"]["kind"], "worst_case");
    assert_eq!(ex["estimate"]["kind"], "estimate");
    assert_eq!(ex["ex_post"]["kind"], "ex_post");
    // Charged at C at both steps: its threshold ledger is the worst case's.
    let worst_rdp = pred["worst_case"]["rdp"]["rdp"].as_array().unwrap();
    for (a, b) in ex["rdp"].as_array().unwrap().iter().zip(worst_rdp) {
        assert_eq!(f(a), f(b));
    }
    assert!(f(&ex["ex_post"]["epsilon"]) > 0.0);
    assert_eq!(f(&ex["epsilon"]), f(&pred["worst_case"]["epsilon"]));

    let old = example_privacy(&server, "old", 0, DELTA);
    let ex = &old["example"];
    assert_eq!(ex["ledger"], "sampled");
    assert!(
        ex["ex_post"].is_null(),
        "no ex-post bound without predictable thresholds"
    );
    assert_eq!(ex["guarantee"]["kind"], "worst_case");
    assert_eq!(ex["estimate"]["kind"], "estimate");
    // The old number (its ledger is 0 at every order: the improved
    // conversion of zero, 0.0035 here) survives only as an estimate ...
    let estimate = f(&ex["estimate"]["epsilon"]);
    assert!(ex["rdp"].as_array().unwrap().iter().all(|r| f(r) == 0.0));
    // ... and the guarantee served is the worst case (0.0865), far above it.
    assert!(
        f(&ex["epsilon"]) > 10.0 * estimate,
        "{estimate} {}",
        ex["epsilon"]
    );
    assert_eq!(f(&ex["epsilon"]), f(&old["worst_case"]["epsilon"]));
}

/// Standard normal CDF through erfc (accurate in both tails).
fn phi(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// Spec §10, realized sums: q = 1, sigma = 1, C = 1. Step 0 charges the
/// example at C; its threshold for step 1 is C when o_0 > 2 (high branch) and
/// 0 otherwise (low branch), set by a scheduled refresh. The served ex-post
/// value of each branch must satisfy `P'(L > eps(o)) <= delta`, computed here
/// exactly: L = (o_0 - 1/2) + [high] (o_1 - 1/2), o_t ~ N(1, 1) under P'.
/// The improved conversion of the low branch's sum (the old served number,
/// about 4.73) must be labelled an estimate.
#[test]
fn the_full_batch_counterexample_ex_post_satisfies_the_tail_bound() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let cfg = config(1, 1.0, json!({"refresh": {"full_every": 1}}));
    let mut eps = Vec::new();
    for (id, second) in [("low", 0.0), ("high", 1.0)] {
        create(&server, id, cfg.clone());
        assert_eq!(refresh(&server, id, &[0], &[1.0]).status, 200);
        assert_eq!(step(&server, id, 0, &[0], &[1.0]).status, 200);
        assert_eq!(refresh(&server, id, &[0], &[second]).status, 200);
        assert_eq!(step(&server, id, 1, &[0], &[second]).status, 200);
        let p = example_privacy(&server, id, 0, DELTA);
        let ex = &p["example"];
        assert_eq!(ex["ex_post"]["kind"], "ex_post");
        assert_eq!(f(&ex["ex_post"]["delta"]), DELTA);
        if id == "low" {
            let estimate = f(&ex["estimate"]["epsilon"]);
            assert!((estimate - 4.73).abs() < 0.01, "{estimate}");
            assert_eq!(ex["estimate"]["kind"], "estimate");
            assert_ne!(ex["bound"], "per_instance_rdp");
        }
        eps.push(f(&ex["ex_post"]["epsilon"]));
    }
    let (low, high) = (eps[0], eps[1]);
    assert!(low < high);
    // P'(o_0 <= 2 and o_0 - 1/2 > low), o_0 ~ N(1, 1).
    let p_low = if low + 0.5 < 2.0 {
        phi(1.0) - phi(low + 0.5 - 1.0)
    } else {
        0.0
    };
    // P'(o_0 > 2 and o_0 + o_1 - 1 > high): integrate over o_0 (midpoints).
    let (a, b, k) = (2.0, 14.0, 240_000);
    let h = (b - a) / k as f64;
    let density =
        |x: f64| (-(x - 1.0) * (x - 1.0) / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let p_high: f64 = (0..k)
        .map(|j| {
            let x = a + (j as f64 + 0.5) * h;
            // o_1 > high + 1 - x, o_1 ~ N(1, 1).
            density(x) * (1.0 - phi(high + 1.0 - x - 1.0)) * h
        })
        .sum();
    let violation = p_low + p_high;
    assert!(
        violation <= DELTA,
        "P'(L > ex post) = {violation:e} > delta (low {low}, high {high})"
    );
}

/// The schedule (spec §3.2): a block of 3 ids per step over 10 ids, told to
/// the trainer, refused off schedule, steps held until it arrived; its
/// bookkeeping survives a restart.
#[test]
fn off_schedule_refreshes_are_refused_and_steps_wait_for_the_due_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    create(
        &server,
        "rr",
        config(10, 0.5, json!({"refresh": {"block": 3}})),
    );
    let th = get(
        &format!("{}/v1/datasets/rr/thresholds", server.url),
        Some(&server.admin_token()),
    );
    assert_eq!(th.status, 200);
    let due = &th.body["refresh_due"];
    assert_eq!(
        (
            due["before_step"].as_u64(),
            due["first_id"].as_u64(),
            due["count"].as_u64()
        ),
        (Some(0), Some(0), Some(3))
    );
    let r = step(&server, "rr", 0, &[1], &[0.5]);
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(r.body["detail"].as_str().unwrap().contains("refresh"));
    let r = refresh(&server, "rr", &[5], &[0.5]);
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(
        r.body["detail"].as_str().unwrap().contains("not due"),
        "{:?}",
        r.body
    );
    let r = refresh(&server, "rr", &[0, 1], &[0.2, 0.3]);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["refresh_due"]["received"], 2);
    // Half a refresh survives a restart: the step is still held.
    server.restart();
    assert_eq!(step(&server, "rr", 0, &[1], &[0.9]).status, 409);
    let r = refresh(&server, "rr", &[1], &[0.3]);
    assert_eq!(r.status, 409, "already received: {:?}", r.body);
    assert_eq!(refresh(&server, "rr", &[2], &[0.4]).status, 200);
    let r = step(&server, "rr", 0, &[1, 7], &[0.9, 0.05]);
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A report never moves a threshold: the refreshed 0.3 and the initial C.
    assert_eq!(r.body["thresholds"], json!([0.3, 1.0]));
    let due = &r.body["refresh_due"];
    assert_eq!(
        (due["before_step"].as_u64(), due["first_id"].as_u64()),
        (Some(1), Some(3))
    );
    // Steps 1..3 with their blocks; the block before step 3 wraps: 9, 0, 1.
    for t in 1..3u64 {
        let ids: Vec<u64> = (0..3).map(|j| (t * 3 + j) % 10).collect();
        assert_eq!(refresh(&server, "rr", &ids, &[0.5, 0.5, 0.5]).status, 200);
        assert_eq!(step(&server, "rr", t, &[], &[]).status, 200);
    }
    let th = get(
        &format!("{}/v1/datasets/rr/thresholds", server.url),
        Some(&server.admin_token()),
    );
    assert_eq!(th.body["refresh_due"]["first_id"], 9);
    assert_eq!(
        refresh(&server, "rr", &[9, 0, 1], &[0.1, 0.1, 0.1]).status,
        200
    );
    assert_eq!(step(&server, "rr", 3, &[], &[]).status, 200);

    // Without a schedule the thresholds stay at C: every refresh is refused.
    create(&server, "fixed", config(4, 0.5, json!({})));
    let r = refresh(&server, "fixed", &[0], &[0.1]);
    assert_eq!(r.status, 409);
    assert!(r.body["detail"]
        .as_str()
        .unwrap()
        .contains("no refresh schedule"));
}

/// The individual filter in the predictable mode (spec §7): the guarantee is
/// `min(eps(B), worst case)` for examples it keeps within budget, and their
/// threshold ledger at the filter's order never exceeds the budget; small-norm
/// examples keep training after large-norm ones retire.
#[test]
fn the_filter_guarantee_holds_on_the_threshold_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let n = 20u64;
    let body = create(
        &server,
        "filtered",
        config(
            n,
            0.5,
            json!({"refresh": {"full_every": 5}, "individual_budget": {"epsilon": 8.0, "delta": DELTA}}),
        ),
    );
    let filter = &body["status"]["filter"];
    let (order, budget) = (f(&filter["order"]), f(&filter["rdp_budget"]));
    let ids: Vec<u64> = (0..n).collect();
    // Half the examples have large gradients, half small ones.
    let norms: Vec<f64> = ids
        .iter()
        .map(|&i| if i < n / 2 { 2.0 } else { 0.05 })
        .collect();
    let mut retired = std::collections::BTreeSet::new();
    for t in 0..60u64 {
        if t % 5 == 0 {
            let live: Vec<u64> = ids
                .iter()
                .copied()
                .filter(|i| !retired.contains(i))
                .collect();
            let live_norms: Vec<f64> = live.iter().map(|&i| norms[i as usize]).collect();
            let r = refresh(&server, "filtered", &live, &live_norms);
            assert_eq!(r.status, 200, "{:?}", r.body);
            retired.extend(retired_in(&r.body));
        }
        let batch: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|i| !retired.contains(i) && (i + t) % 2 == 0)
            .collect();
        let batch_norms: Vec<f64> = batch.iter().map(|&i| norms[i as usize]).collect();
        let r = step(&server, "filtered", t, &batch, &batch_norms);
        assert_eq!(r.status, 200, "{:?}", r.body);
        retired.extend(retired_in(&r.body));
    }
    assert!(!retired.is_empty(), "large-norm examples retire");
    assert!(
        retired.iter().all(|&i| i < n / 2),
        "small-norm examples keep training"
    );
    let mut filtered_epsilon = None;
    for id in 0..n {
        let p = example_privacy(&server, "filtered", id, DELTA);
        let ex = &p["example"];
        assert_eq!(ex["over_budget"], false);
        // The threshold ledger at the filter's order never exceeds its budget
        // (the dataset keeps the default orders).
        let orders = dpledger::accounting::orders::ledger_orders();
        let j = orders
            .iter()
            .position(|&a| a == order)
            .expect("the filter's order");
        let rdp = ex["rdp"].as_array().unwrap();
        assert_eq!(rdp.len(), orders.len());
        assert!(f(&rdp[j]) <= budget, "example {id}: {} > {budget}", rdp[j]);
        let guarantee = f(&ex["epsilon"]);
        assert!(guarantee <= f(&p["worst_case"]["epsilon"]));
        if ex["guarantee"]["kind"] == "individual_filter" {
            assert!(guarantee <= 8.0 * (1.0 + 1e-9));
            filtered_epsilon.get_or_insert(guarantee);
            assert_eq!(
                Some(guarantee),
                filtered_epsilon,
                "one budget, one guarantee"
            );
        }
    }
    let status = get(
        &format!("{}/v1/datasets/filtered", server.url),
        Some(&server.admin_token()),
    );
    assert_eq!(status.status, 200);
    assert!(status.body["status"]["retired"].as_u64().unwrap() >= 1);
}

/// A dataset whose creation record was written before the predictable mode
/// existed (its configuration has no `thresholds`) replays as `sampled`:
/// nothing lost, nothing relabelled up.
#[test]
fn a_log_of_the_old_protocol_replays_as_sampled() {
    use dpledger::store::{Record, RecordKind};
    let dir = tempfile::tempdir().unwrap();
    let old_config = config(4, 0.5, json!({}));
    assert!(old_config.get("thresholds").is_none());
    {
        let url = format!("sqlite:{}", dir.path().join("dpledger.sqlite").display());
        let store = dpledger::store::open(&url).expect("store");
        store
            .append(vec![Record {
                dataset: "legacy".into(),
                kind: RecordKind::DatasetCreated,
                step: None,
                part: None,
                payload: serde_json::to_vec(&json!({"config": old_config})).unwrap(),
            }])
            .expect("creation");
        let report = dpledger::ledger::StepReport::new(0, vec![1], vec![0.2]);
        store
            .append(vec![common::store_records::step_with(
                "legacy",
                0,
                None,
                report.ids,
                report.norms,
            )])
            .expect("step");
    }
    let server = Server::start(dir.path(), None);
    let p = example_privacy(&server, "legacy", 1, DELTA);
    let ex = &p["example"];
    assert_eq!(ex["ledger"], "sampled");
    assert!(ex["ex_post"].is_null());
    assert_eq!(ex["guarantee"]["kind"], "worst_case");
    // The old protocol moved its threshold to the reported norm.
    assert_eq!(f(&ex["threshold"]), 0.2);
    let view = get(
        &format!("{}/v1/datasets/legacy", server.url),
        Some(&server.admin_token()),
    );
    assert!(
        view.body["config"]["thresholds"].is_null()
            || view.body["config"]["thresholds"] == "sampled"
    );
    assert_eq!(view.body["status"]["guarantee"], false);
}

/// A new dataset's stored configuration says what it is: predictable, with
/// the ex-post order set recorded; global clipping and shuffled batches are
/// `sampled` (every per-example number an estimate).
#[test]
fn creation_records_the_mode_and_the_ex_post_orders() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let body = create(
        &server,
        "new",
        config(10, 0.1, json!({"planned_steps": 469})),
    );
    assert_eq!(body["config"]["thresholds"], "predictable");
    let orders = body["config"]["ex_post"]["orders"].as_array().unwrap();
    let weights = body["config"]["ex_post"]["weights"].as_array().unwrap();
    assert!(!orders.is_empty() && orders.len() <= 8);
    assert_eq!(orders.len(), weights.len());
    assert!((weights.iter().map(f).sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!(body["status"]["guarantee"], true);
    let body = create(
        &server,
        "global",
        config(10, 0.1, json!({"clipping": "global"})),
    );
    assert_eq!(body["config"]["thresholds"], "sampled");
    assert_eq!(body["status"]["guarantee"], false);
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": "bad", "config": config(10, 0.1, json!({"clipping": "global", "thresholds": "predictable"}))}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.body["field"], "thresholds");
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &json!({"id": "bad2", "config": config(10, 0.1, json!({"ex_post": {"orders": [3.55], "weights": [1.0]}}))}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "ex_post.orders");
}

/// The estimate reads the discounted ledger (spec §3 rule 4): a sampled
/// example reported below its threshold is charged its clipped norm there,
/// while its threshold ledger, ex-post bound and guarantee stay at the
/// threshold; a restart keeps it.
#[test]
fn the_estimate_reads_the_discounted_ledger() {
    use dpledger::accounting::conversion::{epsilon_at, Conversion};
    use dpledger::accounting::sgm::sgm_rdp;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let (q, small) = (0.5, 0.2);
    create(
        &server,
        "disc",
        config(4, q, json!({"refresh": {"full_every": 100}})),
    );
    let r = refresh(&server, "disc", &[0, 1, 2, 3], &[1.0; 4]);
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = step(&server, "disc", 0, &[0, 1], &[small, 1.0]);
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = step(&server, "disc", 1, &[0], &[small]);
    assert_eq!(r.status, 200, "{:?}", r.body);

    let answers: Vec<Value> = (0..4)
        .map(|i| example_privacy(&server, "disc", i, DELTA))
        .collect();
    let [e0, e1, e2] = [0, 1, 2].map(|i| answers[i]["example"].clone());
    // The proven parts are the same for all three: every one is charged at C.
    for e in [&e1, &e2] {
        assert_eq!(e["rdp"], e0["rdp"]);
        assert_eq!(e["ex_post"], e0["ex_post"]);
        assert_eq!(e["guarantee"], e0["guarantee"]);
    }
    // Reported at its threshold, or never sampled: no discount.
    assert_eq!(e1["estimate"], e2["estimate"]);
    // Twice at 0.2: R = R^thr - 2 (rho(C) - rho(0.2)) at every order.
    let orders = dpledger::accounting::orders::ledger_orders();
    let want = orders
        .iter()
        .zip(e0["rdp"].as_array().unwrap())
        .map(|(&a, thr)| {
            let discount = sgm_rdp(q, 1.0, a) - sgm_rdp(q, 1.0 / small, a);
            let r = (f(thr) - 2.0 * discount).max(0.0);
            epsilon_at(a, r, DELTA, Conversion::Improved)
        })
        .fold(f64::INFINITY, f64::min)
        .max(0.0);
    let got = f(&e0["estimate"]["epsilon"]);
    assert!(
        (got - want).abs() <= 1e-6 * want,
        "estimate {got}, the discounted ledger gives {want}"
    );
    assert!(got < f(&e2["estimate"]["epsilon"]));
    assert_eq!(e0["estimate"]["kind"], "estimate");

    // The PLD estimate composes the same discounted history: example 0's two
    // steps at the level it was processed at (0.2), the unsampled one's two at
    // its threshold (C = 1).
    let pld = |i: u64| {
        example_privacy_with(&server, "disc", i, DELTA, "&method=pld_estimate")["pld_estimate"]
            .clone()
    };
    let levels = |p: &Value| -> Vec<(f64, u64)> {
        p["levels"]
            .as_array()
            .expect("levels")
            .iter()
            .map(|l| (f(&l["threshold"]), l["steps"].as_u64().expect("steps")))
            .collect()
    };
    let (p0, p2) = (pld(0), pld(2));
    assert_eq!(levels(&p0), vec![(small, 2)], "{p0}");
    assert_eq!(levels(&p2), vec![(1.0, 2)], "{p2}");
    assert!(f(&p0["epsilon"]) < f(&p2["epsilon"]), "{p0} {p2}");
    assert!(
        f(&p0["epsilon"]) <= got * (1.0 + 1e-9),
        "capped by the RDP estimate"
    );

    server.restart();
    for (i, before) in answers.iter().enumerate() {
        assert_eq!(
            &example_privacy(&server, "disc", i as u64, DELTA),
            before,
            "example {i}"
        );
    }
}

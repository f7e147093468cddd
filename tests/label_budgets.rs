//! Budgets per label (spec §7): the examples of a label given at creation have
//! that label's budget, every other example the dataset's. Each budget class
//! retires at its own budget on the threshold ledger, serves its own
//! guarantee, and keeps it across a restart and a snapshot; labels stay as
//! created, and a budget per label without the labels is refused.

mod common;

use common::{example_privacy, post, put, Server};
use dpledger::accounting::Conversion;
use dpledger::ledger::DatasetConfigExt;
use dpledger::ledger::{DatasetConfig, IndividualBudget, Ledger, StepReport, ThresholdMode};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const DELTA: f64 = 1e-5;
const N: u64 = 20;
/// The dataset's budget, and the larger one of the examples labelled "long".
const SHORT: f64 = 2.0;
const LONG: f64 = 6.0;

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Even ids are "long" (budget `LONG`), odd ids "short" (a label without a
/// budget of its own: the dataset's `SHORT`).
fn label(i: u64) -> &'static str {
    if i % 2 == 0 {
        "long"
    } else {
        "short"
    }
}

fn config() -> Value {
    json!({
        "examples": N,
        "max_grad_norm": 1.0,
        "rounding": 0.01,
        "noise_multiplier": 2.0,
        "sampling": {"kind": "poisson", "rate": 0.2},
        "delta": DELTA,
        "refresh": {"full_every": 5},
        "individual_budget": {"epsilon": SHORT, "delta": DELTA},
        "label_budgets": {"long": {"epsilon": LONG, "delta": DELTA}},
    })
}

fn create(server: &Server, id: &str, body: Value) -> common::Reply {
    let mut body = body;
    body["id"] = json!(id);
    post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &body,
    )
}

fn ids_in(answer: &Value) -> Vec<u64> {
    answer["retired"]
        .as_array()
        .expect("retired")
        .iter()
        .map(|v| v.as_u64().expect("an id"))
        .collect()
}

/// Every example reports the clipping norm: each retires when its own
/// budget's order would be passed, so the "short" ones long before the "long"
/// ones. Returns the step at which each example retired.
fn train(server: &Server, id: &str, steps: u64) -> BTreeMap<u64, u64> {
    let url = |what: &str| format!("{}/v1/datasets/{id}/{what}", server.url);
    let token = server.admin_token();
    let mut retired = BTreeMap::new();
    for t in 0..steps {
        let live: Vec<u64> = (0..N).filter(|i| !retired.contains_key(i)).collect();
        if t % 5 == 0 {
            let norms = vec![1.0; live.len()];
            let r = post(
                &url("refresh"),
                Some(&token),
                &json!({"ids": live, "norms": norms}),
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
            for i in ids_in(&r.body) {
                retired.insert(i, t);
            }
        }
        let batch: Vec<u64> = (0..N)
            .filter(|i| !retired.contains_key(i) && (i + t) % 2 == 0)
            .collect();
        let norms = vec![1.0; batch.len()];
        let r = post(
            &url("steps"),
            Some(&token),
            &json!({"step": t, "ids": batch, "norms": norms}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        for i in ids_in(&r.body) {
            retired.insert(i, t);
        }
    }
    retired
}

#[test]
fn each_label_retires_at_its_own_budget_and_keeps_its_guarantee() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let labels: Vec<&str> = (0..N).map(label).collect();
    let r = create(
        &server,
        "run",
        json!({"config": config(), "labels": labels}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let filter = &r.body["status"]["filter"];
    assert_eq!(f(&filter["epsilon"]), SHORT);
    let classes = filter["label_budgets"].as_array().expect("label budgets");
    assert_eq!(classes.len(), 1, "{filter}");
    assert_eq!(classes[0]["label"], "long");
    assert_eq!(f(&classes[0]["epsilon"]), LONG);
    let budget_of = |i: u64| -> (f64, f64) {
        let c = if label(i) == "long" {
            &classes[0]
        } else {
            filter
        };
        (f(&c["order"]), f(&c["rdp_budget"]))
    };

    let retired = train(&server, "run", 400);
    let short: BTreeSet<u64> = (0..N).filter(|&i| label(i) == "short").collect();
    assert!(
        short.iter().all(|i| retired.contains_key(i)),
        "every short-budget example retired: {retired:?}"
    );
    let last_short = short.iter().map(|i| retired[i]).max().unwrap();
    for i in (0..N).filter(|&i| label(i) == "long") {
        if let Some(&at) = retired.get(&i) {
            assert!(at > last_short, "{i} retired at {at}, before {last_short}");
        }
    }
    assert!(
        (0..N).any(|i| label(i) == "long" && retired.get(&i).is_none_or(|&at| at > last_short)),
        "long-budget examples train on after the short ones retired"
    );

    let orders = dpledger::accounting::orders::ledger_orders();
    let answers: Vec<Value> = (0..N)
        .map(|i| example_privacy(&server, "run", i, DELTA)["example"].clone())
        .collect();
    for (i, ex) in (0..N).zip(&answers) {
        let (order, budget) = budget_of(i);
        let j = orders.iter().position(|&a| a == order).expect("an order");
        let rdp = f(&ex["rdp"][j]);
        assert!(
            rdp <= budget,
            "example {i}: {rdp} > {budget} at order {order}"
        );
        assert_eq!(ex["over_budget"], false);
        let guarantee = f(&ex["epsilon"]);
        let cap = if label(i) == "long" { LONG } else { SHORT };
        assert!(guarantee <= cap * (1.0 + 1e-9), "example {i}: {guarantee}");
        assert_eq!(ex["guarantee"]["kind"], "individual_filter", "{i}: {ex}");
    }
    let (g_short, g_long) = (f(&answers[1]["epsilon"]), f(&answers[0]["epsilon"]));
    assert!(g_short < g_long, "{g_short} vs {g_long}");

    // Labels stay as created: their budgets were fixed by them.
    let r = put(
        &format!("{}/v1/datasets/run/labels", server.url),
        Some(&server.admin_token()),
        &json!({"ids": [1], "labels": ["long"]}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(r.body["detail"]
        .as_str()
        .unwrap()
        .contains("budgets per label"));

    // The classes come back from the log.
    server.restart();
    for (i, before) in (0..N).zip(&answers) {
        assert_eq!(
            &example_privacy(&server, "run", i, DELTA)["example"].clone(),
            before,
            "example {i}"
        );
    }
}

#[test]
fn budgets_per_label_need_the_labels_and_a_dataset_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let r = create(&server, "nolabels", json!({"config": config()}));
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "labels", "{:?}", r.body);

    let mut c = config();
    c.as_object_mut().unwrap().remove("individual_budget");
    let r = create(
        &server,
        "nodefault",
        json!({"config": c, "labels": ["long"]}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["field"], "label_budgets", "{:?}", r.body);

    let mut c = config();
    c["label_budgets"] = json!({"long": {"epsilon": -1.0, "delta": DELTA}});
    let r = create(
        &server,
        "negative",
        json!({"config": c, "labels": ["long"]}),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.body["field"], "label_budgets.long.epsilon",
        "{:?}",
        r.body
    );
}

fn ledger() -> Ledger {
    let config = DatasetConfig {
        individual_budget: Some(IndividualBudget {
            epsilon: SHORT,
            delta: DELTA,
        }),
        label_budgets: Some(BTreeMap::from([(
            "long".to_string(),
            IndividualBudget {
                epsilon: LONG,
                delta: DELTA,
            },
        )])),
        thresholds: Some(ThresholdMode::Predictable),
        ..DatasetConfig::poisson(N, 1.0, 2.0, 0.2, DELTA)
    };
    Ledger::new(config.with_creation_defaults().unwrap()).unwrap()
}

#[test]
fn classes_are_fixed_before_the_first_step_and_survive_a_snapshot() {
    let mut ledger = ledger();
    assert!(ledger.awaits_budget_labels());
    let labels: Vec<Option<String>> = (0..N).map(|i| Some(label(i).to_string())).collect();
    ledger.assign_budget_labels(&labels).unwrap();
    assert!(!ledger.awaits_budget_labels());
    assert!(
        ledger.assign_budget_labels(&labels).is_err(),
        "assigned once"
    );
    let mut retired = Vec::new();
    for t in 0..2000 {
        let ids: Vec<u64> = (0..N).filter(|i| !retired.contains(i)).collect();
        let norms = vec![1.0; ids.len()];
        retired.extend(
            ledger
                .step(&StepReport::new(t, ids, norms))
                .unwrap()
                .retired,
        );
    }
    let answers = |l: &Ledger| -> Vec<(f64, bool)> {
        (0..N)
            .map(|i| {
                let p = l.privacy(i, DELTA, Conversion::Improved).unwrap();
                (p.epsilon, p.retired)
            })
            .collect()
    };
    let before = answers(&ledger);
    assert!(
        before.iter().all(|&(_, r)| r),
        "everyone retired: {before:?}"
    );
    assert!(before[0].0 > before[1].0, "{before:?}");
    let back = Ledger::from_snapshot(&ledger.to_snapshot()).unwrap();
    assert_eq!(answers(&back), before);
    assert_eq!(back.status().filter, ledger.status().filter);

    // Too late for labels once a step was taken.
    let mut late = self::ledger();
    late.step(&StepReport::new(0, vec![0], vec![1.0])).unwrap();
    assert!(late.assign_budget_labels(&labels).is_err());
}

//! DP releases over HTTP against the real binary: the cost reaches every
//! owner's epsilon and the worst case by exactly `alpha · rho`, atomically with
//! the stored release; budgets refuse with 409 and change nothing; viewers poll
//! at no cost; policies release automatically; everything survives a SIGKILL.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const N: u64 = 200;

fn url(s: &Server, path: &str) -> String {
    format!("{}/v1/datasets/d{path}", s.url)
}

/// A dataset with labels (even ids "even", odd ids "odd"), a budget, and steps.
fn setup(server: &Server, budget: Option<f64>, steps: u64) {
    let admin = server.admin_token();
    let labels: Vec<Value> = (0..N)
        .map(|i| json!(if i % 2 == 0 { "even" } else { "odd" }))
        .collect();
    let mut body = json!({"id": "d", "config": poisson_config(N, 0.1, 1.0), "labels": labels});
    if let Some(b) = budget {
        body["release_budget"] = json!({"rho": b});
    }
    let r = post(&format!("{}/v1/datasets", server.url), Some(&admin), &body);
    assert_eq!(r.status, 201, "{:?}", r.body);
    if steps > 0 {
        refresh_all(server);
    }
    run_steps(server, 0, steps);
}

/// A full-batch refresh before step 0 puts odd ids at their small threshold from
/// the start, so the gap between the groups' epsilons (about the whole bound `B`)
/// dwarfs the noise of a per-group mean: without it odd ids keep `C` until first
/// sampled, the gap is ~0.8 at a noise sd of ~0.4, and an ordering test flakes.
fn refresh_all(server: &Server) {
    let trainer = server.token("trainer", Some("d"), None);
    let ids: Vec<u64> = (0..N).collect();
    let norms: Vec<f64> = ids
        .iter()
        .map(|i| if i % 2 == 1 { 0.05 } else { 2.0 })
        .collect();
    let r = post(
        &url(server, "/refresh"),
        Some(&trainer),
        &json!({"ids": ids, "norms": norms}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
}

fn run_steps(server: &Server, from: u64, to: u64) -> Vec<Value> {
    let trainer = server.token("trainer", Some("d"), None);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(from);
    (from..to)
        .map(|t| {
            let ids: Vec<u64> = (0..N).filter(|_| rng.random::<f64>() < 0.1).collect();
            // Odd ids have small gradients, so their epsilons are far below the worst case.
            let norms: Vec<f64> = ids
                .iter()
                .map(|i| if i % 2 == 1 { 0.05 } else { 2.0 })
                .collect();
            let r = post(
                &url(server, "/steps"),
                Some(&trainer),
                &json!({"step": t, "ids": ids, "norms": norms}),
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
            r.body
        })
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn owner_privacy(server: &Server, owner: &str, id: u64) -> Value {
    let r = get(
        &url(server, &format!("/examples/{id}/privacy")),
        Some(owner),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

fn summary_request(rho_each: f64) -> Value {
    json!({
        "mean": {"rho": rho_each},
        "quantiles": {"rho": rho_each, "levels": [0.9, 0.1, 0.5]},
        "histogram": {"rho": rho_each, "bins": 5},
    })
}

#[test]
fn release_cost_reaches_every_owner_and_the_worst_case() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    setup(&server, Some(0.01), 20);
    let owner = server.token("owner", Some("d"), Some("7"));
    let curator = server.token("curator", Some("d"), None);
    let viewer = server.token("viewer", Some("d"), None);
    let before = owner_privacy(&server, &owner, 7);

    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &summary_request(0.001),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let release = r.body["release"].clone();
    assert_eq!(release["id"], 1);
    assert_eq!(release["step"], 20);
    assert_eq!(release["trigger"], "request");
    let rho = release["rho"].as_f64().unwrap();
    assert!(rel(rho, 0.003) < 1e-15, "{rho}");
    assert!(rel(r.body["budget"]["rho_spent"].as_f64().unwrap(), 0.003) < 1e-15);

    // The released values are in [0, B], quantiles sorted by level, counts plausible.
    let bound = release["bound"].as_f64().unwrap();
    assert!(rel(bound, before["worst_case"]["epsilon"].as_f64().unwrap()) < 1e-12);
    let pop = &release["values"]["population"];
    let mean = pop["mean"]["mean"].as_f64().unwrap();
    assert!((0.0..=bound).contains(&mean));
    let levels: Vec<f64> = pop["quantiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["level"].as_f64().unwrap())
        .collect();
    assert_eq!(levels, vec![0.1, 0.5, 0.9]);
    let values: Vec<f64> = pop["quantiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["value"].as_f64().unwrap())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]) && values.iter().all(|v| (0.0..=bound).contains(v))
    );
    assert_eq!(pop["histogram"]["counts"].as_array().unwrap().len(), 5);

    // Spec §6: every example's RDP and the worst case rise by alpha·rho at every order.
    let after = owner_privacy(&server, &owner, 7);
    let (rdp0, rdp1) = (
        floats(&before["example"]["rdp"]),
        floats(&after["example"]["rdp"]),
    );
    let (w0, w1) = (
        floats(&before["worst_case"]["rdp"]["rdp"]),
        floats(&after["worst_case"]["rdp"]["rdp"]),
    );
    let config_orders = dpledger::accounting::orders::ledger_orders();
    assert_eq!(rdp0.len(), config_orders.len());
    for j in 0..rdp0.len() {
        let charge = config_orders[j] * rho;
        assert!(
            rdp1[j] - rdp0[j] >= charge * (1.0 - 1e-9),
            "order {}: {} -> {}",
            config_orders[j],
            rdp0[j],
            rdp1[j]
        );
        assert!(
            rel(rdp1[j] - rdp0[j], charge) < 1e-9,
            "order {}",
            config_orders[j]
        );
        assert!(
            rel(w1[j] - w0[j], charge) < 1e-9,
            "worst case, order {}",
            config_orders[j]
        );
    }
    assert!(
        after["example"]["epsilon"].as_f64().unwrap()
            > before["example"]["epsilon"].as_f64().unwrap()
    );

    // Viewers poll the latest release at no new cost.
    for _ in 0..3 {
        let latest = get(&url(&server, "/releases/latest"), Some(&viewer));
        assert_eq!(latest.status, 200);
        assert_eq!(latest.body, release);
    }
    assert_eq!(
        owner_privacy(&server, &owner, 7)["example"],
        after["example"]
    );

    // Over budget: 409 with the spend and the request, and nothing changes.
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &summary_request(0.003),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(r.content_type, "application/problem+json");
    assert!(rel(r.body["budget"]["rho_spent"].as_f64().unwrap(), 0.003) < 1e-15);
    assert!(rel(r.body["budget"]["rho_requested"].as_f64().unwrap(), 0.009) < 1e-15);
    assert_eq!(r.body["budget"]["rho_budget"], 0.01);
    assert_eq!(
        owner_privacy(&server, &owner, 7)["example"],
        after["example"]
    );

    // Per-group release: one entry per label, the unlabelled (none here) last.
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.004}, "by_group": true}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let groups = r.body["release"]["values"]["groups"]
        .as_array()
        .unwrap()
        .clone();
    let labels: Vec<Value> = groups.iter().map(|g| g["label"].clone()).collect();
    assert_eq!(labels, vec![json!("even"), json!("odd"), Value::Null]);
    // Odd examples (norm 0.05) leak far less than even ones (norm 2.0 > C).
    let mean_of = |g: &Value| g["mean"]["mean"].as_f64().unwrap();
    assert!(mean_of(&groups[1]) < mean_of(&groups[0]), "{groups:?}");

    // Prometheus gauges carry the latest release.
    let metrics = metrics_text(&server);
    assert!(
        metrics.contains("dpledger_release_mean{dataset=\"d\",group=\"even\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dpledger_release_rho_spent{dataset=\"d\"} 0.007"),
        "{metrics}"
    );

    // A SIGKILL later, the releases, their charges and the budget are all back.
    let list_before = get(&url(&server, "/releases"), Some(&viewer)).body;
    let privacy_before = owner_privacy(&server, &owner, 7);
    server.restart();
    let owner = server.token("owner", Some("d"), Some("7"));
    let viewer = server.token("viewer", Some("d"), None);
    assert_eq!(
        get(&url(&server, "/releases"), Some(&viewer)).body,
        list_before
    );
    assert_eq!(owner_privacy(&server, &owner, 7), privacy_before);
    assert!(metrics_text(&server).contains("dpledger_release_mean{dataset=\"d\",group=\"odd\"}"));
}

/// `/metrics` with the server's admin token (it needs an admin or metrics token).
fn metrics_text(server: &Server) -> String {
    ureq::get(&format!("{}/metrics", server.url))
        .set("Authorization", &format!("Bearer {}", server.admin_token()))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

#[test]
fn refusals_say_why_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    setup(&server, None, 0);
    let curator = server.token("curator", Some("d"), None);
    let owner = server.token("owner", Some("d"), Some("3"));
    // No budget yet.
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.1}}),
    );
    assert_eq!(r.status, 409);
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap()
            .contains("release-budget"),
        "{:?}",
        r.body
    );
    assert_eq!(r.body["budget"]["rho_budget"], Value::Null);
    // Budgets: by epsilon and delta, converted; never below the spend.
    let r = put(
        &url(&server, "/release-budget"),
        Some(&curator),
        &json!({"epsilon": 1.0, "delta": 1e-6}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let rho = r.body["rho_budget"].as_f64().unwrap();
    assert!(rho > 0.02 && rho < 0.05, "{rho}");
    let r = put(
        &url(&server, "/release-budget"),
        Some(&curator),
        &json!({"rho": 0.1, "epsilon": 1.0}),
    );
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("budget")));
    // Nothing to release before the first step.
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.001}}),
    );
    assert_eq!(r.status, 409);
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap()
            .contains("nothing to release"),
        "{:?}",
        r.body
    );
    run_steps(&server, 0, 5);
    // Invalid requests name the field.
    for (body, field) in [
        (json!({}), "release"),
        (
            json!({"quantiles": {"rho": 0.001, "levels": [0.5, 1.5]}}),
            "quantiles.levels",
        ),
        (
            json!({"histogram": {"rho": 0.001, "bins": 100000}}),
            "histogram.bins",
        ),
        (json!({"mean": {"rho": -1}}), "mean.rho"),
    ] {
        let r = post(&url(&server, "/releases"), Some(&curator), &body);
        assert_eq!(
            (r.status, r.body["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
    let before = owner_privacy(&server, &owner, 3);
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.015}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = put(
        &url(&server, "/release-budget"),
        Some(&curator),
        &json!({"rho": 0.01}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    // Labels: unknown ids are refused.
    let r = put(
        &url(&server, "/labels"),
        Some(&curator),
        &json!({"ids": [N], "labels": ["x"]}),
    );
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("ids")));
    let r = put(
        &url(&server, "/labels"),
        Some(&curator),
        &json!({"ids": [0, 1], "labels": ["new", null]}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body["groups"], json!(["even", "odd", "new"]));
    assert!(
        owner_privacy(&server, &owner, 3)["example"]["epsilon"].as_f64()
            > before["example"]["epsilon"].as_f64()
    );
}

#[test]
fn a_policy_releases_every_n_steps_until_the_budget_is_spent() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    setup(&server, Some(0.0025), 0);
    let curator = server.token("curator", Some("d"), None);
    let viewer = server.token("viewer", Some("d"), None);
    let r = put(
        &url(&server, "/release-policy"),
        Some(&curator),
        &json!({"policy": {"every_steps": 4, "request": {"mean": {"rho": 0.001}}}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    // Steps 0..12: releases after steps 4 and 8; the third (after 12) is over budget
    // but the step itself is still accepted. Each release is awaited before the
    // next due step, so that none is deferred behind another (see the next test).
    for (from, to, want) in [(0, 4, 1), (4, 8, 2)] {
        run_steps(&server, from, to);
        let seen = wait_for_policy(&server, &viewer, |s| s.len() == want);
        assert_eq!(seen.len(), want, "{seen:?}");
    }
    run_steps(&server, 8, 12);
    let list = get(&url(&server, "/releases"), Some(&viewer)).body;
    let releases = list["releases"].as_array().unwrap();
    assert_eq!(releases.len(), 2, "{list:?}");
    assert_eq!(releases[0]["step"], 8);
    assert_eq!(releases[1]["step"], 4);
    assert!(releases.iter().all(|r| r["trigger"] == "policy"));
    assert!(
        list["policy_error"].as_str().unwrap().contains("budget"),
        "{list:?}"
    );
    assert!(rel(list["budget"]["rho_spent"].as_f64().unwrap(), 0.002) < 1e-15);
    // Removing the policy stops it.
    let r = put(
        &url(&server, "/release-policy"),
        Some(&curator),
        &json!({"policy": null}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        get(&url(&server, "/release-policy"), Some(&viewer)).body["policy"],
        Value::Null
    );
}

/// Releases while steps flow: a policy release is computed after its step answers, yet when
/// releases keep up with steps (the dashboard's reader waits for each) it
/// describes exactly its due step, none is lost or doubled, and the log
/// replays to the same list.
#[test]
fn policy_releases_run_behind_the_steps_and_describe_their_own_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    setup(&server, Some(1.0), 0);
    let curator = server.token("curator", Some("d"), None);
    set_mean_policy(&server, &curator, 2);
    for t in 0..20 {
        run_steps(&server, t, t + 1);
        if (t + 1) % 2 == 0 {
            let want: Vec<u64> = (1..=t.div_ceil(2)).map(|k| 2 * k).collect();
            let seen = wait_for_policy(&server, &curator, |s| s.len() >= want.len());
            assert_eq!(seen, want, "after step {t}");
        }
    }
    let all: Vec<u64> = (1..=10).map(|k| 2 * k).collect();
    let list = get(&url(&server, "/releases"), Some(&curator)).body;
    assert!(rel(list["budget"]["rho_spent"].as_f64().unwrap(), 1e-3) < 1e-12);
    assert_eq!(list["policy_error"], Value::Null, "{list:?}");
    server.restart();
    assert_eq!(policy_steps(&server, &curator), all);
}

/// The steps the policy's releases describe, oldest first.
fn policy_steps(server: &Server, token: &str) -> Vec<u64> {
    let list = get(&url(server, "/releases?limit=100"), Some(token)).body;
    let mut steps: Vec<u64> = list["releases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "policy")
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    steps.reverse();
    steps
}

/// Wait (at most 20 s) until `done` holds of the policy's release steps; steps
/// never wait for releases, so a test that needs one published waits here, as
/// a dashboard would.
fn wait_for_policy(server: &Server, token: &str, done: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let steps = policy_steps(server, token);
        if done(&steps) || std::time::Instant::now() > deadline {
            return steps;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A policy releasing a mean (rho 1e-4) of dataset `d` every `every` steps.
fn set_mean_policy(server: &Server, curator: &str, every: u64) {
    let r = put(
        &url(server, "/release-policy"),
        Some(curator),
        &json!({"policy": {"every_steps": every, "request": {"mean": {"rho": 1e-4}}}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
}

/// Curators' releases and policy releases take turns while steps flow back to
/// back, a policy release due at every step: steps never wait for releases, so
/// a release that falls due while the previous one (or a curator's) is being
/// computed is deferred and later ones coalesce into it. What must hold: the
/// policy's releases are in step order, none beyond the last step, the newest
/// describes the last step (nothing due is dropped for good), release ids are
/// unique, and the budget spent is exactly the sum of what was published.
#[test]
fn policy_and_curator_releases_take_turns_while_steps_flow() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    setup(&server, Some(10.0), 0);
    let curator = server.token("curator", Some("d"), None);
    set_mean_policy(&server, &curator, 1);
    let steps = 30;
    let curator_releases = std::thread::scope(|scope| {
        let releases = scope.spawn(|| {
            let mut published = 0;
            for _ in 0..15 {
                let r = post(
                    &url(&server, "/releases"),
                    Some(&curator),
                    &json!({"mean": {"rho": 2e-4}}),
                );
                match r.status {
                    201 => published += 1,
                    409 => {} // nothing to release yet (no step)
                    s => panic!("{s}: {:?}", r.body),
                }
            }
            published
        });
        run_steps(&server, 0, steps);
        releases.join().unwrap()
    });
    let policy_steps = wait_for_policy(&server, &curator, |s| s.last() == Some(&steps));
    assert_eq!(policy_steps.last(), Some(&steps), "{policy_steps:?}");
    assert!(
        policy_steps.windows(2).all(|w| w[0] <= w[1]),
        "{policy_steps:?}"
    );
    assert!(policy_steps.iter().all(|&s| s >= 1 && s <= steps));
    let list = get(&url(&server, "/releases?limit=100"), Some(&curator)).body;
    let releases = list["releases"].as_array().unwrap();
    let ids: Vec<u64> = releases.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "release ids are unique: {ids:?}");
    let spent = policy_steps.len() as f64 * 1e-4 + curator_releases as f64 * 2e-4;
    assert!(rel(list["budget"]["rho_spent"].as_f64().unwrap(), spent) < 1e-12);
    assert_eq!(list["policy_error"], Value::Null, "{list:?}");
}

#[test]
fn a_release_never_retires_examples_behind_the_trainers_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    create_with_individual_budget(&server, json!({}));
    run_steps(&server, 0, 5);
    let curator = server.token("curator", Some("d"), None);
    let owner = server.token("owner", Some("d"), Some("0"));
    let before = owner_privacy(&server, &owner, 0);
    // rho = 1 costs alpha at every order: far past an epsilon-3 budget, so it
    // would leave every example out and tell nothing.
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 1.0}}),
    );
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap()
            .contains("leave every example out"),
        "{:?}",
        r.body
    );
    assert_eq!(owner_privacy(&server, &owner, 0), before);
    let retired_before = get(&url(&server, ""), Some(&curator)).body["status"]["retired"].clone();
    // A resuming trainer can tell retirements from zero norms.
    let th = get(&url(&server, "/thresholds"), Some(&curator)).body;
    let listed = th["retired"].as_array().unwrap();
    assert_eq!(json!(listed.len()), retired_before, "{th:?}");
    assert!(listed
        .iter()
        .all(|id| th["thresholds"][id.as_u64().unwrap() as usize] == 0.0));
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 1e-6}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let status = get(&url(&server, ""), Some(&curator)).body;
    assert_eq!(status["status"]["retired"], retired_before, "{status:?}");
}

/// A refused policy release's reason reaches viewers and owners
/// without data-dependent numbers (how many examples are near their individual
/// budget depends on individual epsilons); curators and admins read the detail.
#[test]
fn viewers_read_a_refused_policy_release_without_data_dependent_counts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    create_with_individual_budget(
        &server,
        json!({"release_policy": {"every_steps": 5, "request": {"mean": {"rho": 1.0}}}}),
    );
    run_steps(&server, 0, 5);
    let curator = server.token("curator", Some("d"), None);
    let viewer = server.token("viewer", Some("d"), None);
    let owner = server.token("owner", Some("d"), Some("0"));
    let detail = get(&url(&server, "/release-policy"), Some(&curator)).body["policy_error"]
        .as_str()
        .expect("the policy's release was refused")
        .to_string();
    assert!(
        detail.contains("every example") && detail.chars().any(|c| c.is_ascii_digit()),
        "curators read the count: {detail}"
    );
    assert_eq!(
        get(&url(&server, "/releases"), Some(&admin)).body["policy_error"],
        json!(detail)
    );
    for token in [&viewer, &owner] {
        for path in ["/release-policy", "/releases"] {
            let body = get(&url(&server, path), Some(token)).body;
            let reason = body["policy_error"].as_str().expect("a reason").to_string();
            assert!(reason.contains("individual budget"), "{path}: {reason}");
            assert!(
                !reason.chars().any(|c| c.is_ascii_digit()),
                "{path}: a number reached a viewer or owner: {reason}"
            );
            assert_ne!(reason, detail);
        }
    }
}

/// Spec §6: a release leaves out of its input the examples it would push past
/// their individual budget; they bear none of its cost, the others all of it,
/// viewers never learn which were left out, and a restart keeps it so.
#[test]
fn a_release_leaves_out_examples_near_their_individual_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    create_with_individual_budget(&server, json!({}));
    refresh_all(&server);
    let curator = server.token("curator", Some("d"), None);
    let viewer = server.token("viewer", Some("d"), None);
    // Even ids (at C) retire together; odd ids (small threshold) train on.
    let mut t = 0;
    while get(&url(&server, ""), Some(&curator)).body["status"]["retired"] == json!(0) {
        assert!(t < 400, "no example retired");
        run_steps(&server, t, t + 10);
        t += 10;
    }
    let filter = get(&url(&server, ""), Some(&curator)).body["status"]["filter"].clone();
    let order = filter["order"].as_f64().unwrap();
    let rho = 2.0 * dpledger::accounting::sgm::sgm_rdp(0.1, 1.0, order) / order;
    let owners: Vec<String> = ["0", "1"]
        .iter()
        .map(|id| server.token("owner", Some("d"), Some(id)))
        .collect();
    let before: Vec<Value> = (0..2)
        .map(|i| owner_privacy(&server, &owners[i], i as u64))
        .collect();
    assert_eq!(
        before[0]["example"]["retired"],
        json!(true),
        "{:?}",
        before[0]
    );
    assert_eq!(
        before[1]["example"]["retired"],
        json!(false),
        "{:?}",
        before[1]
    );
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": rho}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let after: Vec<Value> = (0..2)
        .map(|i| owner_privacy(&server, &owners[i], i as u64))
        .collect();
    assert_eq!(
        after[0]["example"]["rdp"], before[0]["example"]["rdp"],
        "left out: it bears nothing"
    );
    // Not left out: it bears rho * alpha at every order alpha (increasing),
    // the filter's order among them.
    let (was, now) = (
        floats(&before[1]["example"]["rdp"]),
        floats(&after[1]["example"]["rdp"]),
    );
    let alphas: Vec<f64> = was.iter().zip(&now).map(|(w, n)| (n - w) / rho).collect();
    assert!(alphas.windows(2).all(|w| w[0] < w[1]), "{alphas:?}");
    assert!(alphas.iter().any(|a| rel(*a, order) < 1e-9), "{alphas:?}");
    for token in [&curator, &viewer] {
        let listed = get(&url(&server, "/releases"), Some(token)).body;
        assert!(!listed.to_string().contains("left_out"), "{listed}");
    }
    server.restart();
    for i in 0..2 {
        assert_eq!(
            owner_privacy(&server, &owners[i], i as u64)["example"]["rdp"],
            after[i]["example"]["rdp"],
            "example {i} after a restart"
        );
    }
}

/// Create dataset `d` with an individual budget (epsilon 3, delta 1e-5), a release
/// budget of rho 10 and the creation fields in `extra`.
fn create_with_individual_budget(server: &Server, extra: Value) {
    let mut config = poisson_config(N, 0.1, 1.0);
    config["individual_budget"] = json!({"epsilon": 3.0, "delta": 1e-5});
    let mut body = json!({"id": "d", "config": config, "release_budget": {"rho": 10.0}});
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&server.admin_token()),
        &body,
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
}

//! The served PLD worst case and the per-example minimum (spec §8, issue 14
//! items 2-3), checked against external oracles, never against the code:
//! - Poisson: the demo's run (q = 0.00427, sigma = 1, T = 4688, delta = 1e-5)
//!   against dp-accounting's pessimistic PLD at discretisation 1e-4 (1.56988)
//!   and the PRV accountant's lower bound (1.55974) (the PLD oracle fixture of
//!   the pld branch, tests/fixtures/pld_single.json, first case);
//! - shuffle: k epochs of the Gaussian mechanism compose to the Gaussian with
//!   `mu = sqrt(k) / sigma`, whose exact `delta(eps)` is closed form
//!   (Balle & Wang 2018), evaluated here with statrs' normal CDF.

mod common;

use common::*;
use serde_json::{json, Value};
use statrs::distribution::{ContinuousCDF, Normal};

/// dp-accounting 0.6.0, pessimistic connect-the-dots PLD at 1e-4, demo's run.
const DEMO_DP_ACCOUNTING: f64 = 1.5698803250144813;
/// PRV accountant 0.2.0's lower bound on the same run.
const DEMO_PRV_LOWER: f64 = 1.559739305157042;

fn url(server: &Server, path: &str) -> String {
    format!("{}/v1/datasets/d{path}", server.url)
}

fn step(server: &Server, trainer: &str, t: u64, ids: &[u64], norms: &[f64]) {
    let r = post(
        &url(server, "/steps"),
        Some(trainer),
        &json!({"step": t, "ids": ids, "norms": norms}),
    );
    assert_eq!(r.status, 200, "step {t}: {:?}", r.body);
}

fn privacy(server: &Server, token: &str, id: u64) -> Value {
    let r = get(
        &url(server, &format!("/examples/{id}/privacy?delta=1e-5")),
        Some(token),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

#[test]
fn demo_run_worst_case_is_the_pld_within_the_oracles_and_caps_hard_examples() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "d", "config": poisson_config(100, 0.00427, 1.0)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let trainer = server.token("trainer", Some("d"), None);
    // Example 1 reports a small norm at step 0 and keeps a small threshold;
    // example 0 is never reported and stays at C (every step charges it fully).
    step(&server, &trainer, 0, &[1], &[0.1]);
    for t in 1..4688 {
        step(&server, &trainer, t, &[], &[]);
    }
    let viewer = server.token("viewer", Some("d"), None);
    let w = get(&url(&server, "/worst-case?delta=1e-5"), Some(&viewer));
    assert_eq!(w.status, 200, "{:?}", w.body);
    let w = w.body;
    let pld = w["pld"]["epsilon"].as_f64().unwrap();
    let rdp = w["rdp"]["epsilon"].as_f64().unwrap();
    assert!(
        (DEMO_PRV_LOWER..=DEMO_DP_ACCOUNTING * 1.005).contains(&pld),
        "PLD worst case {pld} outside [{DEMO_PRV_LOWER}, 1.005 x {DEMO_DP_ACCOUNTING}]"
    );
    assert!(pld <= 1.58, "{pld}");
    assert_eq!(w["pld"]["guarantee"], true);
    // The tighter proven bound is the one reported; RDP stays available.
    assert_eq!(w["method"], "pld");
    assert_eq!(w["epsilon"].as_f64(), Some(pld));
    assert!(rdp > pld, "RDP {rdp} should be looser than PLD {pld}");
    assert_eq!(w["steps"], 4688);
    assert!(w["rdp"]["order"].as_f64().unwrap() > 1.0);

    let curator = server.token("curator", Some("d"), None);
    let hard = privacy(&server, &curator, 0);
    assert_eq!(hard["example"]["bound"], "worst_case_pld");
    assert_eq!(hard["example"]["epsilon"].as_f64(), Some(pld));
    assert_eq!(hard["example"]["rdp_epsilon"].as_f64(), Some(rdp));
    assert_eq!(
        hard["example"]["worst_case_pld_epsilon"].as_f64(),
        Some(pld)
    );
    assert_eq!(hard["worst_case"], w);
    let easy = privacy(&server, &curator, 1);
    let easy_rdp = easy["example"]["rdp_epsilon"].as_f64().unwrap();
    assert!(easy_rdp < pld, "{easy_rdp}");
    assert_eq!(easy["example"]["bound"], "per_instance_rdp");
    assert_eq!(easy["example"]["epsilon"].as_f64(), Some(easy_rdp));

    // A release is composed into the PLD worst case; B is the worst case before it.
    let r = put(
        &url(&server, "/release-budget"),
        Some(&curator),
        &json!({"rho": 0.01}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.0025}, "quantiles": {"rho": 0.00125, "levels": [0.1, 0.5, 0.9]}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["release"]["bound"].as_f64(), Some(pld));
    let after = get(&url(&server, "/worst-case?delta=1e-5"), Some(&viewer)).body;
    let pld_after = after["pld"]["epsilon"].as_f64().unwrap();
    assert!(pld_after > pld, "{pld_after} vs {pld}");
    assert!(pld_after <= after["rdp"]["epsilon"].as_f64().unwrap());

    // Bad input stays a clear 400.
    for bad in ["0", "1", "-1", "abc", "NaN"] {
        let r = get(
            &url(&server, &format!("/worst-case?delta={bad}")),
            Some(&viewer),
        );
        assert_eq!(r.status, 400, "delta={bad}: {:?}", r.body);
    }
}

/// Exact `delta(eps)` of the Gaussian mechanism with `mu = Δ/σ`.
fn gaussian_delta(mu: f64, eps: f64) -> f64 {
    let n = Normal::new(0.0, 1.0).unwrap();
    n.cdf(-eps / mu + mu / 2.0) - eps.exp() * n.cdf(-eps / mu - mu / 2.0)
}

/// Exact epsilon at `delta` by bisection (delta(eps) is decreasing).
fn gaussian_epsilon(mu: f64, delta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 100.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if gaussian_delta(mu, mid) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[test]
fn shuffle_worst_case_is_one_gaussian_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let (n, batch, sigma, epochs) = (4u64, 2u64, 2.0, 9u64);
    let config = json!({"examples": n, "max_grad_norm": 1.0, "rounding": 0.01,
        "noise_multiplier": sigma, "sampling": {"kind": "shuffle", "batch_size": batch},
        "delta": 1e-5});
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "d", "config": config}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let trainer = server.token("trainer", Some("d"), None);
    let per_epoch = n / batch;
    for t in 0..epochs * per_epoch {
        let first = (t % per_epoch) * batch;
        let ids: Vec<u64> = (first..first + batch).collect();
        step(&server, &trainer, t, &ids, &vec![5.0; batch as usize]);
    }
    let viewer = server.token("viewer", Some("d"), None);
    let w = get(&url(&server, "/worst-case?delta=1e-5"), Some(&viewer)).body;
    let pld = w["pld"]["epsilon"].as_f64().unwrap();
    let exact = gaussian_epsilon((epochs as f64).sqrt() / sigma, 1e-5);
    assert!(
        pld >= exact * (1.0 - 1e-9) && pld <= exact * 1.005,
        "PLD {pld} vs exact Gaussian {exact}"
    );
    assert_eq!(w["method"], "pld");
    assert!(w["rdp"]["epsilon"].as_f64().unwrap() > pld);
}

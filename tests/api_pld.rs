//! The served PLD worst case and the per-example minimum (spec §8), checked against external oracles, never against the code:
//! - Poisson: the demo's run (q = 0.00427, sigma = 1, T = 4688, delta = 1e-5)
//!   against dp-accounting's pessimistic PLD at discretisation 1e-4 (1.56988)
//!   and the PRV accountant's lower bound (1.55974) (the PLD oracle fixture of
//!   the pld branch, tests/fixtures/pld_single.json, first case);
//! - shuffle: k epochs of the Gaussian mechanism compose to the Gaussian with
//!   `mu = sqrt(k) / sigma`, whose exact `delta(eps)` is closed form
//!   (Balle & Wang 2018), evaluated here with statrs' normal CDF.
//!
//! The per-example PLD estimate (item 4, not a guarantee): its levels are the
//! counts computed in the test from the reported norms, its epsilon their
//! heterogeneous composition; in shuffle mode, the exact Gaussian composition.

mod common;

use common::*;
use dpledger::accounting::grid::BucketGrid;
use dpledger::accounting::pld::{compose_events, PldEvent, PldOptions};
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
    // The sampled protocol's ledger is an estimate: the guarantee is the
    // worst case for every example, the easy one's lower number an estimate.
    assert_eq!(easy["example"]["bound"], "worst_case_pld");
    assert_eq!(easy["example"]["epsilon"].as_f64(), Some(pld));
    assert_eq!(
        easy["example"]["estimate"]["epsilon"].as_f64(),
        Some(easy_rdp)
    );
    assert_eq!(easy["example"]["estimate"]["kind"], "estimate");

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
        "delta": 1e-5, "thresholds": "sampled"});
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

/// Norms example 8 reports, at every 40th step: thresholds at many grid levels.
const NORMS_8: [f64; 15] = [
    0.05, 0.3, 0.72, 0.15, 2.0, 0.5, 0.9, 0.01, 0.44, 0.6, 0.33, 0.8, 0.25, 0.07, 1.2,
];

/// Example 8's steps per grid level computed here from the reported norms
/// (spec §3.3: unsampled at `b`, sampled at `min(b, bucket(g))`), by level.
fn counts_of_8(steps: u64, grid: &BucketGrid) -> std::collections::BTreeMap<u32, u64> {
    let mut b = grid.top();
    let mut counts = std::collections::BTreeMap::new();
    for t in 0..steps {
        let level = if t % 40 == 0 {
            let kg = grid.bucket_of(NORMS_8[(t / 40) as usize % NORMS_8.len()]);
            let k = b.min(kg);
            b = kg;
            k
        } else {
            b
        };
        if level > 0 {
            *counts.entry(level).or_insert(0u64) += 1;
        }
    }
    counts
}

#[test]
fn pld_estimate_composes_the_examples_own_levels_and_is_labelled_an_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let (q, sigma, steps) = (0.01, 1.0, 600u64);
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "d", "config": poisson_config(10, q, sigma)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let trainer = server.token("trainer", Some("d"), None);
    for t in 0..steps {
        if t % 40 == 0 {
            let g = NORMS_8[(t / 40) as usize % NORMS_8.len()];
            step(&server, &trainer, t, &[8, 7], &[g, 0.5]);
        } else {
            step(&server, &trainer, t, &[], &[]);
        }
    }
    let owner = server.token("owner", Some("d"), Some("8"));
    let ask = |token: &str, id: u64, query: &str| {
        get(
            &url(
                &server,
                &format!("/examples/{id}/privacy?delta=1e-5{query}"),
            ),
            Some(token),
        )
    };
    let plain = ask(&owner, 8, "");
    assert_eq!(plain.status, 200, "{:?}", plain.body);
    assert!(plain.body.get("pld_estimate").is_none());
    let r = ask(&owner, 8, "&method=pld_estimate");
    assert_eq!(r.status, 200, "{:?}", r.body);
    let est = &r.body["pld_estimate"];
    assert_eq!(est["guarantee"], false);
    // The grid is chosen per query: 1e-3 or a power-of-two refinement of it.
    let h = est["value_discretization"].as_f64().unwrap();
    let refinement = 1e-3 / h;
    assert!((0..8).any(|j| refinement == (1u64 << j) as f64), "grid {h}");
    // The guarantee is untouched by the estimate.
    assert_eq!(r.body["example"], plain.body["example"]);
    assert_eq!(r.body["worst_case"], plain.body["worst_case"]);

    // The levels served are the counts computed here, one per threshold.
    let grid = BucketGrid::new(1.0, 0.01).unwrap();
    let counts = counts_of_8(steps, &grid);
    assert!(counts.len() >= 10, "{counts:?}");
    let served: Vec<(f64, u64)> = est["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert_eq!(l["sampling_rate"].as_f64(), Some(q));
            assert_eq!(l["noise_multiplier"].as_f64(), Some(sigma));
            let v = l["threshold"].as_f64().unwrap();
            assert_eq!(l["effective_noise_multiplier"].as_f64(), Some(sigma / v));
            (v, l["steps"].as_u64().unwrap())
        })
        .collect();
    let want: Vec<(f64, u64)> = counts.iter().map(|(&k, &c)| (grid.value(k), c)).collect();
    assert_eq!(served, want);
    assert_eq!(est["steps"].as_u64(), Some(steps));
    assert_eq!(est["releases"], 0);

    // Its epsilon is the composition of those counts (independent path: a
    // heterogeneous composition planned for exactly these events).
    let events: Vec<PldEvent> = counts
        .iter()
        .map(|(&k, &count)| PldEvent::PoissonGaussian {
            q,
            sigma: sigma * 1.0 / grid.value(k),
            count,
        })
        .collect();
    let opts = PldOptions {
        value_discretization: h,
    };
    let expected = compose_events(&events, &opts, 1e-16)
        .unwrap()
        .epsilon(1e-5)
        .unwrap();
    // Same discretisation (the one served). The server's domain and its
    // single-step supports are sized for a tail of 1e-4 of delta (each costs at
    // most that much delta, pessimistically): never below, and within 1e-4
    // relative above.
    let got = est["epsilon"].as_f64().unwrap();
    assert!(
        close_above(got, expected),
        "served {got} vs composed {expected}"
    );
    // Here PLD is tighter than the example's own RDP bound.
    let rdp = r.body["example"]["rdp_epsilon"].as_f64().unwrap();
    assert!(got < rdp, "estimate {got} vs RDP {rdp}");
    assert!(got > 0.0);

    // Curators and admins may ask too; a query of another id answers its own levels.
    let curator = server.token("curator", Some("d"), None);
    let c = ask(&curator, 8, "&method=pld_estimate");
    assert_eq!(c.status, 200, "{:?}", c.body);
    assert_eq!(c.body["pld_estimate"], *est);
    let seven = ask(&admin, 7, "&method=pld_estimate");
    assert_eq!(seven.status, 200, "{:?}", seven.body);
    let levels7 = seven.body["pld_estimate"]["levels"].as_array().unwrap();
    // Example 7 reported 0.5 from step 0 on: every step at 0.5.
    assert_eq!(levels7.len(), 1, "{levels7:?}");
    let half = grid.value(grid.bucket_of(0.5));
    assert_eq!(levels7[0]["threshold"].as_f64(), Some(half));
    assert_eq!(levels7[0]["steps"].as_u64(), Some(steps));
    // An example never reported: all steps at C, the worst case's events.
    let zero = ask(&admin, 0, "&method=pld_estimate");
    assert_eq!(zero.status, 200, "{:?}", zero.body);
    let w = zero.body["worst_case"]["pld"]["epsilon"].as_f64().unwrap();
    let e0 = zero.body["pld_estimate"]["epsilon"].as_f64().unwrap();
    assert!(
        rel(e0, w) < 1e-3,
        "estimate at C {e0} vs PLD worst case {w}"
    );

    // Authorisation: per-example data only for its owner, curators and admins.
    assert_eq!(ask(&owner, 7, "&method=pld_estimate").status, 403);
    let viewer = server.token("viewer", Some("d"), None);
    assert_eq!(ask(&viewer, 8, "&method=pld_estimate").status, 403);
    assert_eq!(ask(&trainer, 8, "&method=pld_estimate").status, 403);
    // A bad method is a 400 naming the parameter.
    for bad in ["pld", "rdp", "PLD_ESTIMATE", ""] {
        let r = ask(&owner, 8, &format!("&method={bad}"));
        assert_eq!(r.status, 400, "method={bad}: {:?}", r.body);
        assert_eq!(r.body["field"], "method", "{:?}", r.body);
    }
    assert_eq!(ask(&owner, 8, "&method=guarantee").status, 200);

    // Releases are composed into the estimate as into the worst case.
    let r = put(
        &url(&server, "/release-budget"),
        Some(&curator),
        &json!({"rho": 0.01}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = post(
        &url(&server, "/releases"),
        Some(&curator),
        &json!({"mean": {"rho": 0.0025}}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let after = ask(&owner, 8, "&method=pld_estimate");
    assert_eq!(after.status, 200, "{:?}", after.body);
    assert_eq!(after.body["pld_estimate"]["releases"], 1);
    let got_after = after.body["pld_estimate"]["epsilon"].as_f64().unwrap();
    assert!(got_after > got, "{got_after} vs {got}");
}

#[test]
fn shuffle_pld_estimate_is_the_gaussian_composition_of_its_processings() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let (n, batch, sigma, epochs) = (4u64, 2u64, 2.0, 9u64);
    let config = json!({"examples": n, "max_grad_norm": 1.0, "rounding": 0.01,
        "noise_multiplier": sigma, "sampling": {"kind": "shuffle", "batch_size": batch},
        "delta": 1e-5, "thresholds": "sampled"});
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
        // Example 0 reports 0.5 from its second epoch on; the others C.
        let norms: Vec<f64> = ids
            .iter()
            .map(|&i| if i == 0 && t >= per_epoch { 0.5 } else { 5.0 })
            .collect();
        step(&server, &trainer, t, &ids, &norms);
    }
    let curator = server.token("curator", Some("d"), None);
    let ask = |id: u64| {
        let r = get(
            &url(
                &server,
                &format!("/examples/{id}/privacy?delta=1e-5&method=pld_estimate"),
            ),
            Some(&curator),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body
    };
    // Example 1: one Gaussian at C per epoch, mu = sqrt(epochs) / sigma.
    let one = ask(1);
    let est = one["pld_estimate"]["epsilon"].as_f64().unwrap();
    let exact = gaussian_epsilon((epochs as f64).sqrt() / sigma, 1e-5);
    assert!(
        est >= exact * (1.0 - 1e-9) && est <= exact * 1.005,
        "estimate {est} vs exact {exact}"
    );
    assert_eq!(one["pld_estimate"]["guarantee"], false);
    // Example 0: epoch 0 at C, then processed at min(threshold, 0.5) = 0.5 in
    // every later epoch: mu^2 = (1 + (epochs - 1) 0.25) / sigma^2.
    let zero = ask(0);
    let levels = zero["pld_estimate"]["levels"].as_array().unwrap();
    let got: Vec<(f64, f64, u64)> = levels
        .iter()
        .map(|l| {
            (
                l["sampling_rate"].as_f64().unwrap(),
                l["threshold"].as_f64().unwrap(),
                l["steps"].as_u64().unwrap(),
            )
        })
        .collect();
    let grid = BucketGrid::new(1.0, 0.01).unwrap();
    let half = grid.value(grid.bucket_of(0.5));
    assert_eq!(got, vec![(1.0, half, epochs - 1), (1.0, 1.0, 1)]);
    let mu = ((1.0 + (epochs - 1) as f64 * half * half) / (sigma * sigma)).sqrt();
    let est0 = zero["pld_estimate"]["epsilon"].as_f64().unwrap();
    let exact0 = gaussian_epsilon(mu, 1e-5);
    assert!(
        est0 >= exact0 * (1.0 - 1e-9) && est0 <= exact0 * 1.005,
        "estimate {est0} vs exact {exact0}"
    );
}

/// The estimate cache's part of `GET /v1/admin/storage`.
fn estimate_cache(server: &Server, admin: &str) -> Value {
    let r = get(&format!("{}/v1/admin/storage", server.url), Some(admin));
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["estimate_cache"].clone()
}

#[test]
fn estimates_on_a_273_level_grid_are_cached_within_the_bound_and_never_above_rdp() {
    let dir = tempfile::tempdir().unwrap();
    // A bound small enough that the spectra of this test must be evicted.
    let bound: u64 = 3 << 20;
    let server = Server::start_flags(
        dir.path(),
        None,
        &["--estimate-cache-bytes", &bound.to_string()],
    );
    let admin = server.admin_token();
    let (n, q, sigma, steps) = (12u64, 0.01, 1.0, 240u64);
    let config = json!({"examples": n, "max_grad_norm": 1.5, "rounding": 0.0055,
        "noise_multiplier": sigma, "sampling": {"kind": "poisson", "rate": q},
        "delta": 1e-5, "thresholds": "sampled"});
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "d", "config": config}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let grid = BucketGrid::new(1.5, 0.0055).unwrap();
    assert_eq!(grid.top(), 273);
    let trainer = server.token("trainer", Some("d"), None);
    // Every 8th step each example reports a norm at its own spread of levels.
    let ids: Vec<u64> = (0..n).collect();
    for t in 0..steps {
        if t % 8 == 0 {
            let norms: Vec<f64> = ids
                .iter()
                .map(|&i| ((t / 8 * 37 + i * 53) % 273 + 1) as f64 * 0.0055 * 0.999)
                .collect();
            step(&server, &trainer, t, &ids, &norms);
        } else {
            step(&server, &trainer, t, &[], &[]);
        }
    }
    let ask = |id: u64| {
        let r = get(
            &url(
                &server,
                &format!("/examples/{id}/privacy?delta=1e-5&method=pld_estimate"),
            ),
            Some(&admin),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body
    };
    let mut answers = Vec::new();
    for id in 0..n {
        let body = ask(id);
        let est = &body["pld_estimate"];
        let e = est["epsilon"].as_f64().unwrap();
        let rdp = body["example"]["rdp_epsilon"].as_f64().unwrap();
        // The rule of docs/accounting.md: never above the example's RDP epsilon.
        assert!(
            e <= rdp,
            "example {id}: estimate {e} above its RDP epsilon {rdp}"
        );
        let levels = est["levels"].as_array().unwrap();
        assert!(levels.len() >= 10, "example {id}: {} levels", levels.len());
        // The composition of the levels served, on the grid served.
        let h = est["value_discretization"].as_f64().unwrap();
        let events: Vec<PldEvent> = levels
            .iter()
            .map(|l| PldEvent::PoissonGaussian {
                q,
                sigma: l["effective_noise_multiplier"].as_f64().unwrap(),
                count: l["steps"].as_u64().unwrap(),
            })
            .collect();
        let opts = PldOptions {
            value_discretization: h,
        };
        let want = compose_events(&events, &opts, 1e-16)
            .unwrap()
            .epsilon(1e-5)
            .unwrap()
            .min(rdp);
        assert!(close_above(e, want), "example {id}: served {e} vs {want}");
        answers.push(body);
    }
    let before = estimate_cache(&server, &admin);
    assert!(before["bytes"].as_u64().unwrap() <= bound, "{before}");
    assert_eq!(before["bound_bytes"].as_u64(), Some(bound));
    assert!(before["evictions"].as_u64().unwrap() > 0, "{before}");
    assert!(before["answers"].as_u64().unwrap() >= 1, "{before}");
    // Asking again is answered from the cache: same answer, one more hit, no
    // miss (asked twice in a row: the bound here is small enough that other
    // examples' spectra evict older answers).
    let first = ask(3);
    let before = estimate_cache(&server, &admin);
    let again = ask(3);
    assert_eq!(again["pld_estimate"], first["pld_estimate"]);
    assert_eq!(again["pld_estimate"], answers[3]["pld_estimate"]);
    let after = estimate_cache(&server, &admin);
    assert_eq!(after["misses"], before["misses"], "{after}");
    assert!(after["hits"].as_u64() > before["hits"].as_u64(), "{after}");
    // A step changes every history: the old answer is not served.
    step(&server, &trainer, steps, &[], &[]);
    let moved = ask(3);
    assert_eq!(
        moved["pld_estimate"]["steps"].as_u64(),
        Some(answers[3]["pld_estimate"]["steps"].as_u64().unwrap() + 1)
    );
    assert_ne!(
        moved["pld_estimate"]["epsilon"],
        answers[3]["pld_estimate"]["epsilon"]
    );
    assert!(estimate_cache(&server, &admin)["bytes"].as_u64().unwrap() <= bound);
}

/// `served` is the composition `composed` as the estimate computes it: never
/// below it (beyond round-off), at most 1e-4 relative above it (the estimate's
/// delta-relative tails, `TAIL_FRACTION` in `src/accounting/pld/estimate.rs`).
fn close_above(served: f64, composed: f64) -> bool {
    served >= composed * (1.0 - 1e-9) && served <= composed * (1.0 + 1e-4)
}

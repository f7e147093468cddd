//! Releases computed while steps keep flowing, against the
//! real server: a trainer posts steps without pause while a curator asks for
//! releases. Every step is accepted; every release describes the ledger exactly
//! at the step it names (its bound `B` and its mean match an offline ledger
//! taken to that step, with the earlier releases charged), and the charges
//! reach the served values as before.

mod common;

use common::*;
use dpledger::accounting::Conversion;
use dpledger::ledger::bounds::{capped_value, combine_worst_case, pld_worst_case};
use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
use dpledger::release::mean::mean_sigmas;
use dpledger::release::{rdp_of_rho, release_pld_events, ReleaseRequest};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const N: u64 = 60_000;
const Q: f64 = 0.01;
const RELEASES: usize = 6;
const DELTA: f64 = 1e-5;

/// Step `t`'s report: the same for the server and the offline ledger.
fn report(t: u64) -> (Vec<u64>, Vec<f64>) {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(t);
    let ids: Vec<u64> = (0..N).filter(|_| rng.random::<f64>() < Q).collect();
    let norms = ids.iter().map(|_| rng.random_range(0.0..1.5)).collect();
    (ids, norms)
}

/// The offline ledger at `step` with `releases` charged: its bound and mean.
fn offline(config: &DatasetConfig, step: u64, releases: &[ReleaseRequest]) -> (f64, f64) {
    let mut ledger = Ledger::new(config.clone()).unwrap();
    for t in 0..step {
        let (ids, norms) = report(t);
        ledger.step(&StepReport::new(t, ids, norms)).unwrap();
    }
    for r in releases {
        let events = release_pld_events(r);
        ledger
            .charge_release_with_pld(&rdp_of_rho(ledger.orders(), r.rho()), Some(&events), &[])
            .unwrap();
    }
    let rdp = ledger.worst_case(DELTA, Conversion::default()).unwrap();
    let pld = pld_worst_case(&ledger.pld_events().unwrap(), DELTA);
    let worst = combine_worst_case(rdp, pld);
    let cap = worst.pld.map(|p| p.epsilon);
    let eps = ledger.epsilons(DELTA, Conversion::default()).unwrap();
    let mean = eps
        .iter()
        .map(|e| capped_value(e.epsilon, cap))
        .sum::<f64>()
        / N as f64;
    (worst.epsilon, mean)
}

#[test]
fn releases_describe_one_step_while_steps_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let config = poisson_config(N, Q, 1.0);
    let body = json!({"id": "d", "config": config, "release_budget": {"rho": 1e6}});
    let r = post(&format!("{}/v1/datasets", server.url), Some(&admin), &body);
    assert_eq!(r.status, 201, "{:?}", r.body);
    let steps_url = format!("{}/v1/datasets/d/steps", server.url);
    let post_step = |t: u64| {
        let (ids, norms) = report(t);
        let r = post(
            &steps_url,
            Some(&admin),
            &json!({"step": t, "ids": ids, "norms": norms}),
        );
        assert_eq!(r.status, 200, "step {t}: {:?}", r.body);
    };
    for t in 0..5 {
        post_step(t);
    }
    // The trainer: steps without pause until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let trainer = {
        let stop = stop.clone();
        let (url, token) = (steps_url.clone(), admin.clone());
        std::thread::spawn(move || {
            let mut t = 5;
            while !stop.load(Ordering::Relaxed) {
                let (ids, norms) = report(t);
                let r = post(
                    &url,
                    Some(&token),
                    &json!({"step": t, "ids": ids, "norms": norms}),
                );
                assert_eq!(r.status, 200, "step {t}: {:?}", r.body);
                t += 1;
            }
            t
        })
    };
    let mut released = Vec::new();
    for _ in 0..RELEASES {
        let r = post(
            &format!("{}/v1/datasets/d/releases", server.url),
            Some(&admin),
            &json!({"mean": {"rho": 0.01}}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
        released.push(r.body["release"].clone());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let steps = trainer.join().unwrap();
    assert!(steps > 5, "the trainer made no progress");

    let config: DatasetConfig = serde_json::from_value(config).unwrap();
    let mut charged: Vec<ReleaseRequest> = Vec::new();
    let mut last_step = 0;
    for (k, rel) in released.iter().enumerate() {
        assert_eq!(rel["id"], json!(k as u64 + 1));
        let step = rel["step"].as_u64().unwrap();
        assert!(
            step >= last_step && step <= steps,
            "release {k} at step {step}"
        );
        last_step = step;
        let (bound, mean) = offline(&config, step, &charged);
        let got_bound = rel["bound"].as_f64().unwrap();
        assert!(
            (got_bound - bound).abs() <= 1e-9 * bound,
            "release {k} at step {step}: bound {got_bound}, offline {bound}"
        );
        // The bound pins the step exactly (the worst case grows at every
        // step). The mean is noisy: Gaussian noise of sd `s_sum` on the centred
        // sum and `s_count` on the count, so it must lie within 6 sd of the
        // offline mean at that step (a false alarm about once in 5e8); a pass
        // that read later steps' values drifts by about the per-step change
        // for each step it ran behind.
        let got_mean = rel["values"]["population"]["mean"]["mean"]
            .as_f64()
            .unwrap();
        let (s_sum, s_count) = mean_sigmas(got_bound, 0.01);
        let sd = (s_sum.powi(2) + ((mean - got_bound / 2.0) * s_count).powi(2)).sqrt() / N as f64;
        let (_, before) = offline(&config, step.saturating_sub(1), &charged);
        assert!(
            (got_mean - mean).abs() < 6.0 * sd,
            "release {k} at step {step}: mean {got_mean}, offline {mean} (sd {sd}; step before: {before})"
        );
        charged.push(serde_json::from_value::<ReleaseRequest>(rel["request"].clone()).unwrap());
    }
    // Every charge reached the served worst case: the ledger now holds them all.
    let worst: Value = get(
        &format!("{}/v1/datasets/d/worst-case", server.url),
        Some(&admin),
    )
    .body;
    assert_eq!(worst["steps"], json!(steps));
    let (bound_now, _) = offline(&config, steps, &charged);
    let served = worst["epsilon"].as_f64().unwrap();
    assert!(
        (served - bound_now).abs() <= 1e-9 * bound_now,
        "{served} vs {bound_now}"
    );
}

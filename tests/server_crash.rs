//! Durability of the real server: a client streams steps while the server
//! is SIGKILLed at random moments. After every restart each acknowledged step is
//! present exactly once, the one unacknowledged in-flight step is fully present or
//! absent, retries of unacknowledged steps are not double-counted, and at the end
//! every example's epsilon equals an offline replay of the applied trace.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let (n, q) = (300u64, 0.05);
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "crash", "config": poisson_config(n, q, 1.0)}),
    );
    assert_eq!(r.status, 201);
    let trace = Arc::new(poisson_trace(42, n, q, 20_000));
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
    // Steps the client saw acknowledged: 0..acked.
    let mut acked = 0u64;
    let mut duplicates_seen = 0;
    for round in 0..24 {
        let url = format!("{}/v1/datasets/crash/steps", server.url);
        let progress = Arc::new(AtomicU64::new(acked));
        let client = {
            let (trace, progress, admin) = (trace.clone(), progress.clone(), admin.clone());
            std::thread::spawn(move || {
                let mut dups = 0;
                loop {
                    let t = progress.load(Ordering::SeqCst);
                    match try_post(&url, &admin, &trace[t as usize], Duration::from_secs(10)) {
                        Some((200, body)) => {
                            assert_eq!(body["step"], t);
                            if body["duplicate"] == true {
                                dups += 1;
                            }
                            progress.store(t + 1, Ordering::SeqCst);
                        }
                        Some((code, body)) => panic!("step {t}: {code} {body}"),
                        None => return dups, // server died: this step is unacknowledged
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        server.kill();
        duplicates_seen += client.join().expect("client thread");
        acked = progress.load(Ordering::SeqCst);
        server.restart();
        let status = get(&format!("{}/v1/datasets/crash", server.url), Some(&admin));
        let steps = status.body["status"]["steps"].as_u64().unwrap();
        assert!(
            steps >= acked,
            "round {round}: acknowledged {acked} steps but only {steps} survived"
        );
        assert!(
            steps <= acked + 1,
            "round {round}: {steps} steps present, only {acked} acknowledged + 1 in flight"
        );
        // The client retries from its last acknowledged step; if the in-flight step
        // was persisted, the retry is answered as a duplicate (not double-counted).
    }
    assert!(
        acked > 24,
        "the client made too little progress ({acked} steps) to test anything"
    );
    // Finish: the retry of a possibly-persisted step and the final state.
    let url = format!("{}/v1/datasets/crash/steps", server.url);
    let (code, body) = try_post(
        &url,
        &admin,
        &trace[acked as usize],
        Duration::from_secs(10),
    )
    .expect("server up");
    assert_eq!(code, 200);
    if body["duplicate"] == true {
        duplicates_seen += 1;
    }
    let status = get(&format!("{}/v1/datasets/crash", server.url), Some(&admin));
    let applied = status.body["status"]["steps"].as_u64().unwrap();
    assert_eq!(applied, acked + 1);
    eprintln!("{applied} steps applied across 24 SIGKILLs; {duplicates_seen} retried steps were answered as duplicates");
    // Offline replay of exactly the applied trace equals the served epsilons.
    let mut text = json!({"dataset": {"examples": n, "max_grad_norm": 1.0, "rounding": 0.01, "noise_multiplier": 1.0, "sampling_rate": q}}).to_string() + "\n";
    for line in &trace[..applied as usize] {
        text.push_str(&format!("{line}\n"));
    }
    let path = dir.path().join("applied.jsonl");
    std::fs::write(&path, text).unwrap();
    let offline = replay(&path, 1e-5);
    assert_served_matches_replay(&server, "crash", &admin, &offline, 1e-5);
}

#[test]
fn corrupt_or_truncated_store_refuses_to_start() {
    for damage in ["flip-middle", "flip-header", "truncate"] {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(dir.path(), None);
        let admin = server.admin_token();
        let r = post(
            &format!("{}/v1/datasets", server.url),
            Some(&admin),
            &json!({"id": "d", "config": poisson_config(2000, 0.5, 1.0)}),
        );
        assert_eq!(r.status, 201);
        for t in 0..40u64 {
            let ids: Vec<u64> = (0..1000).map(|i| (i * 2 + t) % 2000).collect();
            let norms: Vec<f64> = ids.iter().map(|i| (*i % 13) as f64 / 10.0).collect();
            let r = post(
                &format!("{}/v1/datasets/d/steps", server.url),
                Some(&admin),
                &json!({"step": t, "ids": ids, "norms": norms}),
            );
            assert_eq!(r.status, 200);
        }
        server.kill();
        let db = dir.path().join("dpledger.sqlite");
        // Fold the WAL into the main file so the damage hits the data.
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
        drop(conn);
        let mut bytes = std::fs::read(&db).unwrap();
        match damage {
            "flip-middle" => {
                let mid = bytes.len() / 2;
                for b in &mut bytes[mid..mid + 64] {
                    *b ^= 0x5a;
                }
            }
            "flip-header" => bytes[0..16].iter_mut().for_each(|b| *b ^= 0xff),
            _ => bytes.truncate(bytes.len() * 2 / 3),
        }
        std::fs::write(&db, &bytes).unwrap();
        let _ = std::fs::remove_file(dir.path().join("dpledger.sqlite-wal"));
        match Server::try_start(dir.path(), None) {
            Ok(_) => panic!("{damage}: the server started on a damaged store"),
            Err(message) => {
                assert!(
                    message.contains("refusing to start")
                        || message.contains("cannot open the store"),
                    "{damage}: {message}"
                );
            }
        }
    }
}

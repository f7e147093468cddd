//! Crashes during snapshot writing and compaction: a client streams
//! steps to a server that snapshots after every two records while `dpledger
//! compact` runs in a loop beside it; 20 times, at random moments, the server
//! and any compaction in flight are SIGKILLed. After each restart no
//! acknowledged step is lost and at most the one in flight was added; at the
//! end the served epsilons equal an offline replay of the applied trace.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Large enough that a snapshot takes a noticeable time to write (about 13 MB).
const N: u64 = 20_000;
const Q: f64 = 0.02;

#[test]
fn sigkill_during_snapshots_and_compaction_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--snapshot-records", "2", "--snapshot-seconds", "1"];
    let mut server = Server::start_flags(dir.path(), None, &flags);
    let admin = server.admin_token();
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "c", "config": poisson_config(N, Q, 1.0)}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let trace = Arc::new(poisson_trace(11, N, Q, 20_000));
    let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
    let mut acked = 0u64;
    let store_url = format!("sqlite:{}", dir.path().join("dpledger.sqlite").display());
    for round in 0..20 {
        let url = format!("{}/v1/datasets/c/steps", server.url);
        let progress = Arc::new(AtomicU64::new(acked));
        let client = {
            let (trace, progress, admin) = (trace.clone(), progress.clone(), admin.clone());
            std::thread::spawn(move || loop {
                let t = progress.load(Ordering::SeqCst);
                if t as usize >= trace.len() {
                    return;
                }
                match try_post(&url, &admin, &trace[t as usize], Duration::from_secs(20)) {
                    Some((200, body)) => {
                        assert_eq!(body["step"], t);
                        progress.store(t + 1, Ordering::SeqCst);
                    }
                    Some((code, body)) => panic!("step {t}: {code} {body}"),
                    None => return,
                }
            })
        };
        // Compactions run beside the server until the kill.
        let stop = Arc::new(AtomicBool::new(false));
        let running: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
        let compactor = {
            let (stop, running, store_url) = (stop.clone(), running.clone(), store_url.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let child = Command::new(binary())
                        .args(["compact", "--store", &store_url])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap();
                    *running.lock().unwrap() = Some(child);
                    loop {
                        let mut guard = running.lock().unwrap();
                        match guard.as_mut().map(|c| c.try_wait()) {
                            Some(Ok(None)) => {}
                            _ => break,
                        }
                        drop(guard);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(150..1200)));
        if let Some(child) = running.lock().unwrap().as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        server.kill();
        stop.store(true, Ordering::SeqCst);
        compactor.join().unwrap();
        client.join().expect("client thread");
        acked = progress.load(Ordering::SeqCst);
        server.restart();
        let status = get(&format!("{}/v1/datasets/c", server.url), Some(&admin));
        assert_eq!(status.status, 200, "round {round}: {:?}", status.body);
        let steps = status.body["status"]["steps"].as_u64().unwrap();
        assert!(
            steps >= acked && steps <= acked + 1,
            "round {round}: {acked} acknowledged, {steps} present"
        );
        // The client resumes from what the server holds (a persisted in-flight
        // step would be answered as a duplicate).
        acked = steps;
    }
    assert!(
        acked > 20,
        "too little progress ({acked} steps) to test anything"
    );
    let store = dpledger::store::open(&store_url).unwrap();
    assert!(!store.snapshots().unwrap().is_empty());
    assert!(
        !store.compactions().unwrap().is_empty(),
        "no compaction completed"
    );
    // Offline replay of exactly the applied trace equals the served epsilons.
    let mut text = json!({"dataset": {"examples": N, "max_grad_norm": 1.0, "rounding": 0.01,
        "noise_multiplier": 1.0, "sampling_rate": Q}})
    .to_string()
        + "\n";
    for line in &trace[..acked as usize] {
        text.push_str(&format!("{line}\n"));
    }
    let path = dir.path().join("applied.jsonl");
    std::fs::write(&path, text).unwrap();
    let offline = replay(&path, 1e-5);
    for ex in offline["examples"].as_array().unwrap().iter().step_by(97) {
        let id = ex["id"].as_u64().unwrap();
        let r = get(
            &format!("{}/v1/datasets/c/examples/{id}/privacy", server.url),
            Some(&admin),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let served = r.body["example"]["rdp_epsilon"].as_f64().unwrap();
        let want = ex["rdp_epsilon"].as_f64().unwrap();
        assert!(
            rel(served, want) <= 1e-12,
            "example {id}: {served} vs {want}"
        );
    }
    eprintln!("{acked} steps across 20 SIGKILLs during snapshots and compactions");
}

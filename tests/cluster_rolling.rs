//! Rolling restart under load: every node of three, in turn, gets
//! SIGTERM (it drains: hands its datasets over one by one, then exits) and is
//! started again (it rejoins and takes a fair share back by graceful
//! handover), while the Rust client streams steps to one dataset, a second
//! trainer streams to another, and an owner keeps reading their example's
//! privacy. No request fails except with a retryable answer the clients
//! retry: zero errors reach the callers; every acknowledged step is in the log
//! exactly once; the served values equal a single-node `dpledger replay`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::*;
use dpledger_client::{Client, PrivacyQuery, RetryPolicy, StepReport};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn client(base: &str, token: &str) -> Client {
    Client::builder(base)
        .token(token)
        .retry(RetryPolicy {
            max_attempts: 60,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
        })
        .build()
        .unwrap()
}

#[test]
fn every_node_restarted_in_turn_under_load_fails_no_request() {
    let Some(mut cluster) = Cluster::start(3, 1000) else {
        return;
    };
    let (n, q) = (60u64, 0.1);
    for (i, d) in ["r1", "r2", "r3"].iter().enumerate() {
        cluster.create(i, d, n, q);
    }
    cluster.wait_balanced(Duration::from_secs(20));
    let admin = cluster.admin_token();
    let owner3 = cluster.token("owner", Some("r1"), Some("3"));
    let stop = Arc::new(AtomicBool::new(false));
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();

    // The Rust client's trainer on r1, starting at n1 (it routes by the map).
    let trace = Arc::new(poisson_trace(23, n, q, 50_000));
    let trainer = {
        let (base, admin, trace, stop) =
            (urls[0].clone(), admin.clone(), trace.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let c = client(&base, &admin);
            let mut errors = Vec::new();
            let mut t = 0usize;
            while !stop.load(Ordering::SeqCst) && t < trace.len() {
                let line = &trace[t];
                let report = StepReport::new(
                    t as u64,
                    line["ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .collect(),
                    line["norms"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap())
                        .collect(),
                );
                match rt.block_on(c.report_step("r1", &report)) {
                    Ok(out) if out.step == t as u64 => t += 1,
                    Ok(out) => errors.push(format!("step {t} answered as {}", out.step)),
                    Err(e) => errors.push(format!("step {t}: {e}")),
                }
                if errors.len() > 10 {
                    break;
                }
            }
            (t as u64, errors)
        })
    };
    // The owner of example 3 reads its privacy, through n2.
    let reader = {
        let (base, token, stop) = (urls[1].clone(), owner3.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let c = client(&base, &token);
            let (mut reads, mut errors) = (0u64, Vec::new());
            while !stop.load(Ordering::SeqCst) && errors.len() <= 10 {
                match rt.block_on(c.example_privacy("r1", 3, PrivacyQuery::at_delta(1e-5))) {
                    Ok(_) => reads += 1,
                    Err(e) => errors.push(format!("read {reads}: {e}")),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (reads, errors)
        })
    };
    // A plain HTTP trainer on r2 that retries what is retryable (503, refused
    // connections) through any node.
    let trace2 = Arc::new(poisson_trace(24, n, q, 50_000));
    let acked2 = Arc::new(AtomicU64::new(0));
    let trainer2 = {
        let (urls, admin, trace2, stop, acked2) = (
            urls.clone(),
            admin.clone(),
            trace2.clone(),
            stop.clone(),
            acked2.clone(),
        );
        std::thread::spawn(move || stream(urls, "r2".into(), admin, trace2, stop, acked2))
    };

    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..cluster.nodes.len() {
        assert!(
            cluster.nodes[i].terminate(Duration::from_secs(30)),
            "node {i} did not drain and exit on SIGTERM"
        );
        cluster.restart(i);
        // It rejoins and takes its share back before the next node goes.
        cluster.wait_balanced(Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    let (acked, errors) = trainer.join().unwrap();
    let (reads, read_errors) = reader.join().unwrap();
    let seen2 = trainer2.join().unwrap();
    assert!(errors.is_empty(), "the Rust client saw errors: {errors:?}");
    assert!(
        read_errors.is_empty(),
        "the owner saw errors: {read_errors:?}"
    );
    assert!(seen2.failures.is_empty(), "r2: {:?}", seen2.failures);
    assert!(acked > 0 && reads > 0 && seen2.acked > 0);
    // r1: the client stopped after an acknowledgement: exactly what was acked.
    let logged: Vec<i64> = cluster.logged_steps("r1").iter().map(|r| r.1).collect();
    assert_eq!(logged, (0..acked as i64).collect::<Vec<_>>());
    // r2: every acknowledged step, at most one more in flight at the stop.
    let logged2: Vec<i64> = cluster.logged_steps("r2").iter().map(|r| r.1).collect();
    assert!(logged2.len() as u64 >= seen2.acked && logged2.len() as u64 <= seen2.acked + 1);
    assert_eq!(logged2, (0..logged2.len() as i64).collect::<Vec<_>>());
    for d in ["r1", "r2", "r3"] {
        assert_epochs_monotone(&cluster, d);
    }
    assert_matches_replay(&cluster, "r1", n, q, &trace, acked);
    assert_matches_replay(&cluster, "r2", n, q, &trace2, logged2.len() as u64);
    eprintln!(
        "rolling restart of 3 nodes in {:.1?}: r1 {acked} steps (Rust client), r2 {} steps \
         ({} retryable answers retried), {reads} owner reads; 0 errors",
        started.elapsed(),
        logged2.len(),
        seen2.retried
    );
}

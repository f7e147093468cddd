//! Step reports against the real server: both encodings, parts, retries that are
//! answered as duplicates, retries across a restart, the threshold mirror, and a
//! session's trace replayed offline.

mod common;

use common::proxy::{answer_dropping_proxy, socket_addr};
use common::{binary, config, rel, Env, Rng};
use dpledger_client::local::{replay, LocalServer};
use dpledger_client::{
    Client, Encoding, Error, IndividualBudget, Part, PrivacyQuery, RetryPolicy, StepReport,
    TrainingSession,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn json_and_binary_reports_are_the_same_report() {
    let env = Env::start();
    env.admin
        .create_dataset("e", &config(5000, 0.01, 1.0))
        .await
        .unwrap();
    let c = &env.admin;
    // Sorted ids with large gaps: the binary body delta-encodes them.
    let sorted = StepReport::new(0, vec![3, 999, 1000, 4999], vec![0.1, 0.2 + 0.1, 7.0, 0.0]);
    let first = c
        .report_step_with("e", &sorted, Encoding::Binary)
        .await
        .unwrap();
    assert!(!first.duplicate && first.complete);
    // The same report in JSON is recognised as a retry: the norms arrived bit for bit.
    let again = c
        .report_step_with("e", &sorted, Encoding::Json)
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.thresholds, first.thresholds);

    // Unsorted ids and per-step overrides, JSON first, then binary.
    let mut custom = StepReport::new(1, vec![42, 7, 4000], vec![1.5, 0.123456789, 0.5]);
    custom.noise_multiplier = Some(1.7);
    custom.sampling_rate = Some(0.02);
    let first = c
        .report_step_with("e", &custom, Encoding::Json)
        .await
        .unwrap();
    assert!(!first.duplicate);
    let again = c
        .report_step_with("e", &custom, Encoding::Binary)
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(
        again,
        dpledger_client::StepOutcome {
            duplicate: true,
            ..first
        }
    );

    // Different content for an applied step is a conflict, not a duplicate.
    let mut changed = custom.clone();
    changed.norms[0] = 1.25;
    let err = c.report_step("e", &changed).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");

    // A step in two parts, in binary.
    let mut a = StepReport::new(2, vec![10, 11], vec![0.5, 0.25]);
    a.part = Some(Part { index: 0, count: 2 });
    let mut b = StepReport::new(2, vec![12], vec![2.0]);
    b.part = Some(Part { index: 1, count: 2 });
    let pa = c.report_step("e", &a).await.unwrap();
    assert!(!pa.complete);
    assert_eq!(pa.part, a.part);
    let pb = c.report_step("e", &b).await.unwrap();
    assert!(pb.complete);
    assert_eq!(c.dataset("e").await.unwrap().status.steps, 3);

    // Empty batches are steps too.
    let empty = c
        .report_step("e", &StepReport::new(3, vec![], vec![]))
        .await
        .unwrap();
    assert!(empty.complete && empty.thresholds.is_empty());
    // Mismatched lengths never leave the client.
    assert!(matches!(
        c.report_step("e", &StepReport::new(4, vec![1, 2], vec![0.5]))
            .await,
        Err(Error::InvalidRequest(_))
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_step_whose_answer_was_lost_is_a_success() {
    let env = Env::start();
    env.admin
        .create_dataset("r", &config(100, 0.1, 1.0))
        .await
        .unwrap();
    let steps: &[u8] = b"POST /v1/datasets/r/steps";
    let (proxy, dropped) = answer_dropping_proxy(socket_addr(env.server.url()), steps, 1).await;
    let token = env.server.token("trainer", Some("r"), None).unwrap();
    let through_proxy = Client::builder(format!("http://{proxy}"))
        .token(token)
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap();
    let report = StepReport::new(0, vec![5, 9], vec![0.4, 3.0]);
    let outcome = through_proxy.report_step("r", &report).await.unwrap();
    // The first attempt was applied and its answer lost; the retry is answered as a
    // duplicate with the original thresholds, and the step counts once.
    assert!(outcome.duplicate, "{outcome:?}");
    assert!(rel(outcome.thresholds[0], 0.4) < 1e-12 && outcome.thresholds[1] == 1.0);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(env.admin.dataset("r").await.unwrap().status.steps, 1);

    // A session mirrors a duplicate answer like a fresh one.
    let (proxy, dropped) = answer_dropping_proxy(socket_addr(env.server.url()), steps, 1).await;
    let via = Client::builder(format!("http://{proxy}"))
        .token(env.server.token("trainer", Some("r"), None).unwrap())
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap();
    let mut session = TrainingSession::open(via, "r").await.unwrap();
    assert_eq!(session.next_step(), 1);
    let out = session.report(vec![9], vec![0.05]).await.unwrap();
    assert!(out.duplicate);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(session.next_step(), 2);
    assert!(rel(session.mirror().threshold(9), 0.05) < 1e-12);

    // Without retries the lost answer is an error, never a silent success.
    let (proxy, _) = answer_dropping_proxy(socket_addr(env.server.url()), steps, 1).await;
    let once = Client::builder(format!("http://{proxy}"))
        .token(env.server.token("trainer", Some("r"), None).unwrap())
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    match once
        .report_step("r", &StepReport::new(2, vec![1], vec![0.5]))
        .await
    {
        Err(Error::Transport { attempts: 1, .. }) => {}
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_ride_out_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = LocalServer::start_on(&binary(), dir.path(), &listen).unwrap();
    let admin = Client::builder(server.url())
        .token(server.admin_token().unwrap())
        .retry(RetryPolicy {
            max_attempts: 40,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap();
    admin
        .create_dataset("s", &config(10, 0.5, 1.0))
        .await
        .unwrap();
    admin
        .report_step("s", &StepReport::new(0, vec![1], vec![0.5]))
        .await
        .unwrap();
    server.stop();

    // The report starts while nothing listens; the server comes back on the same
    // port from its log half a second later.
    let report = tokio::spawn({
        let admin = admin.clone();
        async move {
            admin
                .report_step("s", &StepReport::new(1, vec![2], vec![0.25]))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!report.is_finished());
    let restarted = LocalServer::start_on(&binary(), dir.path(), &listen).unwrap();
    let outcome = report.await.unwrap().unwrap();
    assert!(!outcome.duplicate && outcome.complete);
    assert_eq!(admin.dataset("s").await.unwrap().status.steps, 2);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread")]
async fn mirror_applies_thresholds_and_retirements() {
    let env = Env::start();
    let n = 40u64;
    let mut cfg = config(n, 0.3, 2.0);
    cfg.individual_budget = Some(IndividualBudget {
        epsilon: 3.0,
        delta: 1e-5,
    });
    env.admin.create_dataset("f", &cfg).await.unwrap();
    let trainer = env.client_as("trainer", Some("f"), None);
    let mut session = TrainingSession::open(trainer.clone(), "f").await.unwrap();
    assert!(session.mirror().thresholds().iter().all(|&t| t == 1.0));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut retired_seen = Vec::new();
    for t in 0..40u64 {
        let ids: Vec<u64> = rng
            .batch(n, 0.3)
            .into_iter()
            .filter(|&i| !session.mirror().is_retired(i))
            .collect();
        // Examples 0..10 have large norms, the rest small ones; some exactly zero.
        let norms: Vec<f64> = ids
            .iter()
            .map(|&i| match i {
                0..10 => 1.0 + rng.uniform(),
                10..15 => 0.0,
                _ => 0.6 * rng.uniform(),
            })
            .collect();
        session.set_encoding(if t % 2 == 1 {
            Encoding::Json
        } else {
            Encoding::Binary
        });
        let out = session.report(ids, norms).await.unwrap();
        assert_eq!(out.step, t);
        retired_seen.extend(out.retired.iter().copied());
        if t == 20 {
            let all: Vec<u64> = (0..n).collect();
            let norms: Vec<f64> = all.iter().map(|&i| 0.02 * i as f64).collect();
            let r = session.refresh(&all, &norms).await.unwrap();
            assert_eq!(r.effective_step, 21);
            retired_seen.extend(r.retired.iter().copied());
        }
        // The mirror equals the server's thresholds after every step.
        let served = trainer.thresholds("f", None, None).await.unwrap();
        assert_eq!(served.next_step, t + 1);
        assert_eq!(
            session.mirror().thresholds(),
            &served.thresholds[..],
            "step {t}"
        );
    }
    assert!(
        !retired_seen.is_empty(),
        "the budget is small enough that the filter retires examples"
    );
    assert_eq!(session.mirror().retired_count(), {
        let mut r = retired_seen.clone();
        r.sort();
        r.dedup();
        r.len()
    });
    let status = env.admin.dataset("f").await.unwrap().status;
    assert_eq!(status.retired as usize, session.mirror().retired_count());
    for &id in &retired_seen {
        assert!(session.mirror().is_retired(id));
        assert_eq!(session.mirror().threshold(id), 0.0);
        let p = env
            .admin
            .example_privacy("f", id, PrivacyQuery::default())
            .await
            .unwrap();
        assert!(p.example.retired);
        // The sampled protocol's filter keeps its ledger (an estimate) within budget.
        assert!(
            p.example.rdp_epsilon <= 3.0 * (1.0 + 1e-9),
            "{}",
            p.example.rdp_epsilon
        );
    }
    // A second session resumes from the server's state.
    let resumed = TrainingSession::open(trainer, "f").await.unwrap();
    assert_eq!(resumed.next_step(), 40);
    assert_eq!(resumed.mirror().thresholds(), session.mirror().thresholds());
    // … and knows which examples are retired, not merely at threshold 0.
    assert_eq!(
        resumed.mirror().retired_count(),
        session.mirror().retired_count()
    );
    for &id in &retired_seen {
        assert!(resumed.mirror().is_retired(id));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn served_epsilons_equal_a_replay_of_the_session_trace() {
    let env = Env::start();
    let n = 60u64;
    let cfg = config(n, 0.2, 1.2);
    env.admin.create_dataset("t", &cfg).await.unwrap();
    let mut session = TrainingSession::open(env.client_as("trainer", Some("t"), None), "t")
        .await
        .unwrap();
    let trace = env.dir.path().join("trace.jsonl");
    session.record_trace(&trace).unwrap();
    let mut rng = Rng(7);
    for t in 0..30 {
        let ids = rng.batch(n, 0.2);
        let norms: Vec<f64> = ids
            .iter()
            .map(|&i| (i as f64 / n as f64) * 1.5 * rng.uniform())
            .collect();
        session.report(ids, norms).await.unwrap();
        if t % 10 == 9 {
            let all: Vec<u64> = (0..n).collect();
            let norms: Vec<f64> = all.iter().map(|_| rng.uniform()).collect();
            session.refresh(&all, &norms).await.unwrap();
        }
    }
    let offline = replay(&binary(), &trace, 1e-5).unwrap();
    let worst = offline["worst_case"]["epsilon"].as_f64().unwrap();
    let examples = offline["examples"].as_array().unwrap();
    assert_eq!(examples.len(), n as usize);
    let mut below = 0;
    for ex in examples {
        let id = ex["id"].as_u64().unwrap();
        let served = env
            .admin
            .example_privacy("t", id, PrivacyQuery::at_delta(1e-5))
            .await
            .unwrap();
        let want = ex["epsilon"].as_f64().unwrap();
        assert!(
            rel(served.example.epsilon, want) <= 1e-12,
            "example {id}: {} vs {want}",
            served.example.epsilon
        );
        assert!(rel(served.worst_case.epsilon, worst) <= 1e-12);
        let estimate = ex["rdp_epsilon"].as_f64().unwrap();
        assert!(rel(served.example.rdp_epsilon, estimate) <= 1e-12);
        if served.example.rdp_epsilon < 0.99 * worst {
            below += 1;
        }
    }
    assert!(
        below > 0,
        "small norms give some examples less than the worst case"
    );
    // The PLD estimate: beside the unchanged guarantee, labelled not one.
    let plain = env
        .admin
        .example_privacy("t", 3, PrivacyQuery::at_delta(1e-5))
        .await
        .unwrap();
    assert!(plain.pld_estimate.is_none());
    let view = env
        .admin
        .example_pld_estimate("t", 3, PrivacyQuery::at_delta(1e-5))
        .await
        .unwrap();
    assert_eq!(view.example, plain.example);
    let est = view.pld_estimate.expect("asked for");
    assert!(!est.guarantee && est.epsilon > 0.0);
    assert_eq!(est.steps, 30);
    assert_eq!(est.levels.iter().map(|l| l.steps).sum::<u64>(), 30);
}

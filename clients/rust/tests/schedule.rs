//! A training session in the predictable mode (the server's default) follows
//! the dataset's public refresh schedule: it sends the due ids' norms before
//! each step, full passes and round-robin blocks, with no 409 over many steps;
//! a step sent before the due refresh is refused by the session (and, sent
//! anyway, by the server); the thresholds the session clips at are the
//! server's; a reopened session knows what is due.

mod common;

use common::{Env, Rng};
use dpledger_client::{
    Client, DatasetConfig, Error, LedgerKind, PrivacyQuery, RefreshSchedule, StepReport,
    ThresholdMode, TrainingSession,
};

/// A predictable (default mode) Poisson dataset with a refresh schedule.
fn predictable(n: u64, q: f64, full_every: Option<u64>, block: Option<u64>) -> DatasetConfig {
    let mut c = DatasetConfig::poisson(n, 1.0, 1.0, q, 1e-5);
    c.rounding = Some(0.01);
    c.refresh = Some(RefreshSchedule {
        full_every,
        block,
        shard: None,
    });
    c
}

/// A deterministic "model state" norm of example `i` before step `t`: spread
/// over `[0, 1.5)` so some thresholds stay at C.
fn norm_at(i: u64, t: u64) -> f64 {
    ((i * 7919 + t * 104_729) % 1500) as f64 / 1000.0
}

/// Every threshold the server holds for `dataset`, next to its `next_step`.
async fn server_thresholds(client: &Client, dataset: &str) -> (u64, Vec<f64>) {
    let t = client.thresholds(dataset, None, None).await.unwrap();
    (t.next_step, t.thresholds)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_follows_blocks_and_full_passes_without_a_conflict() {
    let env = Env::start();
    let (n, q, e, m) = (100u64, 0.1, 10u64, 8u64);
    env.admin
        .create_dataset("run", &predictable(n, q, Some(e), Some(m)))
        .await
        .unwrap();
    let trainer = env.client_as("trainer", Some("run"), None);
    let mut session = TrainingSession::open(trainer, "run").await.unwrap();
    assert_eq!(
        session.config().thresholds,
        Some(ThresholdMode::Predictable)
    );
    let mut rng = Rng(7);
    let (mut full_passes, mut blocks) = (0, 0);
    for t in 0..60u64 {
        let due = session
            .due()
            .expect("this schedule calls for a refresh before every step");
        let announced = session.refresh_due().unwrap().clone();
        assert_eq!(announced.before_step, t);
        if t % e == 0 {
            // A full pass: every (non-retired) id.
            assert!(announced.full);
            assert_eq!(due, (0..n).collect::<Vec<_>>());
            full_passes += 1;
        } else {
            // The round-robin block (t*m + j) mod n.
            assert!(!announced.full);
            let block: Vec<u64> = (0..m).map(|j| (t * m + j) % n).collect();
            assert_eq!(due, block);
            blocks += 1;
        }
        // Sent in two requests, as a trainer computing norms in chunks may.
        let norms: Vec<f64> = due.iter().map(|&i| norm_at(i, t)).collect();
        let half = due.len() / 2;
        session.refresh(&due[..half], &norms[..half]).await.unwrap();
        assert_eq!(session.due().as_deref(), Some(&due[half..]));
        let answer = session.refresh(&due[half..], &norms[half..]).await.unwrap();
        let left = answer.refresh_due.unwrap();
        assert_eq!(
            (left.received, left.count),
            (due.len() as u64, due.len() as u64)
        );
        assert_eq!(session.due(), None);
        // The refreshed thresholds are the norms' buckets (rounded up), and the
        // mirror holds them.
        // (Within a bucket of the plain computation: the server's rounding
        // only goes up, which may cross an edge where g / r is an integer.)
        for (&i, &g) in due.iter().zip(&norms) {
            let want = ((g / 0.01).ceil() * 0.01).min(1.0);
            let got = session.mirror().threshold(i);
            assert!(
                got >= g.min(1.0) && (got - want).abs() <= 0.01 + 1e-9,
                "id {i}: {got} for norm {g}"
            );
        }
        // The step: thresholds read before it are those it is charged at; a
        // report never moves one.
        let ids: Vec<u64> = (0..n).filter(|_| rng.uniform() < q).collect();
        let before: Vec<f64> = ids.iter().map(|&i| session.mirror().threshold(i)).collect();
        let norms: Vec<f64> = ids.iter().map(|_| 2.0 * rng.uniform()).collect();
        let outcome = session.report(ids.clone(), norms).await.unwrap();
        assert_eq!(outcome.step, t);
        let after: Vec<f64> = ids.iter().map(|&i| session.mirror().threshold(i)).collect();
        assert_eq!(before, after, "a step report moved a threshold");
        // The thresholds the session clips at are the server's, every step.
        let (next, served) = server_thresholds(&env.admin, "run").await;
        assert_eq!(next, t + 1);
        assert_eq!(session.mirror().thresholds(), &served[..]);
    }
    assert_eq!((full_passes, blocks), (6, 54));
    // The numbers are the threshold ledger's: a proven statement.
    let p = env
        .admin
        .example_privacy("run", 3, PrivacyQuery::at_delta(1e-5))
        .await
        .unwrap();
    assert_eq!(p.example.ledger, LedgerKind::Threshold);
    assert!(p.example.epsilon <= p.worst_case.epsilon * (1.0 + 1e-12));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_before_the_due_refresh_is_refused_before_and_by_the_server() {
    let env = Env::start();
    let n = 20;
    env.admin
        .create_dataset("early", &predictable(n, 0.2, None, Some(5)))
        .await
        .unwrap();
    let mut session = TrainingSession::open(env.admin.clone(), "early")
        .await
        .unwrap();
    assert_eq!(session.due(), Some(vec![0, 1, 2, 3, 4]));
    // The session refuses the step without sending it.
    let e = session.report(vec![1], vec![0.5]).await.unwrap_err();
    match &e {
        Error::RefreshDue { step, detail } => {
            assert_eq!(*step, 0);
            assert!(detail.contains("5 of the 5 ids"), "{detail}");
        }
        other => panic!("expected RefreshDue, got {other}"),
    }
    assert_eq!(session.next_step(), 0);
    // Sent anyway (a plain client), the server refuses it: 409, saying why.
    let e = env
        .admin
        .report_step("early", &StepReport::new(0, vec![1], vec![0.5]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(
        e.problem().unwrap().detail.contains("scheduled refresh"),
        "{e}"
    );
    // An off-schedule id is refused by the server and changes nothing.
    let e = session.refresh(&[7], &[0.5]).await.unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert_eq!(session.due(), Some(vec![0, 1, 2, 3, 4]));
    // Part of the block: still refused before sending, naming what is left.
    session.refresh(&[0, 1, 2], &[0.1, 0.2, 0.3]).await.unwrap();
    let e = session.report(vec![1], vec![0.5]).await.unwrap_err();
    assert!(
        matches!(&e, Error::RefreshDue { detail, .. } if detail.contains("2 of the 5 ids")),
        "{e}"
    );
    session.refresh(&[3, 4], &[0.4, 0.5]).await.unwrap();
    session.report(vec![1], vec![0.5]).await.unwrap();
    // The next block wraps: (1*5 + j) mod 20.
    assert_eq!(session.due(), Some(vec![5, 6, 7, 8, 9]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reopened_session_knows_what_is_due() {
    let env = Env::start();
    let n = 12;
    env.admin
        .create_dataset("resume", &predictable(n, 0.5, Some(3), Some(5)))
        .await
        .unwrap();
    let mut session = TrainingSession::open(env.admin.clone(), "resume")
        .await
        .unwrap();
    for t in 0..4u64 {
        let ids = session.due().unwrap();
        let norms: Vec<f64> = ids.iter().map(|&i| norm_at(i, t)).collect();
        session.refresh(&ids, &norms).await.unwrap();
        session.report(vec![t], vec![0.5]).await.unwrap();
    }
    // Step 4: the block (4*5 + j) mod 12.
    let reopened = TrainingSession::open(env.admin.clone(), "resume")
        .await
        .unwrap();
    assert_eq!(reopened.next_step(), 4);
    assert_eq!(reopened.due(), Some(vec![8, 9, 10, 11, 0]));
    assert_eq!(
        reopened.mirror().thresholds(),
        session.mirror().thresholds()
    );
    // The old session, at the same step, sends it; the new one reads it done.
    let ids = session.due().unwrap();
    let norms: Vec<f64> = ids.iter().map(|&i| norm_at(i, 4)).collect();
    session.refresh(&ids, &norms).await.unwrap();
    let reopened = TrainingSession::open(env.admin.clone(), "resume")
        .await
        .unwrap();
    assert_eq!(reopened.due(), None);
    assert_eq!(
        reopened.mirror().thresholds(),
        session.mirror().thresholds()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sampled_mode_has_no_schedule_and_its_numbers_are_estimates() {
    let env = Env::start();
    let mut config = common::config(10, 0.5, 1.0);
    assert_eq!(config.thresholds, Some(ThresholdMode::Sampled));
    config.refresh = None;
    env.admin.create_dataset("old", &config).await.unwrap();
    let mut session = TrainingSession::open(env.admin.clone(), "old")
        .await
        .unwrap();
    assert_eq!(session.due(), None);
    // A refresh at any time, and a report moves a sampled example's threshold.
    session.refresh(&[0, 1], &[0.3, 0.4]).await.unwrap();
    session.report(vec![2], vec![0.25]).await.unwrap();
    assert_eq!(session.due(), None);
    assert!((session.mirror().threshold(2) - 0.25).abs() < 1e-9);
    let p = env
        .admin
        .example_privacy("old", 2, PrivacyQuery::at_delta(1e-5))
        .await
        .unwrap();
    assert_eq!(p.example.ledger, LedgerKind::Sampled);
}

/// A predictable session's trace names its protocol and schedule, so the
/// offline replay runs the same protocol: every example's ex-post bound and
/// estimate equal what the server serves.
#[tokio::test(flavor = "multi_thread")]
async fn a_predictable_sessions_trace_replays_to_the_served_numbers() {
    let env = Env::start();
    let (n, q) = (40u64, 0.2);
    env.admin
        .create_dataset("tr", &predictable(n, q, Some(10), Some(4)))
        .await
        .unwrap();
    let trainer = env.client_as("trainer", Some("tr"), None);
    let mut session = TrainingSession::open(trainer, "tr").await.unwrap();
    let trace = env.dir.path().join("predictable.jsonl");
    session.record_trace(&trace).unwrap();
    let mut rng = Rng(11);
    for t in 0..25u64 {
        if let Some(due) = session.due() {
            let norms: Vec<f64> = due.iter().map(|&i| norm_at(i, t)).collect();
            session.refresh(&due, &norms).await.unwrap();
        }
        let ids: Vec<u64> = (0..n).filter(|_| rng.uniform() < q).collect();
        let norms: Vec<f64> = ids.iter().map(|_| 2.0 * rng.uniform()).collect();
        session.report(ids, norms).await.unwrap();
    }
    let offline = dpledger_client::local::replay(&common::binary(), &trace, 1e-5).unwrap();
    let examples = offline["examples"].as_array().unwrap();
    assert_eq!(examples.len(), n as usize);
    for ex in examples {
        let id = ex["id"].as_u64().unwrap();
        let served = env
            .admin
            .example_privacy("tr", id, PrivacyQuery::at_delta(1e-5))
            .await
            .unwrap();
        let ex_post = served.example.ex_post.as_ref().expect("an ex-post bound");
        let want = ex["ex_post"]["epsilon"].as_f64().expect("replayed ex-post");
        assert!(
            common::rel(ex_post.epsilon, want) <= 1e-12,
            "example {id}: served {} replayed {want}",
            ex_post.epsilon
        );
        let estimate = ex["estimate"]["epsilon"].as_f64().unwrap();
        assert!(common::rel(served.example.estimate.epsilon, estimate) <= 1e-12);
    }
}

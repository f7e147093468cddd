//! DP-SGD on a predictable dataset (the server's default) with a public
//! refresh schedule, against the real server: before every step the trainer
//! sends the due examples' norms at the current model (full passes and
//! round-robin blocks) and no step is refused over many steps; the thresholds
//! a refresh sets are the buckets of those norms; the thresholds the trainer
//! clips at are the server's; a step report never moves one.

mod common;

use common::{binary, task, Task};
use dpledger_client::local::LocalServer;
use dpledger_client::{Client, DatasetConfig, LedgerKind, PrivacyQuery, RefreshSchedule};
use dpledger_tch::grad::{per_example_norms, reported_norm};
use dpledger_tch::{accuracy, DpModule, DpSgd, DpSgdConfig, Examples, Mlp};
use tch::{Reduction, Tensor};

/// The norms a refresh of `ids` must carry: unclipped, at the current model,
/// computed independently of the trainer (autograd per example).
fn norms_now(model: &Mlp, data: &Examples, ids: &[u64]) -> Vec<f64> {
    let batch = data.select(ids);
    let logits = model.forward(&batch.xs);
    let losses = logits.cross_entropy_loss::<Tensor>(&batch.ys, None, Reduction::None, -100, 0.0);
    per_example_norms(&losses, &model.parameters())
        .unwrap()
        .into_iter()
        .map(reported_norm)
        .collect()
}

#[test]
fn the_trainer_follows_the_refresh_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let server = LocalServer::start(&binary(), &dir.path().join("data")).unwrap();
    let admin = Client::new(server.url(), &server.admin_token().unwrap()).unwrap();
    let (n, q, e, m) = (300u64, 0.05, 25u64, 15u64);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut config = DatasetConfig::poisson(n, 1.0, 1.0, q, 1e-5);
    config.rounding = Some(0.01);
    config.refresh = Some(RefreshSchedule {
        full_every: Some(e),
        block: Some(m),
        shard: None,
    });
    runtime
        .block_on(admin.create_dataset("sched", &config))
        .unwrap();
    let token = server.token("trainer", Some("sched"), None).unwrap();
    // refresh_every is the sampled mode's: refused for a predictable dataset.
    let refused = DpSgd::new(
        Client::new(server.url(), &token).unwrap(),
        "sched",
        DpSgdConfig {
            refresh_every: Some(5),
            ..Default::default()
        },
    );
    assert!(refused.is_err());
    let mut trainer = DpSgd::new(
        Client::new(server.url(), &token).unwrap(),
        "sched",
        DpSgdConfig {
            seed: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    let Task {
        train,
        vs: _weights,
        model,
        mut opt,
    } = task(n as i64);
    let before = accuracy(&model, &train);
    let steps = 80u64;
    let (mut full, mut blocks) = (0, 0);
    for t in 0..steps {
        // What is due, and the norms it must carry (at this model state).
        let due = trainer
            .session()
            .due()
            .expect("something is due every step");
        let announced = trainer.session().refresh_due().unwrap().clone();
        assert_eq!(announced.before_step, t);
        let want_ids: Vec<u64> = if t % e == 0 {
            (0..n).collect()
        } else {
            (0..m).map(|j| (t * m + j) % n).collect()
        };
        assert_eq!(due, want_ids, "step {t}");
        assert_eq!(announced.full, t % e == 0);
        let expect = norms_now(&model, &train, &due);
        let thresholds_before: Vec<f64> = trainer.session().mirror().thresholds().to_vec();
        let stats = trainer.step(&model, &mut opt, &train).unwrap();
        assert_eq!(stats.step, t);
        assert!(stats.refreshed && stats.refreshed_examples == due.len());
        if announced.full {
            full += 1;
        } else {
            blocks += 1;
        }
        // The refreshed ids sit at the buckets of their norms at the model the
        // step started from; a report moved no other threshold.
        let mirror = trainer.session().mirror();
        for (&i, &g) in due.iter().zip(&expect) {
            let want = ((g / 0.01).ceil() * 0.01).min(1.0);
            let got = mirror.threshold(i);
            // Float noise between two autograd passes may cross a bucket edge.
            assert!((got - want).abs() <= 0.01 + 1e-9, "id {i}: {got} vs {want}");
        }
        for i in 0..n {
            if !due.contains(&i) {
                assert_eq!(mirror.threshold(i), thresholds_before[i as usize], "id {i}");
            }
        }
        // The thresholds the trainer clips at are the server's.
        let served = runtime
            .block_on(admin.thresholds("sched", None, None))
            .unwrap();
        assert_eq!(served.next_step, t + 1);
        assert_eq!(mirror.thresholds(), &served.thresholds[..]);
    }
    assert_eq!((full, blocks), (4, 76));
    assert!(accuracy(&model, &train) > before.max(0.6));
    // The proven per-example numbers of the threshold ledger.
    let p = runtime
        .block_on(admin.example_privacy("sched", 0, PrivacyQuery::at_delta(1e-5)))
        .unwrap();
    assert_eq!(p.example.ledger, LedgerKind::Threshold);
    assert!(p.example.epsilon <= p.worst_case.epsilon * (1.0 + 1e-12));
}

//! DP-SGD against the real server for a few epochs: every step is accepted, the
//! model learns, and the server's per-example epsilons equal an offline
//! `dpledger replay` of the trace the trainer reported; the TensorBoard scalars it
//! wrote read back.

mod common;

use common::{binary, task, Task};
use dpledger_client::local::{replay, LocalServer};
use dpledger_client::tensorboard::{read_events, What};
use dpledger_client::{Client, DatasetConfig, PrivacyQuery};
use dpledger_tch::{accuracy, DpSgd, DpSgdConfig, NormMethod};

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        ((a - b) / b).abs()
    }
}

/// The trainer's TensorBoard file: the worst case after every 10th step, growing,
/// the last equal (as f32) to the server's; nothing retired.
fn check_tensorboard(
    trainer: &DpSgd,
    admin: &Client,
    runtime: &tokio::runtime::Runtime,
    steps: u64,
) {
    let file = trainer.tensorboard_file().expect("tensorboard_dir was set");
    let mut worst = Vec::new();
    let mut retired = Vec::new();
    for event in read_events(file).unwrap() {
        if let What::Scalars(values) = event.what {
            for (tag, v) in values {
                match tag.as_str() {
                    "privacy/worst_case_epsilon" => worst.push((event.step, v)),
                    "privacy/retired_share" => retired.push(v),
                    other => panic!("unexpected tag {other} before any release"),
                }
            }
        }
    }
    let logged: Vec<i64> = worst.iter().map(|w| w.0).collect();
    let want: Vec<i64> = (1..=steps as i64).filter(|t| t % 10 == 0).collect();
    assert_eq!(logged, want);
    assert!(worst.windows(2).all(|w| w[0].1 < w[1].1), "{worst:?}");
    let served = runtime
        .block_on(admin.worst_case("blobs", PrivacyQuery::default()))
        .unwrap();
    assert_eq!(worst.last().unwrap().1, served.epsilon as f32);
    assert!(retired.len() == want.len() && retired.iter().all(|&r| r == 0.0));
}

fn run(norm_method: NormMethod, epochs: u64, check_every_example: bool) {
    let dir = tempfile::tempdir().unwrap();
    let bin = binary();
    let server = LocalServer::start(&bin, &dir.path().join("data")).unwrap();
    let admin = Client::new(server.url(), &server.admin_token().unwrap()).unwrap();
    let n = 400u64;
    let (q, sigma, delta) = (0.05, 1.0, 1e-5);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The sampled protocol (refreshes every 25 steps off any schedule, a
    // report moves a sampled example's threshold): its per-example numbers
    // are estimates, compared here with the replay's.
    let mut config = DatasetConfig::poisson(n, 1.0, sigma, q, delta);
    config.thresholds = Some(dpledger_client::ThresholdMode::Sampled);
    runtime
        .block_on(admin.create_dataset("blobs", &config))
        .unwrap();
    let trainer_token = server.token("trainer", Some("blobs"), None).unwrap();
    let trace = dir.path().join("trace.jsonl");
    let mut trainer = DpSgd::new(
        // Its own client: connections are not shared across runtimes.
        Client::new(server.url(), &trainer_token).unwrap(),
        "blobs",
        DpSgdConfig {
            refresh_every: Some(25),
            seed: Some(17),
            trace: Some(trace.clone()),
            tensorboard_dir: Some(dir.path().join("tb")),
            tensorboard_every: Some(10),
            norm_method,
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
    let steps = epochs * trainer.steps_per_epoch();
    let (mut sampled, mut clipped, mut refreshes) = (0, 0, 0);
    for t in 0..steps {
        let stats = trainer.step(&model, &mut opt, &train).unwrap();
        assert_eq!(stats.step, t);
        assert!(!stats.duplicate);
        sampled += stats.batch_size;
        clipped += stats.clipped;
        refreshes += stats.refreshed as u32;
    }
    assert_eq!(refreshes as u64, (steps - 1) / 25);
    // Poisson batches of expected size q n = 20.
    let mean = sampled as f64 / steps as f64;
    assert!((14.0..26.0).contains(&mean), "mean batch {mean}");
    assert!(
        clipped > 0,
        "some examples were clipped at their thresholds"
    );
    let after = accuracy(&model, &train);
    assert!(
        after > 0.7 && after > before,
        "accuracy {before} -> {after}"
    );

    let view = runtime.block_on(admin.dataset("blobs")).unwrap();
    assert_eq!(view.status.steps, steps);
    check_tensorboard(&trainer, &admin, &runtime, steps);
    // The server's thresholds are the trainer's mirror.
    let served = runtime
        .block_on(admin.thresholds("blobs", None, None))
        .unwrap();
    assert_eq!(served.thresholds, trainer.session().mirror().thresholds());

    // Per-example epsilons served == offline replay of the reported trace.
    let offline = replay(&bin, &trace, delta).unwrap();
    let worst = offline["worst_case"]["epsilon"].as_f64().unwrap();
    // The estimate is an RDP number: compare it with the RDP worst case.
    let worst_rdp = offline["worst_case"]["rdp"]["epsilon"].as_f64().unwrap();
    assert!(rel(view.worst_case.epsilon, worst) <= 1e-12);
    let examples = offline["examples"].as_array().unwrap();
    assert_eq!(examples.len() as u64, n);
    let mut below = 0;
    let mut lowest = f64::INFINITY;
    let stride = if check_every_example { 1 } else { 7 };
    for ex in examples.iter().step_by(stride) {
        let id = ex["id"].as_u64().unwrap();
        let p = runtime
            .block_on(admin.example_privacy("blobs", id, PrivacyQuery::at_delta(delta)))
            .unwrap();
        let want = ex["epsilon"].as_f64().unwrap();
        assert!(
            rel(p.example.epsilon, want) <= 1e-12,
            "example {id}: served {} replay {want}",
            p.example.epsilon
        );
        let estimate = ex["rdp_epsilon"].as_f64().unwrap();
        assert!(rel(p.example.rdp_epsilon, estimate) <= 1e-12);
        assert!(p.example.epsilon <= worst * (1.0 + 1e-12));
        assert_eq!(
            p.example.estimate.kind,
            dpledger_client::PrivacyKind::Estimate
        );
        lowest = lowest.min(p.example.rdp_epsilon);
        if p.example.rdp_epsilon < 0.95 * worst_rdp {
            below += 1;
        }
    }
    eprintln!(
        "{norm_method:?}: {steps} steps, accuracy {before:.3} -> {after:.3}, {clipped} of \
         {sampled} sampled clipped, worst case {worst:.3} (RDP {worst_rdp:.3}), {below} checked \
         examples' estimates below 95% of the RDP worst case (lowest {lowest:.3})"
    );
    assert!(
        below > 0,
        "examples with small gradients end below the worst case"
    );
}

#[test]
fn dp_sgd_run_is_accepted_and_matches_replay() {
    run(NormMethod::Auto, 3, true);
}

#[test]
fn per_example_backward_path_trains_too() {
    run(NormMethod::PerExample, 1, false);
}

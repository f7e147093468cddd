//! Train a small classifier on scikit-learn's bundled digits (1,797 8x8 images)
//! with DP-SGD against a running dpledger, then print the test accuracy, the
//! worst-case epsilon and the distribution of per-example epsilons.
//!
//! ```sh
//! cargo run --release -- serve --data-dir /tmp/dpl &          # prints its URL
//! "$(scripts/torch-venv)/bin/python" scripts/export-digits target/digits.csv
//! export LIBTORCH_USE_PYTORCH=1 LD_LIBRARY_PATH=...            # see clients/tch/README.md
//! cargo run --release -p dpledger-tch --example digits -- \
//!     --url http://127.0.0.1:8080 --token "$(cat /tmp/dpl/admin.token)" --data target/digits.csv
//! ```
//!
//! The dataset follows the server's default, predictable thresholds, with a
//! public refresh schedule: a round-robin block of `--block M` ids before every
//! step (default: the expected batch size; `0` for none) and, with
//! `--full-every E`, a full pass every `E` steps. The trainer computes the due
//! ids' norms at the current model before each step and sends them; the summary
//! says how long that took next to the steps themselves. `--sampled` creates the
//! dataset in the old protocol instead (refresh with `--refresh-every K`;
//! per-example numbers are estimates).
//!
//! The token must be allowed to create datasets (admin), unless `--dataset` names an
//! existing dataset with the matching configuration, which a trainer token can train.

use dpledger_client::{Client, DatasetConfig, PrivacyQuery, RefreshSchedule};
use dpledger_tch::{accuracy, Activation, DpSgd, DpSgdConfig, Examples, Mlp};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tch::nn::{self, OptimizerConfig};

struct Args {
    url: String,
    token: String,
    data: PathBuf,
    dataset: Option<String>,
    create: bool,
    epochs: u64,
    batch: f64,
    sigma: f64,
    clip: f64,
    lr: f64,
    delta: f64,
    refresh_every: Option<u64>,
    sampled: bool,
    block: Option<u64>,
    full_every: Option<u64>,
    seed: Option<u64>,
    tensorboard: Option<PathBuf>,
}

const USAGE: &str =
    "usage: digits --url URL --token TOKEN [--data target/digits.csv] [--dataset ID] \
[--existing] [--epochs 20] [--batch 64] [--sigma 1.0] [--clip 1.0] [--lr 2.0] [--delta 1e-5] \
[--block M (default: the batch; 0: none)] [--full-every E] [--sampled [--refresh-every K]] [--seed N] [--tensorboard LOGDIR]   (URL and TOKEN also from DPLEDGER_URL, DPLEDGER_TOKEN)";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: std::env::var("DPLEDGER_URL").unwrap_or_default(),
        token: std::env::var("DPLEDGER_TOKEN").unwrap_or_default(),
        data: PathBuf::from("target/digits.csv"),
        dataset: None,
        create: true,
        epochs: 20,
        batch: 64.0,
        sigma: 1.0,
        clip: 1.0,
        lr: 2.0,
        delta: 1e-5,
        refresh_every: None,
        sampled: false,
        block: None,
        full_every: None,
        seed: None,
        tensorboard: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--existing" {
            a.create = false;
            continue;
        }
        if flag == "--sampled" {
            a.sampled = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("invalid {flag}: {e}"));
        let int = |v: &str| v.parse::<u64>().map_err(|e| format!("invalid {flag}: {e}"));
        match flag.as_str() {
            "--url" => a.url = value,
            "--token" => a.token = value,
            "--data" => a.data = PathBuf::from(value),
            "--dataset" => a.dataset = Some(value),
            "--epochs" => a.epochs = int(&value)?,
            "--batch" => a.batch = num(&value)?,
            "--sigma" => a.sigma = num(&value)?,
            "--clip" => a.clip = num(&value)?,
            "--lr" => a.lr = num(&value)?,
            "--delta" => a.delta = num(&value)?,
            "--refresh-every" => a.refresh_every = Some(int(&value)?).filter(|&k| k > 0),
            "--block" => a.block = Some(int(&value)?),
            "--full-every" => a.full_every = Some(int(&value)?).filter(|&e| e > 0),
            "--seed" => a.seed = Some(int(&value)?),
            "--tensorboard" => a.tensorboard = Some(PathBuf::from(value)),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.url.is_empty() || a.token.is_empty() {
        return Err(format!("--url and --token are required\n{USAGE}"));
    }
    Ok(a)
}

/// Linear-interpolated quantile of sorted values.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    let x = p * (sorted.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo as f64)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let all = Examples::from_csv(&args.data, 16.0).map_err(|e| {
        format!(
            "{e}\n(export the digits first: \"$(scripts/torch-venv)/bin/python\" scripts/export-digits {})",
            args.data.display()
        )
    })?;
    let (train, test) = all.split(0.8, 0);
    let n = train.len() as u64;
    let q = (args.batch / n as f64).min(1.0);
    let id = args.dataset.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        format!("digits-{now}")
    });
    let client = Client::new(&args.url, &args.token)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if args.create {
        let mut config = DatasetConfig::poisson(n, args.clip, args.sigma, q, args.delta);
        if args.sampled {
            // The trainer refreshes when it likes (--refresh-every) and moves
            // thresholds with its reports: the sampled protocol, estimates only.
            config.thresholds = Some(dpledger_client::ThresholdMode::Sampled);
        } else {
            // Predictable thresholds (the default) on a public schedule.
            let block = args.block.unwrap_or((q * n as f64).round() as u64);
            config.refresh = Some(RefreshSchedule {
                full_every: args.full_every,
                block: Some(block).filter(|&m| m > 0),
                shard: None,
            });
            config.planned_steps = Some(args.epochs * (1.0 / q).round().max(1.0) as u64);
            println!(
                "predictable thresholds, refresh schedule: block {block}{}",
                args.full_every
                    .map(|e| format!(", full pass every {e} steps"))
                    .unwrap_or_default()
            );
        }
        runtime.block_on(client.create_dataset(&id, &config))?;
    }
    println!(
        "dataset {id}: {n} training / {} test examples, q = {q:.4} (expected batch {:.0}), sigma = {}, C = {}, delta = {}",
        test.len(),
        q * n as f64,
        args.sigma,
        args.clip,
        args.delta
    );

    // The trainer drives its own runtime: give it its own connection pool.
    let mut trainer = DpSgd::new(
        Client::new(&args.url, &args.token)?,
        &id,
        DpSgdConfig {
            refresh_every: args.refresh_every,
            seed: args.seed,
            tensorboard_dir: args.tensorboard.clone(),
            tensorboard_every: Some(10),
            ..Default::default()
        },
    )?;
    if args.seed.is_some() {
        tch::manual_seed(args.seed.unwrap_or(0) as i64);
    }
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = Mlp::new(&vs.root(), &[train.features(), 64, 10], Activation::Tanh);
    let mut opt = nn::Sgd::default().build(&vs, args.lr)?;
    let per_epoch = trainer.steps_per_epoch();
    let (mut step_time, mut refresh_time) = (Duration::ZERO, Duration::ZERO);
    let mut refreshed = 0;
    for epoch in 0..args.epochs {
        let (mut loss, mut batches, mut clipped, mut sampled) = (0.0, 0, 0, 0);
        for _ in 0..per_epoch {
            let stats = trainer.step(&model, &mut opt, &train)?;
            if stats.batch_size > 0 {
                loss += stats.mean_loss;
                batches += 1;
            }
            clipped += stats.clipped;
            sampled += stats.batch_size;
            step_time += stats.step_time;
            refresh_time += stats.refresh_time;
            refreshed += stats.refreshed_examples;
        }
        println!(
            "epoch {:>2}: loss {:.3}, clipped {:>4.1}% of sampled, train accuracy {:.3}",
            epoch + 1,
            loss / batches.max(1) as f64,
            100.0 * clipped as f64 / sampled.max(1) as f64,
            accuracy(&model, &train)
        );
    }
    let steps = trainer.session().next_step();
    let per_step = |d: Duration| 1e3 * d.as_secs_f64() / steps.max(1) as f64;
    println!(
        "time per step: {:.2} ms in steps, {:.2} ms in refreshes ({:.1} examples' norms per \
         step): refreshes add {:.1}%",
        per_step(step_time),
        per_step(refresh_time),
        refreshed as f64 / steps.max(1) as f64,
        100.0 * refresh_time.as_secs_f64() / step_time.as_secs_f64().max(1e-12)
    );
    if let Some(file) = trainer.tensorboard_file() {
        println!("TensorBoard scalars: {}", file.display());
    }
    drop(trainer);

    let worst = runtime.block_on(client.worst_case(&id, PrivacyQuery::at_delta(args.delta)))?;
    let mut epsilons = Vec::with_capacity(n as usize);
    let mut label = "estimate";
    for i in 0..n {
        let p =
            runtime.block_on(client.example_privacy(&id, i, PrivacyQuery::at_delta(args.delta)))?;
        // The per-example number: the ex-post bound (predictable thresholds)
        // or the ledger's estimate (sampled protocol); each example's
        // guarantee is the worst case here (no individual budget).
        let part = p.example.ex_post.as_ref().unwrap_or(&p.example.estimate);
        label = if p.example.ex_post.is_some() {
            "ex-post bound"
        } else {
            "estimate"
        };
        epsilons.push(part.epsilon);
    }
    epsilons.sort_by(f64::total_cmp);
    let at_worst = epsilons
        .iter()
        .filter(|&&e| e >= worst.epsilon * (1.0 - 1e-9))
        .count();
    println!();
    println!(
        "test accuracy: {:.3} after {steps} steps",
        accuracy(&model, &test)
    );
    println!(
        "worst-case epsilon (every example, data-independent): {:.3} at delta = {}",
        worst.epsilon, args.delta
    );
    println!(
        "per-example epsilon ({label}): min {:.3}, q25 {:.3}, median {:.3}, q75 {:.3}, max {:.3}",
        epsilons[0],
        quantile(&epsilons, 0.25),
        quantile(&epsilons, 0.5),
        quantile(&epsilons, 0.75),
        epsilons[epsilons.len() - 1]
    );
    println!(
        "share of examples at the worst case: {:.1}%",
        100.0 * at_worst as f64 / n as f64
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

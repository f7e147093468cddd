//! Thudi et al.'s data-dependent analysis on scikit-learn's digits with the tch
//! trainer: train the same configuration `--runs` times (default 3), each run a
//! dataset of dpledger with a full-batch refresh every epoch, then ask dpledger
//! for the expected-composition estimate over the runs and print the share of
//! examples below the data-independent epsilon next to seed 000's per-instance
//! numbers.
//!
//! ```sh
//! cargo run --release -- serve --data-dir /tmp/dpl &
//! "$(scripts/torch-venv)/bin/python" scripts/export-digits target/digits.csv
//! export LIBTORCH_USE_PYTORCH=1 LD_LIBRARY_PATH=...            # see clients/tch/README.md
//! cargo run --release -p dpledger-tch --example digits_data_dependent -- \
//!     --url http://127.0.0.1:8080 --token "$(cat /tmp/dpl/admin.token)" --data target/digits.csv
//! ```

use dpledger_client::{AnalysisQuery, Client, DatasetConfig, PrivacyQuery};
use dpledger_tch::{accuracy, Activation, DpSgd, DpSgdConfig, Examples, Mlp};
use std::path::PathBuf;
use std::process::ExitCode;
use tch::nn::{self, OptimizerConfig};

const USAGE: &str = "usage: digits_data_dependent --url URL --token TOKEN [--data target/digits.csv] \
[--runs 3] [--epochs 10] [--seed 0] [--exact]   (URL and TOKEN also from DPLEDGER_URL, DPLEDGER_TOKEN)";

struct Args {
    url: String,
    token: String,
    data: PathBuf,
    runs: u64,
    epochs: u64,
    seed: u64,
    exact: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: std::env::var("DPLEDGER_URL").unwrap_or_default(),
        token: std::env::var("DPLEDGER_TOKEN").unwrap_or_default(),
        data: PathBuf::from("target/digits.csv"),
        runs: 3,
        epochs: 10,
        seed: 0,
        exact: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--exact" {
            a.exact = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let int = |v: &str| v.parse::<u64>().map_err(|e| format!("invalid {flag}: {e}"));
        match flag.as_str() {
            "--url" => a.url = value,
            "--token" => a.token = value,
            "--data" => a.data = PathBuf::from(value),
            "--runs" => a.runs = int(&value)?,
            "--epochs" => a.epochs = int(&value)?,
            "--seed" => a.seed = int(&value)?,
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.url.is_empty() || a.token.is_empty() {
        return Err(format!("--url and --token are required\n{USAGE}"));
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let all = Examples::from_csv(&args.data, 16.0)?;
    let (train, test) = all.split(0.8, 0);
    let n = train.len() as u64;
    let (clip, sigma, delta, lr) = (1.0, 1.0, 1e-5, 2.0);
    let q = (64.0 / n as f64).min(1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client::new(&args.url, &args.token)?;
    let mut runs = Vec::new();
    for r in 0..args.runs {
        let id = format!("digits-dd-tch-{now}-{r}");
        let mut config = DatasetConfig::poisson(n, clip, sigma, q, delta);
        // Checkpoint refreshes at the trainer's pace: the sampled protocol.
        config.thresholds = Some(dpledger_client::ThresholdMode::Sampled);
        runtime.block_on(client.create_dataset(&id, &config))?;
        // As `DpSgd::steps_per_epoch`: a refresh every epoch.
        let per_epoch = (1.0 / q).round().max(1.0) as u64;
        let seed = args.seed + 100 * r;
        // The trainer's own connection pool.
        let mut trainer = DpSgd::new(
            Client::new(&args.url, &args.token)?,
            &id,
            DpSgdConfig {
                refresh_every: Some(per_epoch),
                seed: Some(seed),
                ..Default::default()
            },
        )?;
        tch::manual_seed(seed as i64);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = Mlp::new(&vs.root(), &[train.features(), 64, 10], Activation::Tanh);
        let mut opt = nn::Sgd::default().build(&vs, lr)?;
        for _ in 0..args.epochs * per_epoch {
            trainer.step(&model, &mut opt, &train)?;
        }
        println!(
            "run {id}: {} steps, a refresh every {per_epoch} steps (every epoch), test accuracy {:.3}",
            trainer.session().next_step(),
            accuracy(&model, &test)
        );
        runs.push(id);
    }
    let mut query = AnalysisQuery::runs(runs.clone());
    query.delta = Some(delta);
    if args.exact {
        query = query.exact();
    }
    let started = std::time::Instant::now();
    let a = runtime.block_on(client.data_dependent_analysis(&query))?;
    let di = a.data_independent.epsilon;
    let below = a.examples.iter().filter(|x| x.epsilon < di).count();
    let eps: Vec<f64> = a.examples.iter().map(|x| x.epsilon).collect();
    println!();
    println!(
        "{n} examples, {} steps per run, {} runs; analysed in {:.1} s (order_ratio {})",
        a.steps,
        a.runs,
        started.elapsed().as_secs_f64(),
        a.order_ratio
    );
    println!("data-independent epsilon: {di:.3} at delta = {delta}");
    println!(
        "seed 001 (data-dependent ESTIMATE, guarantee: {}): median {:.3}; below the \
         data-independent epsilon: {below} of {n} ({:.1}%)",
        a.guarantee,
        median(eps),
        100.0 * below as f64 / n as f64
    );
    for (k, id) in runs.iter().enumerate() {
        let per: Vec<f64> = a
            .examples
            .iter()
            .filter_map(|x| x.per_instance_epsilon.as_ref().map(|p| p[k]))
            .collect();
        let worst = runtime
            .block_on(client.worst_case(id, PrivacyQuery::at_delta(delta)))?
            .epsilon;
        let share = per.iter().filter(|&&e| e < worst * (1.0 - 1e-9)).count();
        println!(
            "seed 000 per-instance (guarantee) in {id}: median {:.3}, below its worst case \
             {worst:.3}: {:.1}%",
            median(per),
            100.0 * share as f64 / n as f64
        );
    }
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

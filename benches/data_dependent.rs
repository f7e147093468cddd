//! Criterion benchmark of Thudi et al.'s data-dependent analysis: 3 runs,
//! 20 checkpoints (one every `STEPS_PER_CHECKPOINT` steps, q = 256/60,000,
//! sigma = 1), the 64 ledger orders, default Hölder exponent, 2 threads, with the
//! default rounding (`Rounding::FAST`) and exactly. Norms are synthetic: each
//! example has a base norm (a third of them clipped at C), shrinking over
//! training, jittered per run, so level tuples are mostly distinct (little
//! sharing: a hard case).
//!
//! Criterion measures n = 2,000 (`DD_N` overrides). `DD_FULL=1` first times one
//! full-size analysis (n = 60,000) of each kind, as reported in
//! `docs/performance.md`. `cargo test --benches` runs each once at n = 2,000.

use criterion::Criterion;
use dpledger::accounting::conversion::Conversion;
use dpledger::accounting::data_dependent::{
    analyze, Checkpoint, Options, Rounding, RunSet, StepParams,
};
use dpledger::accounting::orders::ledger_orders;
use dpledger::accounting::BucketGrid;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::hint::black_box;

const RUNS: usize = 3;
const CHECKPOINTS: usize = 20;
const STEPS_PER_CHECKPOINT: usize = 10;

fn examples() -> usize {
    std::env::var("DD_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

fn run_set(n: usize) -> RunSet {
    let grid = BucketGrid::new(1.0, 0.01).expect("grid");
    let steps = vec![
        StepParams {
            sampling_rate: 256.0 / 60_000.0,
            noise_multiplier: 1.0,
        };
        CHECKPOINTS * STEPS_PER_CHECKPOINT
    ];
    let mut rng = Pcg64::seed_from_u64(18);
    let base: Vec<f64> = (0..n)
        .map(|_| {
            if rng.random::<f64>() < 1.0 / 3.0 {
                2.0
            } else {
                rng.random::<f64>()
            }
        })
        .collect();
    let runs = (0..RUNS)
        .map(|_| {
            (0..CHECKPOINTS)
                .map(|c| Checkpoint {
                    before_step: (c * STEPS_PER_CHECKPOINT) as u64,
                    levels: base
                        .iter()
                        .map(|&b| {
                            let shrink = 1.0 - 0.5 * c as f64 / CHECKPOINTS as f64;
                            let jitter = 1.0 + 0.2 * (rng.random::<f64>() - 0.5);
                            grid.bucket_of(b * shrink * jitter)
                        })
                        .collect(),
                })
                .collect()
        })
        .collect();
    RunSet::new(grid, steps, n, runs).expect("valid runs")
}

fn options(rounding: Rounding) -> Options {
    Options {
        orders: ledger_orders(),
        holder: None,
        delta: 1e-5,
        conversion: Conversion::Improved,
        threads: 2,
        rounding,
    }
}

/// Time one analysis and print its headline numbers.
fn once(runs: &RunSet, rounding: Rounding, label: &str) {
    let t0 = std::time::Instant::now();
    let a = analyze(runs, &options(rounding)).expect("analysis");
    eprintln!(
        "one {label} analysis: {:.2} s (n = {}, data-independent epsilon {:.4}, median data-dependent {:.4}, below {})",
        t0.elapsed().as_secs_f64(),
        runs.examples(),
        a.data_independent.epsilon,
        a.summary.as_ref().map_or(f64::NAN, |s| s.epsilon.median),
        a.summary.as_ref().map_or(0, |s| s.below_data_independent),
    );
}

fn main() {
    if std::env::var("DD_FULL").is_ok_and(|v| v == "1") {
        let full = run_set(60_000);
        once(&full, Rounding::FAST, "rounded (FAST)");
        once(&full, Rounding::EXACT, "exact");
    }
    let n = examples();
    let runs = run_set(n);
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(1));
    for (rounding, label) in [(Rounding::FAST, "rounded"), (Rounding::EXACT, "exact")] {
        let options = options(rounding);
        c.bench_function(
            &format!(
                "data_dependent {label} n={n} runs={RUNS} checkpoints={CHECKPOINTS} steps={} orders=64",
                CHECKPOINTS * STEPS_PER_CHECKPOINT
            ),
            |b| b.iter(|| black_box(analyze(&runs, &options).expect("analysis"))),
        );
    }
    c.final_summary();
}

//! Memory, snapshot size and release time of the ledger on a training-like trace.
//! Prints figures rather than sampling (the runs are long and their
//! memory is the point); uses only the ledger's public interface, so that the same
//! file measures an older build in the same run (docs/ledger-memory.md).
//!
//! * default: `n` = 10^6 (`cargo bench`; 20,000 under `cargo test --benches`),
//!   batch 4096, 20 epochs, the schedule (noise multiplier and sampling rate)
//!   changed every epoch; norms as the demo's (easy and hard examples whose norms
//!   fall with training). Prints bytes per example, the distribution of history
//!   lengths (closed `(segment, level)` entries per example), the snapshot's
//!   bytes per example, the time of one all-epsilons pass (what a release costs;
//!   the fastest of `DPLEDGER_PASSES`, default 3)
//!   and of a restart from the snapshot, and the mean time of a step.
//! * `DPLEDGER_BIG_N=N`: create `N` examples, apply 1,000 steps of 4,096, query
//!   (privacy of a few examples, the worst case, one all-epsilons pass unless
//!   `DPLEDGER_BIG_SKIP_RELEASE` is set), write a snapshot; prints resident memory
//!   (`VmHWM`, `VmRSS`) and the snapshot's size.

use dpledger::accounting::conversion::Conversion;
use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::time::Instant;

const BATCH: u64 = 4096;
const DELTA: f64 = 1e-5;

/// The demo's norms (`src/cli/demo.rs`): hard examples (30%) keep large
/// gradients, easy ones are learned quickly; `u` is the report's noise.
fn norm(i: u64, epoch: f64, u: f64) -> f64 {
    let hard = i % 10 < 3;
    let (scale, decay, floor) = if hard {
        (2.0, 0.05, 0.6)
    } else {
        (1.2, 0.35, 0.02)
    };
    (scale * (-decay * epoch).exp() + floor) * (0.6 + 0.8 * u)
}

/// CPU time of the process, all threads (less disturbed than wall time by other
/// processes on a loaded machine, though they still share its caches).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Sample a Poisson batch of expected size `q n` without visiting all `n`
/// (geometric gaps), with the demo's norms.
fn batch(rng: &mut Pcg64, n: u64, q: f64, epoch: f64) -> (Vec<u64>, Vec<f64>) {
    let mut ids = Vec::with_capacity((q * n as f64 * 1.2) as usize);
    let ln = (1.0 - q).ln();
    let mut i = 0u64;
    loop {
        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        i += (u.ln() / ln).floor() as u64;
        if i >= n {
            break;
        }
        ids.push(i);
        i += 1;
    }
    let norms = ids
        .iter()
        .map(|&i| norm(i, epoch, rng.random::<f64>()))
        .collect();
    (ids, norms)
}

fn training_trace(n: u64, epochs: u64) {
    let q0 = (BATCH as f64 / n as f64).min(1.0);
    let config = DatasetConfig::poisson(n, 1.0, 1.0, q0, DELTA);
    let mut ledger = Ledger::new(config).expect("valid config");
    let steps_per_epoch = n.div_ceil(BATCH);
    let mut rng = Pcg64::seed_from_u64(27);
    let mut step_time = 0.0;
    for epoch in 0..epochs {
        // A schedule change every epoch: noise and rate both move.
        let sigma = 1.0 + 0.02 * epoch as f64;
        let q = q0 * (1.0 - 0.01 * epoch as f64);
        for _ in 0..steps_per_epoch {
            let (ids, norms) = batch(&mut rng, n, q, epoch as f64);
            let report = StepReport {
                noise_multiplier: Some(sigma),
                sampling_rate: Some(q),
                ..StepReport::new(ledger.next_step(), ids, norms)
            };
            let t0 = Instant::now();
            ledger.step(&report).expect("valid step");
            step_time += t0.elapsed().as_secs_f64();
        }
    }
    let steps = ledger.next_step();
    let memory = ledger.memory_bytes() as f64 / n as f64;
    // History lengths: closed (segment, level) entries per example.
    let mut lengths: Vec<usize> = (0..n as usize)
        .map(|i| {
            ledger
                .level_history()
                .example_counts(i, 0, steps)
                .map_or(0, |c| c.len())
        })
        .collect();
    lengths.sort_unstable();
    let pct = |p: f64| lengths[((lengths.len() - 1) as f64 * p) as usize];
    let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
    // The pass is repeated (`DPLEDGER_PASSES`, default 3): on a loaded machine
    // the fastest of a few runs is the least disturbed figure.
    let passes: usize = std::env::var("DPLEDGER_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut times = Vec::with_capacity(passes);
    let mut cpu = Vec::with_capacity(passes);
    let mut eps = Vec::new();
    for _ in 0..passes {
        let (t0, c0) = (Instant::now(), cpu_seconds());
        eps = ledger
            .all_epsilons(DELTA, Conversion::Improved)
            .expect("valid delta");
        times.push(t0.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c0);
    }
    let release = times.iter().copied().fold(f64::INFINITY, f64::min);
    // A release as the server computes it: a view read in chunks of 256
    // examples (`engine::release_view::CHUNK`), each on the calling thread.
    let mut chunked = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t0 = Instant::now();
        let token = ledger
            .open_view(DELTA, Conversion::Improved)
            .expect("no view open");
        let mut got = Vec::with_capacity(n as usize);
        for start in (0..n as usize).step_by(256) {
            ledger
                .view_epsilons(token, start..start + 256, &mut got)
                .expect("read in order");
        }
        ledger.close_view(token);
        chunked.push(t0.elapsed().as_secs_f64());
        assert_eq!(got, eps, "the view serves the pass's epsilons");
    }
    let chunked = chunked.iter().copied().fold(f64::INFINITY, f64::min);
    let release_cpu = cpu.iter().copied().fold(f64::INFINITY, f64::min);
    let t0 = Instant::now();
    let image = ledger.to_snapshot();
    let write = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let back = Ledger::from_snapshot(&image).expect("own image");
    let restart = t0.elapsed().as_secs_f64();
    assert_eq!(back.next_step(), steps);
    println!(
        "training trace n={n} epochs={epochs} steps={steps}: {memory:.1} bytes/example, \
         snapshot {:.1} bytes/example, history entries mean {mean:.1} p50 {} p90 {} p99 {} max {}, \
         step {:.3} ms, all-epsilons pass {release:.3} s (fastest of {times:.3?}; CPU (all threads) {release_cpu:.3} s; \
         view read in chunks of 256: {chunked:.3} s; median eps {:.3}), \
         snapshot write {write:.3} s, restart {restart:.3} s",
        image.len() as f64 / n as f64,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0),
        step_time / steps as f64 * 1e3,
        {
            let mut e = eps.clone();
            e.sort_by(f64::total_cmp);
            e[e.len() / 2]
        }
    );
}

fn big_run(n: u64) {
    let q = (BATCH as f64 / n as f64).min(1.0);
    let t0 = Instant::now();
    let config = DatasetConfig::poisson(n, 1.0, 1.0, q, DELTA);
    let mut ledger = Ledger::new(config).expect("valid config");
    println!(
        "big run n={n}: created in {:.1} s, VmRSS {} MiB",
        t0.elapsed().as_secs_f64(),
        status_kb("VmRSS:") / 1024
    );
    let mut rng = Pcg64::seed_from_u64(1);
    let t0 = Instant::now();
    for t in 0..1000u64 {
        let ids: Vec<u64> = rand::seq::index::sample(&mut rng, n as usize, BATCH as usize)
            .into_iter()
            .map(|i| i as u64)
            .collect();
        let norms = ids
            .iter()
            .map(|&i| norm(i, t as f64 / 100.0, rng.random::<f64>()))
            .collect();
        ledger
            .step(&StepReport::new(t, ids, norms))
            .expect("valid step");
    }
    println!(
        "big run n={n}: 1000 steps of {BATCH} in {:.1} s ({:.2} ms/step), memory_bytes {:.1}/example",
        t0.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        ledger.memory_bytes() as f64 / n as f64
    );
    let t0 = Instant::now();
    for id in [0, n / 3, n - 1] {
        let p = ledger
            .privacy(id, DELTA, Conversion::Improved)
            .expect("valid id");
        println!("big run: example {id}: epsilon {:.4}", p.epsilon);
    }
    let w = ledger
        .worst_case(DELTA, Conversion::Improved)
        .expect("valid delta");
    println!(
        "big run: worst case epsilon {:.4}; queries {:.3} ms",
        w.epsilon,
        t0.elapsed().as_secs_f64() * 1e3
    );
    if std::env::var_os("DPLEDGER_BIG_SKIP_RELEASE").is_none() {
        let t0 = Instant::now();
        let eps = ledger
            .all_epsilons(DELTA, Conversion::Improved)
            .expect("valid delta");
        println!(
            "big run: all-epsilons pass {:.1} s ({} values)",
            t0.elapsed().as_secs_f64(),
            eps.len()
        );
    }
    let t0 = Instant::now();
    let image = ledger.to_snapshot();
    println!(
        "big run: snapshot {} MiB ({:.1} bytes/example) in {:.1} s; VmHWM {} MiB, VmRSS {} MiB",
        image.len() >> 20,
        image.len() as f64 / n as f64,
        t0.elapsed().as_secs_f64(),
        status_kb("VmHWM:") / 1024,
        status_kb("VmRSS:") / 1024
    );
}

fn main() {
    if let Some(n) = std::env::var("DPLEDGER_BIG_N")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        big_run(n);
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let n = std::env::var("DPLEDGER_TRACE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    training_trace(n, 20);
}

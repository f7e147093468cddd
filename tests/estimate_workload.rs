//! The per-example estimate under `dpledger loadgen`'s workload, in process:
//! the histories loadgen's examples get (Poisson rate
//! `batch / n`, sigma 1, C 1, norms uniform in [0, 1.5), threshold = the bucket
//! of the last reported norm), asked one after another from one cache, as
//! `scripts/bench-estimate` asks the server. Prints latency percentiles and the
//! cache's statistics; asserts only what must hold (every answer is finite and
//! positive, the cache stays within its bound). A measurement, so ignored by
//! default:
//!
//! `cargo test --release --test estimate_workload -- --ignored --nocapture`
//! (env `WORKLOAD_QUERIES`, default 400).

use dpledger::accounting::grid::BucketGrid;
use dpledger::accounting::pld::{estimate_epsilon, EstimateCache, PldEvent};
use std::collections::BTreeMap;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One example's events after `steps` steps at rate `q` on `grid`.
fn history(rng: &mut Rng, grid: &BucketGrid, q: f64, steps: u64) -> Vec<PldEvent> {
    let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
    let mut threshold = grid.top();
    for _ in 0..steps {
        let level = if rng.unit() < q {
            let norm = (rng.next() % 1500) as f64 / 1000.0;
            let b = grid.bucket_of(norm);
            let level = threshold.min(b);
            threshold = b;
            level
        } else {
            threshold
        };
        *counts.entry(level).or_default() += 1;
    }
    counts
        .into_iter()
        .filter(|&(k, _)| k > 0)
        .map(|(k, count)| PldEvent::PoissonGaussian {
            q,
            sigma: grid.effective_sigma(1.0, k),
            count,
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn run(label: &str, n: u64, rounding: f64, steps: u64) {
    let queries: usize = std::env::var("WORKLOAD_QUERIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let grid = BucketGrid::new(1.0, rounding).unwrap();
    let q = 4096.0 / n as f64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ n);
    let cache = EstimateCache::default();
    let mut ms = Vec::with_capacity(queries);
    let mut levels = 0usize;
    for _ in 0..queries {
        let ev = history(&mut rng, &grid, q, steps);
        levels += ev.len();
        let t = Instant::now();
        let a = estimate_epsilon(&cache, &ev, 1e-6).unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(a.epsilon.is_finite() && a.epsilon > 0.0, "{a:?} {ev:?}");
    }
    let first = ms[0];
    ms.sort_by(f64::total_cmp);
    let s = cache.stats();
    eprintln!(
        "{label}: {queries} queries, {:.1} levels each: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, first {first:.1} ms; mean {:.2} ms; cache {:.1} MiB of {:.0} ({} spectra, {} answers, {} evictions, {} hits, {} misses)",
        levels as f64 / queries as f64,
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        percentile(&ms, 1.0),
        ms.iter().sum::<f64>() / ms.len() as f64,
        s.bytes as f64 / (1 << 20) as f64,
        s.bound as f64 / (1 << 20) as f64,
        s.spectra,
        s.answers,
        s.evictions,
        s.hits,
        s.misses
    );
    assert!(s.bytes <= s.bound);
}

#[test]
#[ignore = "a measurement (see the module docs)"]
fn loadgen_workload_default_grid_n_1e6() {
    run("n=1e6 default grid", 1_000_000, 0.01, 300);
}

#[test]
#[ignore = "a measurement (see the module docs)"]
fn loadgen_workload_500_levels_n_1e5() {
    run("n=1e5 500 levels", 100_000, 0.002, 300);
}

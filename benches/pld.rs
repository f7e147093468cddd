//! Criterion benchmarks of the PLD accountant (issue 14). `scripts/bench-pld`
//! runs these and times dp-accounting on the same computations in the same run,
//! printing the ratios.
//!
//! - worst case: q = 0.01, sigma = 1.1, T = 10,000, delta = 1e-5 (goal <= 20 ms);
//! - per-example estimate: 100 levels k = 1..100 with noise sigma*100/k, q = 0.01,
//!   sigma = 1.1, 100 steps at each level, delta = 1e-5, composed from a cache of
//!   the level spectra (goal <= 20 ms); the one-off cache build is timed too.
//!   The cache is sized as the server sizes it (`src/engine/estimate.rs`): for
//!   a horizon of the next power of two above the steps applied, 16,384.

use criterion::{criterion_group, criterion_main, Criterion};
use dpledger::accounting::pld::{worst_case_epsilon, LevelCache, PldEvent, PldOptions};
use std::hint::black_box;
use std::time::Duration;

fn pld(c: &mut Criterion) {
    let opts = PldOptions::default();
    let mut group = c.benchmark_group("pld");
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(20);
    let ev = [PldEvent::PoissonGaussian {
        q: 0.01,
        sigma: 1.1,
        count: 10_000,
    }];
    group.bench_function("worst_case_q0.01_s1.1_T10000", |b| {
        b.iter(|| worst_case_epsilon(black_box(&ev), 1e-5, &opts).expect("valid"))
    });
    let levels: Vec<(f64, f64)> = (1..=100).map(|k| (0.01, 1.1 * 100.0 / k as f64)).collect();
    // The server's horizon for 10,000 steps applied.
    const HORIZON: u64 = 16_384;
    let cache = LevelCache::new(&levels, HORIZON, &opts).expect("valid");
    let counts: Vec<(usize, u64)> = (0..100).map(|i| (i, 100)).collect();
    group.bench_function("per_example_100_levels_cached", |b| {
        b.iter(|| {
            cache
                .compose(black_box(&counts))
                .and_then(|p| p.epsilon(1e-5))
                .expect("valid")
        })
    });
    group.sample_size(10);
    group.bench_function("level_cache_build_100_levels", |b| {
        b.iter(|| LevelCache::new(black_box(&levels), HORIZON, &opts).expect("valid"))
    });
    group.finish();
}

criterion_group!(benches, pld);
criterion_main!(benches);

//! Criterion benchmarks of the PLD accountant.
//! `scripts/bench-pld` runs these and times dp-accounting on the same
//! computations in the same run, printing the ratios.
//!
//! - worst case: q = 0.01, sigma = 1.1, T = 10,000, delta = 1e-5 (goal <= 20 ms);
//! - per-example estimate, old path: 100 levels k = 1..100 with noise
//!   sigma*100/k, q = 0.01, sigma = 1.1, 100 steps at each level, delta = 1e-5,
//!   composed from a [`LevelCache`] of the level spectra on one domain sized
//!   for a horizon of 16,384 steps (what the server did before the per-query domain); the
//!   one-off cache build is timed too;
//! - per-example estimate, served path (`estimate_epsilon`): the same
//!   example with its spectra cached but a new history at every iteration (the
//!   counts rotate, so no finished answer is reused), the same with the answer
//!   cached (a polling dashboard), a small-epsilon example (refined grid), and
//!   the first query of a new 273-level grid (cold cache: 40 levels built).

use criterion::{criterion_group, criterion_main, Criterion};
use dpledger::accounting::pld::{
    estimate_epsilon, worst_case_epsilon, EstimateCache, LevelCache, PldEvent, PldOptions,
};
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
    let events = |shift: u64| -> Vec<PldEvent> {
        levels
            .iter()
            .enumerate()
            .map(|(i, &(q, sigma))| PldEvent::PoissonGaussian {
                q,
                sigma,
                count: 95 + (i as u64 + shift) % 11,
            })
            .collect()
    };
    let spectra = EstimateCache::default();
    let mut shift = 0u64;
    group.bench_function("estimate_100_levels_spectra_cached", |b| {
        b.iter(|| {
            shift += 1;
            estimate_epsilon(&spectra, black_box(&events(shift % 11)), 1e-5).expect("valid")
        })
    });
    let same = events(0);
    group.bench_function("estimate_100_levels_answer_cached", |b| {
        b.iter(|| estimate_epsilon(&spectra, black_box(&same), 1e-5).expect("valid"))
    });
    // The small-epsilon shape: 2 levels, 261 steps (epsilon ~0.07).
    let mut small_steps = 130u64;
    group.bench_function("estimate_small_epsilon_spectra_cached", |b| {
        b.iter(|| {
            small_steps = 130 + (small_steps + 1) % 7;
            let ev = [
                PldEvent::PoissonGaussian {
                    q: 0.01,
                    sigma: 6.0,
                    count: small_steps,
                },
                PldEvent::PoissonGaussian {
                    q: 0.01,
                    sigma: 9.0,
                    count: 131,
                },
            ];
            estimate_epsilon(&spectra, black_box(&ev), 1e-5).expect("valid")
        })
    });
    group.sample_size(10);
    group.bench_function("level_cache_build_100_levels", |b| {
        b.iter(|| LevelCache::new(black_box(&levels), HORIZON, &opts).expect("valid"))
    });
    // A new 273-level grid (C = 1.5, rounding 0.0055, sigma 1): an example at
    // 40 of its levels, 25 steps each, asked of an empty cache.
    let grid273: Vec<PldEvent> = (0..40)
        .map(|j| PldEvent::PoissonGaussian {
            q: 0.01,
            sigma: 1.5 / ((3 + j * 6) as f64 * 0.0055).min(1.5),
            count: 25,
        })
        .collect();
    group.bench_function("estimate_first_query_273_level_grid_40_levels", |b| {
        b.iter(|| {
            let cold = EstimateCache::default();
            estimate_epsilon(&cold, black_box(&grid273), 1e-5).expect("valid")
        })
    });
    group.finish();
}

criterion_group!(benches, pld);
criterion_main!(benches);

//! Criterion benchmark of a DP release on a ledger of n = 1,000,000
//! examples (64 orders, 50 steps of batch 4096): the unavoidable `O(n × orders)`
//! pass that turns every example's RDP into epsilon (the baseline), against the
//! whole release computation on those epsilons (mean, five KSS quantiles and a
//! 20-bin histogram). Report the ratio of the two from the same run.
//!
//! `cargo test --benches` runs it once at n = 20,000.

use criterion::Criterion;
use dpledger::accounting::conversion::Conversion;
use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
use dpledger::release::{
    compute, HistogramRequest, Labels, MeanRequest, QuantileMethod, QuantilesRequest,
    ReleaseRequest,
};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::hint::black_box;

fn examples() -> u64 {
    if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        20_000
    }
}

fn trained_ledger(n: u64) -> Ledger {
    let mut ledger = Ledger::new(DatasetConfig::poisson(n, 1.0, 1.0, 4096.0 / n as f64, 1e-5))
        .expect("valid config");
    let mut rng = Pcg64::seed_from_u64(6);
    for step in 0..50 {
        let mut ids: Vec<u64> = (0..4096.min(n)).map(|_| rng.random_range(0..n)).collect();
        ids.sort_unstable();
        ids.dedup();
        let norms = ids.iter().map(|_| rng.random_range(0.0..1.5)).collect();
        ledger
            .step(&StepReport::new(step, ids, norms))
            .expect("step applies");
    }
    ledger
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let ledger = trained_ledger(examples());
    let bound = ledger
        .worst_case(1e-5, Conversion::Improved)
        .unwrap()
        .epsilon;
    let epsilons = ledger.all_epsilons(1e-5, Conversion::Improved).unwrap();
    let mut request = ReleaseRequest {
        mean: Some(MeanRequest { rho: 0.0025 }),
        quantiles: Some(QuantilesRequest {
            rho: 0.00125,
            levels: vec![0.1, 0.3, 0.5, 0.7, 0.9],
            method: QuantileMethod::Kss,
            steps: None,
        }),
        histogram: Some(HistogramRequest {
            rho: 0.001,
            bins: 20,
        }),
        by_group: false,
        delta: None,
    };
    request.validate().unwrap();
    let labels = Labels::default();
    let mut group = c.benchmark_group("release");
    group.bench_function("baseline_all_epsilons", |b| {
        b.iter(|| black_box(ledger.all_epsilons(1e-5, Conversion::Improved).unwrap()))
    });
    group.bench_function("mean_kss_histogram", |b| {
        let mut rng = Pcg64::seed_from_u64(7);
        b.iter(|| black_box(compute(&mut rng, &request, &epsilons, bound, &labels)))
    });
    group.finish();
    c.final_summary();
}

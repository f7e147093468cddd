//! Criterion benchmarks of the per-bucket RDP table: the hot
//! precomputation of the service. Compare with `scripts/bench-dp-accounting`,
//! which times dp-accounting computing the same table in Python.

use criterion::{criterion_group, criterion_main, Criterion};
use dpledger::accounting::grid::BucketGrid;
use dpledger::accounting::orders::{default_orders, ledger_orders};
use dpledger::accounting::table::{RdpTable, StepMechanism};
use std::hint::black_box;
use std::time::Duration;

fn tables(c: &mut Criterion) {
    let grid = BucketGrid::new(1.0, 0.01).expect("valid grid"); // 100 buckets + bucket 0
    let mech = StepMechanism::Poisson {
        q: 0.08,
        sigma: 3.2,
    };
    let integer: Vec<f64> = (2..=256).map(f64::from).collect();
    let mut group = c.benchmark_group("bucket_table");
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(20);
    group.bench_function("q0.08_s3.2_100buckets_int_orders_2-256", |b| {
        b.iter(|| RdpTable::compute(black_box(&grid), mech, &integer))
    });
    let ledger = ledger_orders();
    group.bench_function("q0.08_s3.2_100buckets_ledger_orders_64", |b| {
        b.iter(|| RdpTable::compute(black_box(&grid), mech, &ledger))
    });
    group.sample_size(10);
    let default = default_orders();
    group.bench_function("q0.08_s3.2_100buckets_default_orders_156", |b| {
        b.iter(|| RdpTable::compute(black_box(&grid), mech, &default))
    });
    group.finish();
}

criterion_group!(benches, tables);
criterion_main!(benches);

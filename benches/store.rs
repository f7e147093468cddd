//! Store benchmarks: durable ingest of step records through group commit, and the
//! recovery scan (`load`) of a store holding 10 million norms.
//!
//! ```sh
//! cargo bench --bench store                       # SQLite in a temp dir under /tmp
//! DPLEDGER_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:55432/test cargo bench --bench store
//! ```
//!
//! Each record is one `StepPart` whose payload is a 4096-example step encoded with
//! the `DPLS` codec (random unsorted ids, so raw 8-byte ids: ~64 KiB, the largest
//! form). Ingest appends one record per call from 8 threads, every call durable on
//! return; criterion's `elem/s` is records per second (x 4096 for norms per second).
//! A summary line with records/s, norms/s and MB/s is printed before criterion runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dpledger::store::{self, Record, RecordKind, StepPayload, Store};
use rand::{Rng, SeedableRng};

const NORMS_PER_RECORD: usize = 4096;
const THREADS: usize = 8;
/// 2442 x 4096 = 10,002,432 norms.
const LOAD_RECORDS: usize = 2442;
const PAYLOAD_POOL: usize = 64;

/// Encoded step payloads, reused round-robin (encoding is not what is measured).
fn payload_pool() -> Arc<Vec<Vec<u8>>> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(4);
    let pool = (0..PAYLOAD_POOL)
        .map(|i| {
            StepPayload {
                step: i as u64,
                part: None,
                noise_multiplier: None,
                sampling_rate: None,
                ids: (0..NORMS_PER_RECORD)
                    .map(|_| rng.random_range(0..1_000_000u64))
                    .collect(),
                norms: (0..NORMS_PER_RECORD)
                    .map(|_| rng.random::<f64>() * 10.0)
                    .collect(),
            }
            .encode()
        })
        .collect();
    Arc::new(pool)
}

/// Global step counter so that no (dataset, step) ever repeats within a store.
static NEXT_STEP: AtomicU64 = AtomicU64::new(0);

/// Appends `records` step records from `THREADS` threads, one record per call.
fn ingest(store: &Arc<dyn Store>, pool: &Arc<Vec<Vec<u8>>>, records: u64) -> Duration {
    let started = Instant::now();
    let per_thread = records.div_ceil(THREADS as u64);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(store);
            let pool = Arc::clone(pool);
            let n = per_thread.min(records.saturating_sub(per_thread * t as u64));
            std::thread::spawn(move || {
                for _ in 0..n {
                    let step = NEXT_STEP.fetch_add(1, Ordering::Relaxed);
                    let record = Record {
                        dataset: format!("bench-{t}"),
                        kind: RecordKind::StepPart,
                        step: Some(step),
                        part: None,
                        payload: pool[step as usize % pool.len()].clone(),
                    };
                    store.append(vec![record]).expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("ingest thread");
    }
    started.elapsed()
}

fn scan(store: &dyn Store, decode: bool) -> (u64, u64) {
    let mut norms = 0u64;
    let stats = store
        .load(&mut |r| {
            if decode {
                let p = StepPayload::decode(&r.record.payload).expect("valid payload");
                norms += p.norms.len() as u64;
            } else {
                norms += (r.record.payload.len() / 16) as u64;
            }
            Ok(())
        })
        .expect("load");
    (stats.records, norms)
}

/// A fresh store and the guard that deletes it (temp dir or schema) when dropped.
type Fresh = (Arc<dyn Store>, Box<dyn std::any::Any>);

/// A backend to benchmark: its name and how to open a fresh, empty store.
struct Target {
    name: &'static str,
    fresh: Box<dyn Fn() -> Fresh>,
}

fn sqlite_target() -> Target {
    Target {
        name: "sqlite",
        fresh: Box::new(|| {
            let dir = tempfile::Builder::new()
                .prefix("dpledger-bench-")
                .tempdir_in("/tmp")
                .expect("tempdir");
            let url = format!("sqlite:{}", dir.path().join("bench.sqlite").display());
            let store = store::open(&url).expect("open");
            (store, Box::new(dir))
        }),
    }
}

/// A PostgreSQL schema dropped when the guard is.
struct PgSchema {
    base: String,
    schema: String,
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.base, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

fn pg_target(base: String) -> Target {
    static N: AtomicU64 = AtomicU64::new(0);
    Target {
        name: "postgres",
        fresh: Box::new(move || {
            let schema = format!(
                "bench_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let mut c = postgres::Client::connect(&base, postgres::NoTls).expect("postgres");
            c.batch_execute(&format!("CREATE SCHEMA {schema}"))
                .expect("schema");
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
            let store = store::open(&url).expect("open");
            let guard = PgSchema {
                base: base.clone(),
                schema,
            };
            (store, Box::new(guard))
        }),
    }
}

fn targets() -> Vec<Target> {
    let mut t = vec![sqlite_target()];
    if let Ok(url) = std::env::var("DPLEDGER_BENCH_POSTGRES_URL") {
        t.push(pg_target(url));
    }
    t
}

fn benches(c: &mut Criterion) {
    let pool = payload_pool();
    let record_bytes = pool[0].len();
    for target in targets() {
        // Build the 10M-norm store once, timing it as a sustained-ingest figure.
        let (store, guard) = (target.fresh)();
        let took = ingest(&store, &pool, LOAD_RECORDS as u64);
        let secs = took.as_secs_f64();
        println!(
            "{}: ingested {LOAD_RECORDS} records ({} norms, {:.0} MB) from {THREADS} threads in \
             {secs:.2} s: {:.0} records/s, {:.2} M norms/s, {:.0} MB/s",
            target.name,
            LOAD_RECORDS * NORMS_PER_RECORD,
            (LOAD_RECORDS * record_bytes) as f64 / 1e6,
            LOAD_RECORDS as f64 / secs,
            (LOAD_RECORDS * NORMS_PER_RECORD) as f64 / secs / 1e6,
            (LOAD_RECORDS * record_bytes) as f64 / secs / 1e6,
        );
        let started = Instant::now();
        let (records, norms) = scan(&*store, false);
        println!(
            "{}: first load: {records} records, {norms} norms in {:.3} s",
            target.name,
            started.elapsed().as_secs_f64()
        );

        let mut group = c.benchmark_group(format!("store_{}", target.name));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(8));
        group.throughput(Throughput::Elements(LOAD_RECORDS as u64));
        group.bench_function("load_10m_norms_scan", |b| {
            b.iter(|| assert_eq!(scan(&*store, false).0, LOAD_RECORDS as u64))
        });
        group.bench_function("load_10m_norms_scan_and_decode", |b| {
            b.iter(|| {
                assert_eq!(
                    scan(&*store, true).1,
                    (LOAD_RECORDS * NORMS_PER_RECORD) as u64
                )
            })
        });
        drop(store);
        if target.name == "sqlite" {
            // Reopening runs the integrity checks (header, quick_check): part of
            // recovery time.
            let url = {
                let dir = guard
                    .downcast_ref::<tempfile::TempDir>()
                    .expect("sqlite guard");
                format!("sqlite:{}", dir.path().join("bench.sqlite").display())
            };
            group.bench_function("open_10m_norms", |b| {
                b.iter(|| drop(store::open(&url).expect("reopen")))
            });
        }
        drop(guard);

        group.throughput(Throughput::Elements(1));
        group.bench_function("ingest_8_threads_records", |b| {
            b.iter_custom(|iters| {
                let (store, guard) = (target.fresh)();
                let took = ingest(&store, &pool, iters);
                drop(store);
                drop(guard);
                took
            })
        });
        group.finish();
    }
}

criterion_group!(store_benches, benches);
criterion_main!(store_benches);

//! Group commit, observed: callers queued behind a busy writer are committed in
//! one transaction, and a duplicate in one caller's batch fails only that caller.
//!
//! A separate test binary because it installs a global `metrics` recorder to see
//! the size of each group.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use dpledger::store::{self, Record, RecordKind, StepPayload, Store, StoreError, StoredRecord};
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

static LARGEST_GROUP: AtomicU64 = AtomicU64::new(0);

struct LargestGroup;

impl HistogramFn for LargestGroup {
    fn record(&self, value: f64) {
        LARGEST_GROUP.fetch_max(value as u64, Ordering::SeqCst);
    }
}

struct GroupRecorder;

impl Recorder for GroupRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == "dpledger_store_group_requests" {
            Histogram::from_arc(Arc::new(LargestGroup))
        } else {
            Histogram::noop()
        }
    }
}

fn step(dataset: &str, step: u64, part: Option<u32>) -> Record {
    let payload = StepPayload {
        step,
        part: part.map(|p| (p, 4)),
        noise_multiplier: None,
        sampling_rate: None,
        ids: vec![step, step + 1],
        norms: vec![0.5, 1.5],
    };
    Record {
        dataset: dataset.into(),
        kind: RecordKind::StepPart,
        step: Some(step),
        part,
        payload: payload.encode(),
    }
}

fn load_all(store: &dyn Store) -> Result<Vec<StoredRecord>, StoreError> {
    let mut out = Vec::new();
    store.load(&mut |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

fn assert_contiguous(records: &[StoredRecord]) {
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1, "seq not contiguous at position {i}");
    }
}

#[test]
fn a_duplicate_fails_only_its_caller_within_a_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.sqlite");
    metrics::set_global_recorder(GroupRecorder).expect("only test of this binary");
    let store = store::open(&format!("sqlite:{}", path.display())).unwrap();
    store.append(vec![step("d", 0, None)]).unwrap();

    // Hold the write lock from another connection so the writer stalls on its
    // first group while every other caller queues behind it: they then commit
    // together in one transaction.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // A pilot append occupies the writer (waiting for the lock) first, so that all
    // the callers below queue up behind it and form the next group together.
    let pilot = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.append(vec![step("pilot", 0, None)]))
    };
    std::thread::sleep(Duration::from_millis(200));
    let threads = 24;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let records = match t % 6 {
                    // Collides with the stored step 0.
                    0 => vec![step("d", 100 + t as u64, None), step("d", 0, None)],
                    // All of these callers race for the same new step.
                    1 => vec![step("race", 1, None)],
                    _ => vec![
                        step("d", 100 + t as u64, None),
                        step("d", 500 + t as u64, None),
                    ],
                };
                (t, store.append(records))
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(Duration::from_millis(300));
    blocker.execute_batch("COMMIT").unwrap();
    assert_eq!(pilot.join().unwrap(), Ok(vec![2]));
    let mut race_winners = 0;
    for h in handles {
        let (t, result) = h.join().unwrap();
        match t % 6 {
            0 => assert!(
                matches!(result, Err(StoreError::Duplicate { step: 0, .. })),
                "caller {t}: {result:?}"
            ),
            1 => match result {
                Ok(_) => race_winners += 1,
                Err(StoreError::Duplicate { step: 1, .. }) => {}
                Err(e) => panic!("caller {t}: {e}"),
            },
            _ => assert_eq!(result.map(|s| s.len()), Ok(2), "caller {t}"),
        }
    }
    assert_eq!(race_winners, 1, "exactly one caller stores step 1");
    let largest = LARGEST_GROUP.load(Ordering::SeqCst);
    assert!(
        largest >= threads as u64,
        "the queued callers should commit as one group; largest group had {largest} requests"
    );
    let loaded = load_all(&*store).unwrap();
    assert_contiguous(&loaded);
    let expected = 1 + 1 + 1 + (threads - 8) * 2;
    assert_eq!(loaded.len(), expected);
    for t in (0..threads).filter(|t| t % 6 == 0) {
        assert!(
            loaded.iter().all(|r| r.record.step != Some(100 + t as u64)),
            "the failed caller {t} left a record"
        );
    }
}

//! Group commit, observed: callers queued behind a busy writer are committed in
//! one transaction, and a duplicate in one caller's batch fails only that caller.
//!
//! A separate test binary because it installs a global `metrics` recorder to see
//! the size of each group.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod common;

use common::store_records::{assert_a_duplicate_fails_only_its_caller, step};
use dpledger::store;
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
    assert_a_duplicate_fails_only_its_caller(store, || blocker.execute_batch("COMMIT").unwrap());
    let threads = 24;
    let largest = LARGEST_GROUP.load(Ordering::SeqCst);
    assert!(
        largest >= threads,
        "the queued callers should commit as one group; largest group had {largest} requests"
    );
}

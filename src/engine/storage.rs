//! What the service keeps where: the store's log, snapshots
//! and archives, and each dataset's memory, for `GET /v1/admin/storage` and the
//! Prometheus gauges of the same figures.
//!
//! Measuring never loads a paged-out dataset: its memory is the placeholder's
//! (and its size the one noted when it left memory). The store is measured on
//! the blocking pool with one grouped scan per table (the log's payload lengths
//! are read from row headers, not the payloads), so the report costs about a
//! pass over the log's rows: the policy loop refreshes the gauges every
//! `serve --storage-gauge-seconds` (30), not on every scrape.

use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::store::{SnapshotInfo, StorageStats};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The report's types, defined once with the Rust client in the workspace
/// crate `dpledger-api`.
pub use dpledger_api::storage::{
    DatasetStorageReport, EstimateCacheReport, SnapshotReport, StorageReport, TableCacheReport,
};

/// The estimate cache's figures now.
pub fn estimate_cache_report() -> EstimateCacheReport {
    let s = super::estimate::estimate_cache().stats();
    EstimateCacheReport {
        spectra: s.spectra as u64,
        mgfs: s.mgfs as u64,
        answers: s.answers as u64,
        bytes: s.bytes as u64,
        bound_bytes: s.bound as u64,
        evictions: s.evictions,
        hits: s.hits,
        misses: s.misses,
    }
}

/// Set the `dpledger_estimate_cache_*` gauges (also on every scrape).
pub fn export_estimate_cache() {
    let r = estimate_cache_report();
    metrics::gauge!("dpledger_estimate_cache_bytes").set(r.bytes as f64);
    metrics::gauge!("dpledger_estimate_cache_bound_bytes").set(r.bound_bytes as f64);
    metrics::gauge!("dpledger_estimate_cache_spectra").set(r.spectra as f64);
    metrics::gauge!("dpledger_estimate_cache_answers").set(r.answers as f64);
    metrics::counter!("dpledger_estimate_cache_evictions_total").absolute(r.evictions);
    metrics::counter!("dpledger_estimate_cache_hits_total").absolute(r.hits);
    metrics::counter!("dpledger_estimate_cache_misses_total").absolute(r.misses);
}

impl Engine {
    /// Measure the store and every dataset (see the module note).
    pub async fn storage_report(&self) -> EngineResult<StorageReport> {
        let store = self.store.clone();
        let (stats, snapshots) = tokio::task::spawn_blocking(move || {
            Ok::<_, crate::store::StoreError>((store.storage()?, store.snapshots()?))
        })
        .await
        .map_err(|_| EngineError::Internal("the storage measurement failed".into()))?
        .map_err(EngineError::store)?;
        let newest = newest_snapshots(snapshots);
        let now = crate::store::snapshots::now_secs();
        let mut datasets = Vec::new();
        for id in self.dataset_ids() {
            let Ok(ds) = self.dataset(&id) else { continue };
            // The placeholder when paged out: reading it loads nothing.
            let ledger = ds.ledger.read().await;
            let paged_out = ds.is_paged_out();
            let (examples, steps) = if paged_out {
                *ds.paged_out_size.lock().unwrap_or_else(|e| e.into_inner())
            } else {
                (ledger.examples(), ledger.next_step())
            };
            let memory_bytes = ledger.memory_bytes();
            drop(ledger);
            let stored = stats.datasets.get(&id).copied().unwrap_or_default();
            let per_example = |bytes: u64| {
                if examples == 0 {
                    0.0
                } else {
                    bytes as f64 / examples as f64
                }
            };
            let newest_bytes = newest.get(&id).map_or(0, |s| s.bytes);
            datasets.push(DatasetStorageReport {
                memory_bytes_per_example: if paged_out {
                    0.0
                } else {
                    per_example(memory_bytes)
                },
                snapshot_bytes_per_example: per_example(newest_bytes),
                archived: ds.is_archived(),
                paged_out,
                examples,
                steps,
                memory_bytes,
                idle_seconds: ds.idle_for().as_secs_f64(),
                last_seq: ds.last_seq.load(Ordering::Acquire),
                log_records: stored.records,
                log_bytes: stored.log_bytes,
                snapshot_bytes: stored.snapshot_bytes,
                archive_bytes: stored.archive_bytes,
                newest_snapshot: newest.get(&id).map(|s| SnapshotReport {
                    id: s.id,
                    seq: s.seq,
                    bytes: s.bytes,
                    created: s.created,
                    age_seconds: now.saturating_sub(s.created),
                    pinned: s.pinned,
                }),
                records_since_snapshot: ds.snapshot_mark().records_since,
                id,
            });
        }
        Ok(report(self.store.describe(), &stats, datasets))
    }

    /// Refresh the storage gauges from a new report; a failure is logged (the
    /// gauges keep their last values).
    pub async fn export_storage_gauges(&self) {
        match self.storage_report().await {
            Ok(r) => export_gauges(&r),
            Err(e) => tracing::warn!(error = %e, "cannot measure storage for the gauges"),
        }
    }
}

/// The newest complete snapshot of each dataset.
fn newest_snapshots(all: Vec<SnapshotInfo>) -> BTreeMap<String, SnapshotInfo> {
    let mut newest: BTreeMap<String, SnapshotInfo> = BTreeMap::new();
    for s in all {
        let replace = newest
            .get(&s.dataset)
            .is_none_or(|old| (s.seq, s.id) > (old.seq, old.id));
        if replace {
            newest.insert(s.dataset.clone(), s);
        }
    }
    newest
}

fn report(
    store: String,
    stats: &StorageStats,
    datasets: Vec<DatasetStorageReport>,
) -> StorageReport {
    let cache = crate::ledger::table_cache().stats();
    StorageReport {
        store,
        log_records: stats.records,
        log_bytes: stats.log_bytes,
        snapshot_bytes: stats.snapshot_bytes,
        archive_bytes: stats.archive_bytes,
        memory_bytes: datasets.iter().map(|d| d.memory_bytes).sum(),
        datasets_in_memory: datasets.iter().filter(|d| !d.paged_out).count() as u64,
        datasets_paged_out: datasets.iter().filter(|d| d.paged_out).count() as u64,
        table_cache: TableCacheReport {
            tables: cache.tables as u64,
            bytes: cache.bytes as u64,
            bound_bytes: cache.bound as u64,
            evictions: cache.evictions,
        },
        estimate_cache: estimate_cache_report(),
        datasets,
    }
}

/// Set the gauges of `docs/operations.md` from a report.
fn export_gauges(r: &StorageReport) {
    metrics::gauge!("dpledger_store_log_records").set(r.log_records as f64);
    metrics::gauge!("dpledger_store_log_bytes").set(r.log_bytes as f64);
    metrics::gauge!("dpledger_store_snapshot_bytes").set(r.snapshot_bytes as f64);
    metrics::gauge!("dpledger_store_archive_bytes").set(r.archive_bytes as f64);
    metrics::gauge!("dpledger_ledger_memory_bytes").set(r.memory_bytes as f64);
    metrics::gauge!("dpledger_datasets_in_memory").set(r.datasets_in_memory as f64);
    metrics::gauge!("dpledger_datasets_paged_out").set(r.datasets_paged_out as f64);
    export_estimate_cache();
    for d in &r.datasets {
        let id = d.id.clone();
        metrics::gauge!("dpledger_dataset_memory_bytes", "dataset" => id.clone())
            .set(d.memory_bytes as f64);
        metrics::gauge!("dpledger_dataset_log_records", "dataset" => id.clone())
            .set(d.log_records as f64);
        metrics::gauge!("dpledger_dataset_log_bytes", "dataset" => id.clone())
            .set(d.log_bytes as f64);
        metrics::gauge!("dpledger_dataset_records_since_snapshot", "dataset" => id.clone())
            .set(d.records_since_snapshot as f64);
        metrics::gauge!("dpledger_dataset_paged_out", "dataset" => id.clone())
            .set(if d.paged_out { 1.0 } else { 0.0 });
        if let Some(s) = &d.newest_snapshot {
            metrics::gauge!("dpledger_dataset_snapshot_age_seconds", "dataset" => id)
                .set(s.age_seconds as f64);
        }
    }
}

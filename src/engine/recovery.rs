//! Rebuilding ledgers from snapshots and the log: every dataset when the
//! process starts, and one dataset when memory may be behind the log (a commit
//! whose outcome is unknown, or a step another process stored). Both start from
//! the dataset's newest snapshot that verifies (`snapshots.rs`) and apply the
//! stored records after it through [`apply_record`], the same code, so a reload
//! sees exactly what a restart would, and what a replay of the whole log would.

use super::book::{apply_release, apply_setting, export_gauges};
use super::commands::CreatedPayload;
use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::snapshots::load_newest;
use super::Engine;
use crate::ledger::{Ledger, StepReport};
use crate::release::LabelAssignment;
use crate::store::codec::StepPayload;
use crate::store::{RecordKind, SnapshotInfo, Store, StoreError, StoredRecord};
use dashmap::DashMap;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Rebuild the ledgers: each dataset from its newest snapshot that verifies
    /// (or from its creation), then the log's records after it. Any record that
    /// does not apply cleanly is corruption: refuse to start rather than serve
    /// epsilons computed from a partial log. A dataset whose log was compacted
    /// and whose pinned snapshot cannot be loaded is refused likewise.
    pub fn recover(store: Arc<dyn Store>) -> anyhow::Result<Self> {
        let datasets: DashMap<String, Arc<Dataset>> = DashMap::new();
        let started = Instant::now();
        let description = store.describe();
        let catalogue = store.snapshots()?;
        let compactions = store.compactions()?;
        let mut covered: HashMap<String, u64> = HashMap::new();
        let mut after = u64::MAX;
        for (id, created) in store.dataset_starts()? {
            let candidates: Vec<&SnapshotInfo> =
                catalogue.iter().filter(|s| s.dataset == id).collect();
            let start = match load_newest(store.as_ref(), &candidates) {
                Some((info, ds)) => {
                    datasets.insert(id.clone(), Arc::new(ds));
                    covered.insert(id.clone(), info.seq);
                    info.seq
                }
                None => created.saturating_sub(1),
            };
            if let Some(c) = compactions.iter().find(|c| c.dataset == id) {
                if start < c.upto {
                    anyhow::bail!(StoreError::Corrupt {
                        store: description.clone(),
                        seq: Some(c.upto),
                        detail: format!(
                            "dataset {id:?} was compacted up to seq {} and its pinned snapshot \
                             {} cannot be loaded (see the warnings above): restore the store \
                             from a backup",
                            c.upto, c.snapshot
                        ),
                    });
                }
            }
            after = after.min(start);
        }
        let snapshot_seconds = started.elapsed().as_secs_f64();
        let mut apply = |stored: StoredRecord| -> Result<(), StoreError> {
            if covered
                .get(&stored.record.dataset)
                .is_some_and(|&seq| stored.seq <= seq)
            {
                return Ok(());
            }
            apply_record(&datasets, &stored).map_err(|detail| StoreError::Corrupt {
                store: description.clone(),
                seq: Some(stored.seq),
                detail,
            })
        };
        // With no dataset, `after` stays MAX: the load still checks the log's end.
        let stats = store.load_after(if after == u64::MAX { 0 } else { after }, &mut apply)?;
        for d in datasets.iter() {
            export_gauges(d.key(), &d.book_read());
        }
        metrics::gauge!("dpledger_recovery_snapshots_loaded").set(covered.len() as f64);
        metrics::gauge!("dpledger_recovery_records_replayed").set(stats.records as f64);
        metrics::gauge!("dpledger_recovery_seconds").set(started.elapsed().as_secs_f64());
        tracing::info!(
            records = stats.records,
            datasets = datasets.len(),
            from_snapshots = covered.len(),
            snapshot_seconds,
            seconds = started.elapsed().as_secs_f64(),
            "recovered ledgers from {}",
            store.describe()
        );
        Ok(Self {
            datasets: Arc::new(datasets),
            store,
            cluster: None,
            sharding: Default::default(),
        })
    }

    /// Rebuild one dataset from its newest snapshot and its own records after
    /// it into `ds`; the caller holds the dataset's write lock (`ledger`).
    pub(super) async fn reload_into(&self, ds: &Dataset, ledger: &mut Ledger) -> EngineResult<()> {
        let fresh = self.reload(&ds.id).await?;
        let fresh = Arc::try_unwrap(fresh)
            .map_err(|_| EngineError::Internal("reload raced".to_string()))?;
        *ds.book_write() = fresh.book.into_inner().unwrap_or_else(|e| e.into_inner());
        *ds.book_log.lock().unwrap_or_else(|e| e.into_inner()) = fresh
            .book_log
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        ds.last_seq
            .store(fresh.last_seq.load(Ordering::Acquire), Ordering::Release);
        ds.archived
            .store(fresh.archived.load(Ordering::Acquire), Ordering::Release);
        *ledger = fresh.ledger.into_inner();
        Ok(())
    }

    /// Rebuild one dataset from the store. Runs on a blocking thread; the
    /// caller holds the dataset's write lock.
    pub(super) async fn reload(&self, id: &str) -> EngineResult<Arc<Dataset>> {
        let store = self.store.clone();
        let name = id.to_string();
        let id = id.to_string();
        let rebuilt =
            tokio::task::spawn_blocking(move || -> anyhow::Result<Option<Arc<Dataset>>> {
                let started = Instant::now();
                let one: DashMap<String, Arc<Dataset>> = DashMap::new();
                let description = store.describe();
                let catalogue = store.snapshots()?;
                let candidates: Vec<&SnapshotInfo> =
                    catalogue.iter().filter(|s| s.dataset == id).collect();
                let (after, snapshot_bytes) = match load_newest(store.as_ref(), &candidates) {
                    Some((info, ds)) => {
                        one.insert(id.clone(), Arc::new(ds));
                        (info.seq, info.bytes)
                    }
                    None => (0, 0),
                };
                let snapshot_seconds = started.elapsed().as_secs_f64();
                let tail = store.load_dataset(&id, after, &mut |stored: StoredRecord| {
                    apply_record(&one, &stored).map_err(|detail| StoreError::Corrupt {
                        store: description.clone(),
                        seq: Some(stored.seq),
                        detail,
                    })
                })?;
                // What a load costs, in its parts (a takeover's time is mostly this).
                tracing::info!(
                    dataset = id,
                    snapshot_seq = after,
                    snapshot_bytes,
                    snapshot_seconds,
                    records = tail.records,
                    record_bytes = tail.bytes,
                    seconds = started.elapsed().as_secs_f64(),
                    "loaded a dataset from the store"
                );
                Ok(one.remove(&id).map(|(_, d)| d))
            })
            .await
            .map_err(|_| EngineError::Internal("reload task failed".to_string()))?
            .map_err(|e| {
                tracing::error!(error = %e, "reloading a dataset from the log failed");
                EngineError::Unavailable(
                    "the store could not be read back; nothing was acknowledged: retry".to_string(),
                )
            })?;
        rebuilt.ok_or_else(|| EngineError::NotFound(format!("no dataset {name:?} in the log")))
    }
}

/// Give a dataset with budgets per label its examples' classes from the
/// labels stored with its creation (the first labels record, for ids `0..k`
/// in order).
fn assign_creation_labels(ledger: &mut Ledger, payload: &[u8]) -> Result<(), String> {
    let a: LabelAssignment = serde_json::from_slice(payload).map_err(|e| format!("labels: {e}"))?;
    if !a.ids.iter().enumerate().all(|(j, &id)| id == j as u64) {
        return Err("the labels stored with a dataset's creation are not for ids 0..k".to_string());
    }
    ledger
        .assign_budget_labels(&a.labels)
        .map_err(|e| format!("budget labels do not apply: {e}"))
}

/// Apply one stored record during recovery; `Err` describes why it does not apply.
fn apply_record(
    datasets: &DashMap<String, Arc<Dataset>>,
    stored: &StoredRecord,
) -> Result<(), String> {
    let rec = &stored.record;
    let existing = || {
        datasets
            .get(&rec.dataset)
            .map(|d| d.clone())
            .ok_or_else(|| format!("record for unknown dataset {:?}", rec.dataset))
    };
    match rec.kind {
        RecordKind::DatasetCreated => {
            let payload: CreatedPayload =
                serde_json::from_slice(&rec.payload).map_err(|e| format!("dataset config: {e}"))?;
            let ledger = Ledger::new(payload.config).map_err(|e| format!("dataset config: {e}"))?;
            if datasets.contains_key(&rec.dataset) {
                return Err(format!("dataset {:?} created twice", rec.dataset));
            }
            datasets.insert(
                rec.dataset.clone(),
                Arc::new(Dataset::new(&rec.dataset, ledger)),
            );
        }
        RecordKind::StepPart => {
            let ds = existing()?;
            let payload =
                StepPayload::decode(&rec.payload).map_err(|e| format!("step payload: {e}"))?;
            let report = StepReport::from(payload);
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let outcome = ledger
                .step(&report)
                .map_err(|e| format!("step {} does not apply: {e}", report.step))?;
            if outcome.duplicate {
                return Err(format!("step {} recorded twice", report.step));
            }
        }
        RecordKind::Refresh => {
            let ds = existing()?;
            let payload =
                StepPayload::decode(&rec.payload).map_err(|e| format!("refresh payload: {e}"))?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            if ledger.next_step() != payload.step {
                return Err(format!(
                    "refresh recorded before step {} but the log reaches step {}",
                    payload.step,
                    ledger.next_step()
                ));
            }
            ledger
                .refresh(&payload.ids, &payload.norms)
                .map_err(|e| format!("refresh does not apply: {e}"))?;
        }
        RecordKind::Archived => {
            existing()?.archived.store(true, Ordering::Release);
        }
        RecordKind::Release => {
            let ds = existing()?;
            let (release, left_out) = super::book::parse_release(&rec.payload)?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let mut book = ds.book_write();
            apply_release(&mut ledger, &mut book, release, &left_out)?;
        }
        kind @ (RecordKind::BudgetChange | RecordKind::Labels | RecordKind::ReleasePolicy) => {
            let ds = existing()?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            if kind == RecordKind::Labels && ledger.awaits_budget_labels() {
                assign_creation_labels(&mut ledger, &rec.payload)?;
            }
            let mut book = ds.book_write();
            apply_setting(&ledger, &mut book, kind, &rec.payload)?;
        }
    }
    if let Some(ds) = datasets.get(&rec.dataset) {
        ds.note_records(&[stored.seq], &[(rec.kind, &rec.payload)]);
    }
    Ok(())
}

//! Rebuilding ledgers from the log: every dataset when the process starts, and
//! one dataset when memory may be behind the log (a commit whose outcome is
//! unknown, or a step another process stored). Both apply stored records through
//! [`apply_record`], the same code, so a reload sees exactly what a restart would.

use super::book::{apply_release, apply_setting, export_gauges, ReleaseBook};
use super::commands::{report_from_payload, CreatedPayload};
use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::ledger::Ledger;
use crate::store::codec::StepPayload;
use crate::store::{RecordKind, Store, StoreError, StoredRecord};
use dashmap::DashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Load every record of `store` and rebuild the ledgers. Any record that does
    /// not apply cleanly is corruption: refuse to start rather than serve epsilons
    /// computed from a partial log.
    pub fn recover(store: Arc<dyn Store>) -> anyhow::Result<Self> {
        let datasets: DashMap<String, Arc<Dataset>> = DashMap::new();
        let started = Instant::now();
        let description = store.describe();
        let mut apply = |stored: StoredRecord| -> Result<(), StoreError> {
            apply_record(&datasets, &stored).map_err(|detail| StoreError::Corrupt {
                store: description.clone(),
                seq: Some(stored.seq),
                detail,
            })
        };
        let stats = store.load(&mut apply)?;
        for d in datasets.iter() {
            export_gauges(d.key(), &d.book_read());
        }
        tracing::info!(
            records = stats.records,
            datasets = datasets.len(),
            seconds = started.elapsed().as_secs_f64(),
            "recovered ledgers from {}",
            store.describe()
        );
        Ok(Self { datasets, store })
    }

    /// Rebuild one dataset's ledger and release book from the log into `ds`; the
    /// caller holds the dataset's write lock (`ledger`).
    pub(super) async fn reload_into(&self, ds: &Dataset, ledger: &mut Ledger) -> EngineResult<()> {
        let (fresh, book) = self.reload(&ds.id).await?;
        *ledger = fresh;
        *ds.book_write() = book;
        Ok(())
    }

    /// Rebuild one dataset's ledger from the log. Runs on a blocking thread; the
    /// caller holds the dataset's write lock.
    async fn reload(&self, id: &str) -> EngineResult<(Ledger, ReleaseBook)> {
        let store = self.store.clone();
        let id = id.to_string();
        let rebuilt =
            tokio::task::spawn_blocking(move || -> anyhow::Result<Option<Arc<Dataset>>> {
                let one: DashMap<String, Arc<Dataset>> = DashMap::new();
                let description = store.describe();
                store.load(&mut |stored: StoredRecord| {
                    if stored.record.dataset != id {
                        return Ok(());
                    }
                    apply_record(&one, &stored).map_err(|detail| StoreError::Corrupt {
                        store: description.clone(),
                        seq: Some(stored.seq),
                        detail,
                    })
                })?;
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
        let dataset = rebuilt
            .ok_or_else(|| EngineError::Internal("dataset missing from the log".to_string()))?;
        let dataset = Arc::try_unwrap(dataset)
            .map_err(|_| EngineError::Internal("reload raced".to_string()))?;
        let book = dataset.book.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok((dataset.ledger.into_inner(), book))
    }
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
            let report = report_from_payload(payload);
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
            let release: crate::release::Release =
                serde_json::from_slice(&rec.payload).map_err(|e| format!("release: {e}"))?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let mut book = ds.book_write();
            apply_release(&mut ledger, &mut book, release)?;
        }
        kind @ (RecordKind::BudgetChange | RecordKind::Labels | RecordKind::ReleasePolicy) => {
            let ds = existing()?;
            let ledger = ds
                .ledger
                .try_read()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let mut book = ds.book_write();
            apply_setting(&ledger, &mut book, kind, &rec.payload)?;
        }
    }
    Ok(())
}

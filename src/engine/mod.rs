//! The engine: every dataset this process serves, and the one path by which
//! anything about them changes. It speaks the domain (ledgers, releases, stored
//! records) and returns [`EngineError`]s; it knows nothing of HTTP, so the HTTP
//! API (`crate::api`), the CLI and tests drive the same code.
//!
//! Every change follows **validate → persist → apply**: the ledger checks the
//! request without mutating (`check_*`), the record is appended durably to the
//! store (group commit), and only then is it applied in memory and acknowledged.
//! A request the ledger would refuse never reaches the log; a change the log could
//! not store is never acknowledged. The dataset's write lock is held from check
//! to apply, so the log's order is the ledger's order.
//!
//! | file | its one job |
//! |---|---|
//! | `mod.rs` | the [`Engine`]: the registry of datasets, lookups, the locked checks and persisting |
//! | `dataset.rs` | one served [`Dataset`]: ledger, release book, archived and stale flags |
//! | `commands.rs` | creating a dataset, steps, refreshes, archiving (validate → persist → apply) |
//! | `recovery.rs` | rebuilding every ledger from the log at start, and one dataset on reload |
//! | `book.rs` | the [`ReleaseBook`] and how each stored release record changes it |
//! | `releases.rs` | publishing releases (by request or policy) and changing release settings |
//! | `data_dependent.rs` | seed 001's analysis over several runs, read from the ledgers and the log |
//! | `error.rs` | the domain errors ([`EngineError`]) |
//! | `bounds.rs` | the PLD worst case (cached) and the bounds it gives examples and releases |
//! | `estimate.rs` | per-example PLD estimates (not a guarantee) from cached level spectra |
//!
//! Per-dataset state derived from the log (a worst-case accountant, snapshots)
//! belongs on [`Dataset`], changed under the ledger's write lock in `commands.rs`
//! and `releases.rs`, and rebuilt record by record in `recovery.rs`.

mod book;
mod bounds;
mod commands;
mod data_dependent;
mod dataset;
mod error;
mod estimate;
mod recovery;
mod releases;

pub use book::{PolicyRefusal, ReleaseBook};
pub use commands::{payload_from_report, report_from_payload, DatasetSetup};
pub use data_dependent::{check_run_ids, DataDependentRequest, MAX_RUNS};
pub use dataset::{valid_dataset_id, Dataset, PldCache};
pub use error::{BudgetRefusal, EngineError, EngineResult};
pub use releases::ReleaseOutcome;

use crate::ledger::Ledger;
use crate::store::{append_async, Record, Store, StoreError};
use dashmap::DashMap;
use std::sync::Arc;
use std::time::Instant;

/// Every dataset this process serves, and the store they are rebuilt from.
pub struct Engine {
    datasets: DashMap<String, Arc<Dataset>>,
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("datasets", &self.datasets.len())
            .field("store", &self.store.describe())
            .finish()
    }
}

impl Engine {
    /// The dataset, or [`EngineError::NotFound`].
    pub fn dataset(&self, id: &str) -> EngineResult<Arc<Dataset>> {
        self.datasets
            .get(id)
            .map(|d| d.clone())
            .ok_or_else(|| EngineError::NotFound(format!("no dataset {id:?}")))
    }

    /// Every dataset id, sorted.
    pub fn dataset_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.datasets.iter().map(|e| e.key().clone()).collect();
        ids.sort();
        ids
    }

    /// Read a dataset's ledger (refused while memory may be behind the log). `f`
    /// runs with the read lock held, so what it computes is one consistent state.
    pub async fn with_ledger<T, E: From<EngineError>>(
        &self,
        id: &str,
        f: impl FnOnce(&Dataset, &Ledger) -> Result<T, E>,
    ) -> Result<T, E> {
        let ds = self.dataset(id)?;
        ds.check_current()?;
        let ledger = ds.ledger.read().await;
        f(&ds, &ledger)
    }

    /// Read a dataset's release book (refused while it is reloading): viewers
    /// never wait for the ledger's lock.
    pub fn with_book<T>(&self, id: &str, f: impl FnOnce(&ReleaseBook) -> T) -> EngineResult<T> {
        let ds = self.dataset(id)?;
        ds.check_current()?;
        let book = ds.book_read();
        Ok(f(&book))
    }

    fn archived_error(id: &str) -> EngineError {
        EngineError::conflict(format!("dataset {id:?} is archived and read-only"))
    }

    /// The dataset, if it may change.
    fn writable(&self, id: &str) -> EngineResult<Arc<Dataset>> {
        let ds = self.dataset(id)?;
        if ds.is_archived() {
            return Err(Self::archived_error(id));
        }
        Ok(ds)
    }

    /// Checks made after taking a dataset's write lock, when they can no longer
    /// change under us: the dataset is still the registered one (a failed create
    /// removes it), it is not archived, and memory is current with the log
    /// (reloading it if it may not be).
    async fn locked_checks(&self, ds: &Arc<Dataset>, ledger: &mut Ledger) -> EngineResult<()> {
        let registered = self
            .datasets
            .get(&ds.id)
            .is_some_and(|d| Arc::ptr_eq(&d, ds));
        if !registered {
            return Err(EngineError::NotFound(format!("no dataset {:?}", ds.id)));
        }
        if ds.is_archived() {
            return Err(Self::archived_error(&ds.id));
        }
        if ds.stale.load(std::sync::atomic::Ordering::Acquire) {
            self.reload_into(ds, ledger).await?;
            ds.stale.store(false, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    /// Append records durably (group commit), timing the commit.
    async fn persist(&self, records: Vec<Record>) -> Result<(), StoreError> {
        let started = Instant::now();
        append_async(&self.store, records).await?;
        metrics::histogram!("dpledger_store_commit_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Persist a change to `ds` (whose write lock the caller holds). When the
    /// commit's outcome is unknown the change may be in the log, so the dataset is
    /// marked stale and reloaded before anything else touches it.
    async fn persist_change(&self, ds: &Dataset, records: Vec<Record>) -> EngineResult<()> {
        self.persist(records).await.map_err(|e| {
            if matches!(e, StoreError::OutcomeUnknown { .. }) {
                ds.mark_stale();
            }
            EngineError::store(e)
        })
    }
}

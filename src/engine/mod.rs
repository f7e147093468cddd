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
//! | `releases.rs` | publishing releases and changing release settings (budget, labels, policy) |
//! | `release_view.rs` | a release computed from a view of the ledger while steps flow |
//! | `background.rs` | a release's pass on a thread at idle priority, so requests come first |
//! | `policy.rs` | automatic releases every N steps, off the write lock |
//! | `data_dependent.rs` | seed 001's analysis over several runs, read from the ledgers and the log |
//! | `error.rs` | the domain errors ([`EngineError`]) |
//! | `idempotency.rs` | changes safe to retry (idempotency keys), and reloading a stale dataset in the background |
//! | `bounds.rs` | the PLD worst case (cached) and the bounds it gives examples and releases |
//! | `estimate.rs` | per-example PLD estimates (not a guarantee) from cached level spectra |
//! | `snapshots.rs` | snapshot policy, taking one while steps flow, pruning, loading the newest valid one |
//! | `snapshot_codec.rs` | a served dataset as snapshot bytes and back |
//! | `compact.rs` | `dpledger compact`: dropping payloads a verified snapshot stands in for |
//! | `paging.rs` | idle datasets leave memory and come back on their next request |
//! | `allocator.rs` | freed memory goes back to the operating system (glibc's mmap threshold, trim) |
//! | `archive.rs` | archived datasets' per-example answers written to, and served from, the store |
//! | `storage.rs` | what is kept where: the storage report and its gauges |
//! | `cluster/` | cluster membership: leases, serving deadline, takeover, drain, placement (`docs/cluster.md`) |
//! | `shard_names.rs` | the names of shards (`{dataset}~{start}`), below both `cluster/` and `sharding/` |
//! | `sharding/` | sharded datasets: layouts, splits, the change coordinator and the owners' side of its protocol, and the [`sharding::Peers`] it reaches other nodes through |
//! | `accountant.rs` | the stateless accountant's requests (validated) and computations, for the CLI and the HTTP API |
//!
//! Per-dataset state derived from the log (a worst-case accountant, snapshots)
//! belongs on [`Dataset`], changed under the ledger's write lock in `commands.rs`
//! and `releases.rs`, and rebuilt record by record in `recovery.rs`.

pub mod accountant;
pub mod allocator;
mod archive;
mod background;
mod book;
mod bounds;
pub mod cluster;
mod commands;
mod compact;
mod data_dependent;
mod dataset;
mod error;
mod estimate;
pub use estimate::estimate_cache;
mod idempotency;
mod paging;
mod policy;
mod queries;
mod recovery;
mod release_view;
mod releases;
mod revocation;
mod shard_names;
pub mod sharding;
mod snapshot_codec;
mod snapshots;
mod storage;

pub use archive::ArchivedAnswer;
pub use book::{PolicyRefusal, ReleaseBook};
pub use commands::DatasetSetup;
pub use compact::{compact_store, CompactOutcome};
pub use data_dependent::{check_run_ids, DataDependentRequest, MAX_RUNS};
pub use dataset::{valid_dataset_id, Archive, Dataset, PldCache};
pub use error::{BudgetRefusal, EngineError, EngineResult};
pub use paging::PagingPolicy;
pub use queries::{ExampleQuery, IdRange, PrivacyQuery};
pub use releases::ReleaseOutcome;
pub use snapshots::SnapshotPolicy;
pub use storage::{
    estimate_cache_report, export_estimate_cache, DatasetStorageReport, EstimateCacheReport,
    SnapshotReport, StorageReport, TableCacheReport,
};

use crate::ledger::{IdempotencyKey, Ledger};
use crate::store::{
    append_fenced_async, append_keyed_async, Record, RecordKind, Store, StoreError,
};
use dashmap::DashMap;
use std::sync::Arc;
use std::time::Instant;

/// Every dataset this process serves, and the store they are rebuilt from.
/// Cloning is cheap (two shared pointers): a policy release's background task
/// holds a clone to publish what it computed.
#[derive(Clone)]
pub struct Engine {
    datasets: Arc<DashMap<String, Arc<Dataset>>>,
    store: Arc<dyn Store>,
    /// Cluster mode: this node's identity, leases and coordination connection.
    cluster: Option<Arc<cluster::ClusterNode>>,
    /// Cluster mode: the coordinator of changes across shards (its peers,
    /// its policy releases in flight).
    sharding: Arc<sharding::Sharding>,
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
        if let Some(node) = &self.cluster {
            if !node.leases_valid() {
                return Err(cluster::not_owner(id));
            }
            if !self.datasets.contains_key(id) {
                if self.known_layout(id).is_some() {
                    return Err(EngineError::ShardedUnsupported(format!(
                        "dataset {id:?} is sharded, and this request is not supported on a \
                         sharded dataset (see docs/sharding.md)"
                    )));
                }
                return Err(cluster::not_owner(id));
            }
        }
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
        let ledger = self.read_ledger(&ds).await?;
        f(&ds, &ledger)
    }

    /// Read a dataset's release book (refused while it is reloading): viewers
    /// never wait for the ledger's lock.
    /// A sharded dataset's book is its first shard's (every change across
    /// shards is in every shard's log): read here when this node owns that
    /// shard (routing sends the read to its owner otherwise).
    pub fn with_book<T>(&self, id: &str, f: impl FnOnce(&ReleaseBook) -> T) -> EngineResult<T> {
        let first_shard = self.known_layout(id).map(|layout| layout.shard_dataset(0));
        let ds = self.dataset(first_shard.as_deref().unwrap_or(id))?;
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
    /// (reloading it if it may not be, or loading it if it was paged out).
    async fn locked_checks(&self, ds: &Arc<Dataset>, ledger: &mut Ledger) -> EngineResult<()> {
        let registered = self
            .datasets
            .get(&ds.id)
            .is_some_and(|d| Arc::ptr_eq(&d, ds));
        if !registered {
            if self.cluster.is_some() {
                return Err(cluster::not_owner(&ds.id));
            }
            return Err(EngineError::NotFound(format!("no dataset {:?}", ds.id)));
        }
        if ds.is_archived() {
            return Err(Self::archived_error(&ds.id));
        }
        self.catch_up(ds, ledger).await
    }

    /// Bring memory up to the log (reloading a stale dataset, loading a paged-out
    /// one); the caller holds the write lock.
    async fn catch_up(&self, ds: &Arc<Dataset>, ledger: &mut Ledger) -> EngineResult<()> {
        let registered = self
            .datasets
            .get(&ds.id)
            .is_some_and(|d| Arc::ptr_eq(&d, ds));
        if !registered {
            return Err(EngineError::NotFound(format!("no dataset {:?}", ds.id)));
        }
        ds.touch();
        if ds.stale.load(std::sync::atomic::Ordering::Acquire) {
            self.reload_into(ds, ledger).await?;
            ds.stale.store(false, std::sync::atomic::Ordering::Release);
            ds.paged_out
                .store(false, std::sync::atomic::Ordering::Release);
        }
        self.page_in(ds, ledger).await?;
        Ok(())
    }

    /// Append records of `ds` durably (group commit), timing the commit, and
    /// note them on the dataset (the caller holds its write lock and applies them
    /// next; if it cannot, it marks the dataset stale and it is reloaded).
    async fn persist(
        &self,
        ds: &Dataset,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        let kinds: Vec<(RecordKind, Vec<u8>)> = records
            .iter()
            .filter(|r| dataset::is_book_record(r.kind))
            .map(|r| (r.kind, r.payload.clone()))
            .collect();
        let seqs = match (
            &self.cluster,
            ds.epoch.load(std::sync::atomic::Ordering::Acquire),
        ) {
            (None, _) => append_keyed_async(&self.store, records, key).await?,
            // A cluster node writes only under a lease (epoch >= 1); epoch 0
            // is sent as such and refused by the database (fail closed).
            (Some(_), epoch) => append_fenced_async(&self.store, records, key, epoch).await?,
        };
        let book: Vec<(RecordKind, &[u8])> = kinds.iter().map(|(k, p)| (*k, &p[..])).collect();
        ds.note_records(&seqs, &book);
        metrics::histogram!("dpledger_store_commit_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Persist a change to `ds` (whose write lock the caller holds), with its
    /// idempotency key if it has one. When the commit's outcome is unknown the
    /// change may be in the log, so the dataset is marked stale and reloaded in
    /// the background at once (reads wait for that, writers reload first).
    async fn persist_change(
        &self,
        ds: &Dataset,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<()> {
        self.persist(ds, records, key).await.map_err(|e| {
            if matches!(e, StoreError::OutcomeUnknown { .. }) {
                self.heal(ds);
            }
            if matches!(e, StoreError::Fenced { .. }) {
                return self.lose(ds);
            }
            EngineError::store(e)
        })
    }
}

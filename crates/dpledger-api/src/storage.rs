//! What the service keeps where, as `GET /v1/admin/storage` (admin only)
//! answers it: the store's log, snapshots and archives, the process-wide
//! caches, and each dataset's memory. The server measures, the Rust client
//! reads, with one definition.

use serde::{Deserialize, Serialize};

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StorageReport {
    /// Where the store is (`sqlite:PATH` or `postgres:HOST/DB`, no secrets).
    pub store: String,
    /// Records in the log (compacted ones included).
    pub log_records: u64,
    /// Payload bytes of the log's records.
    pub log_bytes: u64,
    /// Bytes of complete snapshots.
    pub snapshot_bytes: u64,
    /// Bytes of archives (archived datasets' per-example answers).
    pub archive_bytes: u64,
    /// Bytes of memory held by every dataset's ledger (paged-out ones hold a
    /// placeholder).
    pub memory_bytes: u64,
    /// Datasets whose ledger is in memory.
    pub datasets_in_memory: u64,
    /// Datasets paged out (loaded back on their next request).
    pub datasets_paged_out: u64,
    /// The process-wide cache of sampled-Gaussian tables.
    pub table_cache: TableCacheReport,
    /// The process-wide cache of the PLD estimates' spectra and answers.
    pub estimate_cache: EstimateCacheReport,
    /// Every dataset, by id.
    pub datasets: Vec<DatasetStorageReport>,
}

/// The table cache's size against its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TableCacheReport {
    /// Tables held.
    pub tables: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// The bound (`serve --table-cache-mb`).
    pub bound_bytes: u64,
    /// Tables dropped to stay within the bound.
    pub evictions: u64,
}

/// The PLD estimates' cache (`engine/estimate.rs`) against its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EstimateCacheReport {
    /// Spectrum pairs held (per level, grid and FFT size).
    pub spectra: u64,
    /// MGF pairs held (per level and grid).
    pub mgfs: u64,
    /// Finished answers held (per level history, releases and delta).
    pub answers: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// The bound (`serve --estimate-cache-bytes`).
    pub bound_bytes: u64,
    /// Entries dropped to stay within the bound.
    pub evictions: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that computed their value.
    pub misses: u64,
}

/// One dataset's part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetStorageReport {
    /// Its id.
    pub id: String,
    /// Archived (read-only).
    pub archived: bool,
    /// Out of memory (a placeholder holds its place; see `paged_out`).
    pub paged_out: bool,
    /// Its examples.
    pub examples: u64,
    /// Steps applied.
    pub steps: u64,
    /// Bytes of memory its ledger holds now.
    pub memory_bytes: u64,
    /// `memory_bytes` per example (0 while paged out): the ledger's compact
    /// form costs a few tens of bytes per example plus 4 per `(segment, level)`
    /// entry it visited (docs/ledger-memory.md).
    pub memory_bytes_per_example: f64,
    /// The newest snapshot's bytes per example (0 without a snapshot).
    pub snapshot_bytes_per_example: f64,
    /// Seconds since it was last read or changed.
    pub idle_seconds: f64,
    /// Sequence number of its last record.
    pub last_seq: u64,
    /// Its records in the log.
    pub log_records: u64,
    /// Payload bytes of its records.
    pub log_bytes: u64,
    /// Bytes of its complete snapshots.
    pub snapshot_bytes: u64,
    /// Bytes of its archive in the store.
    pub archive_bytes: u64,
    /// Its newest complete snapshot, if any.
    pub newest_snapshot: Option<SnapshotReport>,
    /// Its records applied since the newest snapshot this process wrote or
    /// loaded (what a restart would replay).
    pub records_since_snapshot: u64,
}

/// A dataset's newest snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotReport {
    /// Catalogue id.
    pub id: u64,
    /// The record it was taken at.
    pub seq: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was written (seconds since the Unix epoch).
    pub created: u64,
    /// Seconds since it was written.
    pub age_seconds: u64,
    /// Kept by a compaction (never deleted).
    pub pinned: bool,
}

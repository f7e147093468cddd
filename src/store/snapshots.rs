//! Snapshots and compaction in the store: what is kept, and the
//! checks every backend applies.
//!
//! A snapshot is a dataset's whole state at a sequence number of the log, as
//! opaque bytes (the engine encodes them). It is stored in chunks of at most
//! [`CHUNK_BYTES`], each chunk in its own short transaction so that writing a
//! snapshot of hundreds of megabytes never holds the database's write lock for
//! long (steps keep committing between chunks). A catalogue row is written
//! first with `complete = 0` and flipped to `complete = 1` by the last
//! transaction, so a snapshot interrupted by a crash is never listed, and is
//! removed by the next writer of a snapshot of that dataset.
//!
//! Integrity: the catalogue row carries the length and SHA-256 of the bytes;
//! [`Store::read_snapshot`](super::Store::read_snapshot) recomputes both and
//! answers [`StoreError::Corrupt`] on any difference, so a damaged snapshot is
//! skipped (the engine falls back to an older one or to the log), never trusted.
//!
//! Compaction ([`Store::compact`](super::Store::compact)) is the only operation
//! that changes records already in the log, and only when an operator asks for
//! it: the payloads of one dataset's records up to a snapshot's sequence number
//! are emptied, and a row of `dpledger_compactions` records the range, the
//! snapshot it relies on (pinned: it is never deleted) and a SHA-256 over the
//! removed records' checksums. The rows themselves stay, with their sequence
//! numbers and CRC-32s, so the log keeps its contiguous numbering and an
//! auditor can still match every record to its checksum; a load skips emptied
//! rows only where a compaction covers them and reports anything else as
//! corruption.
//!
//! ```sql
//! dpledger_snapshots(id INTEGER PRIMARY KEY, dataset TEXT, seq INTEGER, created INTEGER,
//!                    bytes INTEGER, sha256 BLOB, pinned INTEGER, complete INTEGER)
//! dpledger_snapshot_chunks(snapshot INTEGER, idx INTEGER, data BLOB, PRIMARY KEY (snapshot, idx))
//! dpledger_compactions(dataset TEXT PRIMARY KEY, upto INTEGER, snapshot INTEGER,
//!                      records INTEGER, bytes INTEGER, digest BLOB, created INTEGER)
//! ```

use super::StoreError;
use sha2::{Digest, Sha256};

/// Largest chunk of a snapshot: one transaction's worth of writing.
pub const CHUNK_BYTES: usize = 8 << 20;

/// Snapshots that never completed are removed once they are this old (a
/// younger one may still be being written by another process).
pub const ABANDONED_AFTER_SECS: u64 = 3600;

/// One complete snapshot, as listed by the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    /// Catalogue id (increasing with time of writing).
    pub id: u64,
    /// The dataset whose state it holds.
    pub dataset: String,
    /// The state after every record of the dataset up to this sequence number.
    pub seq: u64,
    /// When it was written (seconds since the Unix epoch).
    pub created: u64,
    /// Size of the bytes.
    pub bytes: u64,
    /// SHA-256 of the bytes, hexadecimal.
    pub sha256: String,
    /// Pinned by a compaction: the records it replaces are gone, so it is kept.
    pub pinned: bool,
}

/// A compaction of one dataset's log, as recorded in `dpledger_compactions`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CompactionInfo {
    /// The dataset compacted.
    pub dataset: String,
    /// Every record of the dataset with a sequence number up to this one has an
    /// empty payload; its row and CRC-32 remain.
    pub upto: u64,
    /// The (pinned) snapshot that stands in for those records.
    pub snapshot: u64,
    /// Records whose payloads were emptied, over all compactions of the dataset.
    pub records: u64,
    /// Payload bytes removed, over all compactions of the dataset.
    pub bytes: u64,
}

/// Sizes for `GET /v1/admin/storage`: the whole store and each dataset's part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Records in the log (compacted ones included).
    pub records: u64,
    /// Payload bytes held by the log's records.
    pub log_bytes: u64,
    /// Bytes held by complete snapshots.
    pub snapshot_bytes: u64,
    /// Bytes held by archives of archived datasets' answers.
    pub archive_bytes: u64,
    /// Each dataset's part of the above, by id.
    pub datasets: std::collections::BTreeMap<String, DatasetStorage>,
}

/// One dataset's part of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatasetStorage {
    /// Its records in the log (compacted ones included).
    pub records: u64,
    /// Payload bytes of its records.
    pub log_bytes: u64,
    /// Bytes of its complete snapshots.
    pub snapshot_bytes: u64,
    /// Bytes of its archive.
    pub archive_bytes: u64,
}

/// What a store measures per dataset, one query per table: `(dataset, records,
/// bytes)` rows of the log, `(dataset, bytes)` rows of complete snapshots and
/// of archive blocks. Every backend runs these same statements (the casts make
/// PostgreSQL's sums BIGINT; `WHERE complete` reads its boolean and SQLite's 0/1).
pub(crate) const STORAGE_SQL: [&str; 3] = [
    "SELECT dataset, CAST(count(*) AS BIGINT), CAST(coalesce(sum(length(payload)), 0) AS BIGINT) \
     FROM dpledger_events GROUP BY dataset",
    "SELECT dataset, CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM dpledger_snapshots \
     WHERE complete GROUP BY dataset",
    "SELECT dataset, CAST(coalesce(sum(length(data)), 0) AS BIGINT) FROM dpledger_archive_blocks \
     GROUP BY dataset",
];

impl StorageStats {
    /// Totals and per-dataset parts from the rows of [`STORAGE_SQL`].
    pub(crate) fn from_rows(
        log: impl IntoIterator<Item = (String, i64, i64)>,
        snapshots: impl IntoIterator<Item = (String, i64)>,
        archives: impl IntoIterator<Item = (String, i64)>,
    ) -> Self {
        let mut stats = StorageStats::default();
        let n = |v: i64| v.max(0) as u64;
        for (dataset, records, bytes) in log {
            let d = stats.datasets.entry(dataset).or_default();
            d.records = n(records);
            d.log_bytes = n(bytes);
        }
        for (dataset, bytes) in snapshots {
            stats.datasets.entry(dataset).or_default().snapshot_bytes = n(bytes);
        }
        for (dataset, bytes) in archives {
            stats.datasets.entry(dataset).or_default().archive_bytes = n(bytes);
        }
        for d in stats.datasets.values() {
            stats.records += d.records;
            stats.log_bytes += d.log_bytes;
            stats.snapshot_bytes += d.snapshot_bytes;
            stats.archive_bytes += d.archive_bytes;
        }
        stats
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a snapshot's chunks as they are read back, in order, against its
/// catalogue row: no chunk missing, no byte beyond the recorded length, and at
/// the end the length and SHA-256. Reading streams (a reader decodes chunks as
/// they come, `Store::read_snapshot_chunks`), so nothing read is trusted until
/// [`ChunkVerifier::finish`] says so.
pub(crate) struct ChunkVerifier<'a> {
    store: &'a str,
    info: &'a SnapshotInfo,
    hasher: Sha256,
    bytes: u64,
    next: i64,
}

impl<'a> ChunkVerifier<'a> {
    pub(crate) fn new(store: &'a str, info: &'a SnapshotInfo) -> Self {
        Self {
            store,
            info,
            hasher: Sha256::new(),
            bytes: 0,
            next: 0,
        }
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            store: self.store.to_string(),
            seq: Some(self.info.seq),
            detail: format!(
                "snapshot {} of dataset {:?}: {detail}",
                self.info.id, self.info.dataset
            ),
        }
    }

    /// Chunk `idx` with `data`, to be passed on only if this answers `Ok`.
    pub(crate) fn chunk(&mut self, idx: i64, data: &[u8]) -> Result<(), StoreError> {
        if idx != self.next {
            return Err(self.corrupt(format!("chunk {} is missing", self.next)));
        }
        self.next += 1;
        self.bytes += data.len() as u64;
        if self.bytes > self.info.bytes {
            return Err(self.corrupt(format!("more than the {} bytes written", self.info.bytes)));
        }
        self.hasher.update(data);
        Ok(())
    }

    /// Whether everything read is the snapshot written.
    pub(crate) fn finish(self) -> Result<(), StoreError> {
        if self.bytes != self.info.bytes {
            return Err(self.corrupt(format!(
                "{} bytes read back, {} written",
                self.bytes, self.info.bytes
            )));
        }
        let digest = hex(&self.hasher.clone().finalize());
        if digest != self.info.sha256 {
            return Err(self.corrupt(format!(
                "SHA-256 {digest} does not match the recorded {}",
                self.info.sha256
            )));
        }
        Ok(())
    }
}

/// A digest over the CRC-32s of the records a compaction empties, in sequence
/// order, so that an auditor can check that the rows left are the ones removed.
pub(crate) struct RemovedDigest {
    hasher: Sha256,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
}

impl RemovedDigest {
    pub(crate) fn new() -> Self {
        Self {
            hasher: Sha256::new(),
            records: 0,
            bytes: 0,
        }
    }

    /// Continue from an earlier compaction of the same dataset: its digest is
    /// hashed first and its counts carried over.
    pub(crate) fn chain(&mut self, previous: &[u8], records: u64, bytes: u64) {
        self.hasher.update(previous);
        self.records += records;
        self.bytes += bytes;
    }

    pub(crate) fn add(&mut self, seq: u64, crc: u32, payload_len: u64) {
        self.hasher.update(seq.to_le_bytes());
        self.hasher.update(crc.to_le_bytes());
        self.records += 1;
        self.bytes += payload_len;
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.hasher.finalize().to_vec()
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

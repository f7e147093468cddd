//! Durable event log: the source of truth of every ledger.
//!
//! Why one file of about 520 lines: the store's contract (this note and the
//! [`Store`] trait's documented guarantees) and the record format it
//! guarantees are one statement that every backend (`sqlite.rs`, `pg/`) is
//! read against.
//!
//! The service never trusts memory alone: every state change (a dataset created, a
//! step or step part, a refresh, a release, a budget change, an archive) is appended
//! here as a [`Record`] *before* it is acknowledged, and the in-memory ledgers are
//! rebuilt at start-up by replaying [`Store::load`]. A ledger that forgot an
//! acknowledged step would under-report privacy loss, so the store is built to fail
//! loudly rather than return less than it was given:
//!
//! * **Durable on return.** [`Store::append`] returns only after the transaction is
//!   committed with a full sync (SQLite `synchronous=FULL` in WAL mode; PostgreSQL
//!   with its configured `synchronous_commit`, which must stay `on`). The records of
//!   one call are atomic: all are stored or none.
//! * **Exactly once per step part.** A unique index on
//!   `(dataset, step, coalesce(part, 0))` over [`RecordKind::StepPart`] records makes
//!   the *database* refuse a second copy, so two server processes sharing a store
//!   can never both apply a step: the loser gets [`StoreError::Duplicate`] and
//!   nothing of its call is written. A whole step (`part: None`) occupies the key of
//!   part 0, like the ledger's `Part::WHOLE` (part 0 of 1).
//! * **Contiguous sequence numbers.** Records are numbered 1, 2, 3, ... in commit
//!   order; the last number is also kept in the `dpledger_meta` table, updated in the
//!   same transaction. [`Store::load`] refuses a gap, a record out of order, or a log
//!   that ends before the recorded last number (lost tail) with
//!   [`StoreError::Corrupt`].
//! * **Checksummed rows.** Each row stores a CRC-32 of its content
//!   ([`record_checksum`]); [`Store::load`] recomputes it. SQLite files are also
//!   checked at open (header, application id, `PRAGMA quick_check`); a damaged,
//!   truncated, empty or foreign file is refused with an error naming it, never
//!   opened as an empty ledger.
//! * **Versioned schema.** `dpledger_meta.schema_version` is
//!   [`SCHEMA_VERSION`]; a store written by a newer build is refused
//!   ([`StoreError::NewerSchema`]) instead of misread.
//!
//! # Backends and URLs ([`open`])
//!
//! * `sqlite:PATH` (also `sqlite://PATH`, `sqlite:///abs/path`): one file, created
//!   with its parent directory when absent. The default is [`DEFAULT_URL`].
//! * `postgres://...` / `postgresql://...`: any libpq-style URL the `postgres` crate
//!   accepts (no TLS support in this build). Tables are created in the first schema
//!   of the `search_path` (select one with `?options=-csearch_path%3Dmyschema`).
//!
//! Both backends funnel appends through one writer thread that does **group
//! commit** (see `group.rs`): concurrent callers are queued, the writer takes
//! everything pending (up to 8192 records or 32 MiB) into one transaction, gives each
//! caller's batch its own SAVEPOINT (so one caller's duplicate fails only that
//! caller), commits once (one fsync for the whole group) and answers each caller.
//! Latency under load is one commit; throughput grows with concurrency.
//!
//! # Schema (version 1)
//!
//! ```sql
//! dpledger_meta(key TEXT PRIMARY KEY, value INTEGER)  -- 'schema_version', 'last_seq'
//! dpledger_events(seq INTEGER PRIMARY KEY, dataset TEXT, kind INTEGER,
//!                 step INTEGER NULL, part INTEGER NULL, payload BLOB, crc INTEGER)
//! UNIQUE INDEX dpledger_step_unique ON dpledger_events(dataset, step, coalesce(part, 0))
//!     WHERE kind = 2
//! ```
//!
//! (PostgreSQL uses BIGINT/SMALLINT/BYTEA.) SQLite files carry the application id
//! `0x44504c47` (`DPLG`).
//!
//! # Outcomes an application must handle
//!
//! * [`StoreError::Duplicate`]: the step part is already in the log. If the
//!   in-memory ledger does not know it, memory is behind the log (another process
//!   stored it, or an earlier append's outcome was unknown): rebuild from the log.
//! * [`StoreError::OutcomeUnknown`]: the commit itself failed (or its answer was
//!   lost), so the records may or may not be durable. Do not apply them in memory
//!   and do not acknowledge them; before accepting more steps for the dataset,
//!   rebuild its state from the log (or restart), because a record that did land
//!   will be replayed at the next start and memory must not lag behind it.
//! * [`StoreError::KeyUsed`]: the idempotency key is already stored for the
//!   dataset (an earlier try of the same change landed): answer from it.
//! * Every other error means nothing of the call was written.
//!
//! Why one file of about 520 lines of code (the rest are its unit tests): it
//! is the store's contract (the `Store` trait, its records, keys and errors
//! with the rules above) that both back ends implement; the back ends and
//! the codec have files of their own.

pub mod archive;
pub mod cluster;
/// Step records' payloads are the step protocol's wire encoding.
pub use crate::ledger::wire as codec;
mod error;
mod group;
pub mod idempotency;
mod pg;
pub mod revocation;
mod rows;
pub mod snapshots;
mod sqlite;

use std::sync::Arc;

pub use error::StoreError;
pub use pg::single_node::{hold_single_node_lock, SingleNodeLock};
pub(crate) use rows::{pipelined_load, prepare_keyed, Prepared, RawRow, RowChecker};

pub use codec::{CodecError, StepPayload};
pub use idempotency::StoredKey;
// The key a keyed change is stored with is the ledger's (the protocol's retry
// rule); the store only keeps it.
use crate::ledger::{valid_key, IdempotencyKey};
pub use snapshots::{CompactionInfo, DatasetStorage, SnapshotInfo, StorageStats, CHUNK_BYTES};

/// The store the server uses when none is configured.
pub const DEFAULT_URL: &str = "sqlite:./data/dpledger.sqlite";

/// The schema version this build writes and reads (`dpledger_meta.schema_version`).
/// Version 2 added snapshots, compactions and two indexes (see [`snapshots`]);
/// a version-1 store is upgraded when opened.
pub const SCHEMA_VERSION: u64 = 2;

/// Largest payload of one record. Far above any step the HTTP layer accepts; it
/// exists so that a runaway caller gets a clear error instead of a database limit
/// (SQLite refuses blobs near 1 GB, PostgreSQL bytea at 1 GB).
pub const MAX_PAYLOAD_BYTES: usize = 256 << 20;

/// Longest dataset name in bytes, so that the `(dataset, step, part)` key always
/// fits in a B-tree index entry (PostgreSQL refuses entries above ~2.7 kB).
pub const MAX_DATASET_BYTES: usize = 1024;

/// What a record means to the ledger. The discriminants are stored in the database
/// and must never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A dataset (training run) was created; payload: its configuration (JSON).
    DatasetCreated = 1,
    /// A step, or one part of a step; payload: [`StepPayload`] bytes. Unique per
    /// `(dataset, step, part)`.
    StepPart = 2,
    /// Thresholds were refreshed; payload: JSON.
    Refresh = 3,
    /// A DP release was published and charged; payload: the release (JSON).
    Release = 4,
    /// The release budget was set; payload: JSON.
    BudgetChange = 5,
    /// The dataset was archived; payload: JSON.
    Archived = 6,
    /// Group labels were assigned; payload: JSON.
    Labels = 7,
    /// The automatic release policy was set or removed; payload: JSON.
    ReleasePolicy = 8,
}

impl RecordKind {
    /// The kind stored as `code`, or `None` for a code this build does not know.
    pub fn from_code(code: u8) -> Option<RecordKind> {
        Some(match code {
            1 => RecordKind::DatasetCreated,
            2 => RecordKind::StepPart,
            3 => RecordKind::Refresh,
            4 => RecordKind::Release,
            5 => RecordKind::BudgetChange,
            6 => RecordKind::Archived,
            7 => RecordKind::Labels,
            8 => RecordKind::ReleasePolicy,
            _ => return None,
        })
    }

    /// The stored code (the enum discriminant).
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// One event of the log. The payload is opaque to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Dataset (training run) the event belongs to; at most [`MAX_DATASET_BYTES`]
    /// bytes and no NUL character (PostgreSQL text cannot hold one).
    pub dataset: String,
    /// What happened.
    pub kind: RecordKind,
    /// Step number, required for [`RecordKind::StepPart`]; at most `i64::MAX`
    /// (both databases store signed 64-bit integers).
    pub step: Option<u64>,
    /// Part index of a step reported in parts; `None` for a whole step.
    pub part: Option<u32>,
    /// Event content: JSON for most kinds, [`StepPayload`] bytes for steps.
    pub payload: Vec<u8>,
}

/// A record as stored, with its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Position in the log: 1, 2, 3, ... without gaps.
    pub seq: u64,
    /// The record.
    pub record: Record,
}

/// What a [`Store::load`] read, for start-up logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadStats {
    /// Records delivered to the visitor.
    pub records: u64,
    /// Bytes of payload and dataset names delivered.
    pub bytes: u64,
    /// Wall-clock seconds the load took, visitor included.
    pub seconds: f64,
}

/// A durable, append-only event log (SQLite or PostgreSQL, see [`open`]).
pub trait Store: Send + Sync {
    /// Appends `records` atomically and durably, returning their sequence numbers in
    /// order. When it returns `Ok` the records survive a crash; when it returns
    /// `Err`, none of them was stored, except for [`StoreError::OutcomeUnknown`]
    /// (see the [module documentation](self)). Blocks for about one commit; call it
    /// through [`append_async`] from async code. An empty `records` returns `Ok`
    /// with no sequence numbers and touches nothing.
    fn append(&self, records: Vec<Record>) -> Result<Vec<u64>, StoreError>;

    /// [`Store::append_keyed`] fenced by a lease epoch (cluster mode, see
    /// [`cluster`]): in the same transaction, the database checks that `epoch` is
    /// still the current lease epoch of every record's dataset, and refuses the
    /// whole call with [`StoreError::Fenced`] otherwise. Only PostgreSQL
    /// coordinates a cluster; other backends refuse (fail closed).
    fn append_fenced(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
        epoch: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let _ = (records, key, epoch);
        Err(StoreError::Backend {
            store: self.describe(),
            detail: "this store cannot fence writes by lease epoch (cluster mode needs PostgreSQL)"
                .into(),
        })
    }

    /// Like [`Store::append`], storing `key` with the records in the same
    /// transaction ([`idempotency`]): a key this dataset already used is
    /// [`StoreError::KeyUsed`] and nothing of the call is written. `None`: a
    /// plain append.
    fn append_keyed(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> Result<Vec<u64>, StoreError>;

    /// The change stored with `key` for `dataset`, if any (read beside the
    /// writer, from what is committed).
    fn find_key(&self, dataset: &str, key: &str) -> Result<Option<StoredKey>, StoreError>;

    /// Streams every record to `visit` in sequence order, verifying checksums and
    /// contiguity as it goes. Records are read on a helper thread while `visit`
    /// runs, from one consistent snapshot (appends may continue meanwhile). If it
    /// returns `Err` (corruption, or an error returned by `visit`), whatever the
    /// visitor built from the records seen so far must be discarded.
    fn load(
        &self,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError> {
        self.load_after(0, visit)
    }

    /// The store's location for logs and error messages (`sqlite:/abs/path` or the
    /// PostgreSQL URL with any password replaced by `***`).
    fn describe(&self) -> String;

    /// Like [`Store::load`], for the records after sequence number `after` only
    /// (recovery from snapshots reads the log's tail). Contiguity is checked from
    /// `after + 1` to the recorded end. Rows whose payloads a compaction emptied
    /// are skipped (they are covered by a pinned snapshot); any other damage is
    /// [`StoreError::Corrupt`].
    fn load_after(
        &self,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError>;

    /// The records of one dataset after sequence number `after`, in order
    /// (reloading one dataset reads only its own tail, through an index).
    /// Checksums are verified; contiguity is not (other datasets' records lie in
    /// between). A compacted record in the range is [`StoreError::Corrupt`]:
    /// callers start at or after the dataset's compaction.
    fn load_dataset(
        &self,
        dataset: &str,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError>;

    /// Every dataset with the sequence number of its creation record, in log order.
    fn dataset_starts(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Stores a snapshot of `dataset`'s state after record `seq` (see
    /// [`snapshots`]). Written in chunks, each in its own transaction; listed only
    /// once complete. Also removes abandoned (never completed) snapshots.
    fn write_snapshot(
        &self,
        dataset: &str,
        seq: u64,
        bytes: &[u8],
    ) -> Result<SnapshotInfo, StoreError>;

    /// Every complete snapshot, by dataset, newest (highest `seq`, then id) first.
    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError>;

    /// A snapshot's bytes, chunk by chunk in order, to `sink` as they are read
    /// (a loader decodes while the store reads and hashes). Answers
    /// [`StoreError::Corrupt`] when a chunk is missing or the length or SHA-256
    /// differ from the catalogue's; only an `Ok` makes what `sink` received
    /// trustworthy. An error from `sink` stops the read and is returned.
    fn read_snapshot_chunks(
        &self,
        info: &SnapshotInfo,
        sink: &mut (dyn FnMut(&[u8]) -> Result<(), StoreError> + Send),
    ) -> Result<(), StoreError>;

    /// A snapshot's bytes, verified against its length and SHA-256
    /// ([`StoreError::Corrupt`] if they differ).
    fn read_snapshot(&self, info: &SnapshotInfo) -> Result<Vec<u8>, StoreError> {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(usize::try_from(info.bytes).unwrap_or(usize::MAX))
            .map_err(|_| StoreError::Backend {
                store: self.describe(),
                detail: format!("cannot allocate {} bytes for a snapshot", info.bytes),
            })?;
        self.read_snapshot_chunks(info, &mut |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(bytes)
    }

    /// Deletes a snapshot; a pinned one (a compaction relies on it) is refused.
    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError>;

    /// Every compaction done, by dataset.
    fn compactions(&self) -> Result<Vec<CompactionInfo>, StoreError>;

    /// Empties the payloads of `snapshot.dataset`'s records up to `snapshot.seq`
    /// and pins the snapshot, in one transaction (see [`snapshots`]). Returns the
    /// dataset's compaction record.
    fn compact(&self, snapshot: &SnapshotInfo) -> Result<CompactionInfo, StoreError>;

    /// Sizes of the log and the snapshots.
    fn storage(&self) -> Result<StorageStats, StoreError>;

    /// Store blocks of an archived dataset's per-example answers, as they are
    /// after record `seq` (`store::archive`); replaces blocks of the same index.
    fn put_archive_blocks(
        &self,
        dataset: &str,
        seq: u64,
        blocks: &[(u64, Vec<u8>)],
    ) -> Result<(), StoreError>;

    /// Mark the archive of `dataset` at `seq` complete with `blocks` blocks,
    /// deleting blocks of any other `seq`; one transaction.
    fn complete_archive(&self, dataset: &str, seq: u64, blocks: u64) -> Result<(), StoreError>;

    /// The complete archive of `dataset`, if any: `(seq, blocks)`.
    fn archive(&self, dataset: &str) -> Result<Option<(u64, u64)>, StoreError>;

    /// One block of the archive of `dataset` (checked against its CRC-32) with
    /// the `seq` it was written at; `None` if there is no such block.
    /// Add the token id `jti` to the revoked tokens, durably (revoking twice
    /// is no error). `revoked_at`: seconds since the epoch.
    fn revoke_token(&self, jti: &str, revoked_at: u64) -> Result<(), StoreError>;

    /// Every revoked token id.
    fn revoked_tokens(&self) -> Result<Vec<String>, StoreError>;

    fn read_archive_block(
        &self,
        dataset: &str,
        block: u64,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError>;
}

/// Opens (or creates) the store at `url`; see the [module documentation](self) for
/// the URL forms. Runs the backend's integrity checks and starts its writer
/// thread. Blocking; call it before serving or through `spawn_blocking`.
pub fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let trimmed = url.trim();
    if let Some(path) = trimmed.strip_prefix("sqlite:") {
        let path = match path.strip_prefix("//") {
            Some(rest) => rest,
            None => path,
        };
        if path.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: redact_url(url),
                reason: "no file path after \"sqlite:\" (example: sqlite:./data/dpledger.sqlite)"
                    .into(),
            });
        }
        if path == ":memory:" || path.starts_with("file:") {
            return Err(StoreError::InvalidUrl {
                url: redact_url(url),
                reason: "only a plain file path is supported: an in-memory store is not durable"
                    .into(),
            });
        }
        let store = sqlite::SqliteStore::open(std::path::Path::new(path))?;
        return Ok(Arc::new(store));
    }
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let store = pg::PgStore::open(trimmed)?;
        return Ok(Arc::new(store));
    }
    Err(StoreError::InvalidUrl {
        url: redact_url(url),
        reason: "expected sqlite:PATH, postgres://... or postgresql://...".into(),
    })
}

/// [`Store::append`] for async code: runs the blocking call on tokio's blocking
/// pool so that a commit (an fsync) never stalls the runtime's worker threads.
///
/// If the calling future is dropped, the append still runs to completion: its
/// records may be stored although the caller never saw the sequence numbers.
pub async fn append_async(
    store: &Arc<dyn Store>,
    records: Vec<Record>,
) -> Result<Vec<u64>, StoreError> {
    append_keyed_async(store, records, None).await
}

/// [`append_async`] with the change's idempotency key ([`Store::append_keyed`]).
pub async fn append_keyed_async(
    store: &Arc<dyn Store>,
    records: Vec<Record>,
    key: Option<IdempotencyKey>,
) -> Result<Vec<u64>, StoreError> {
    let worker = Arc::clone(store);
    match tokio::task::spawn_blocking(move || worker.append_keyed(records, key)).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::OutcomeUnknown {
            store: store.describe(),
            detail: format!("the blocking append task did not complete: {join}"),
        }),
    }
}

/// [`Store::append_fenced`] for async code (see [`append_async`]).
pub async fn append_fenced_async(
    store: &Arc<dyn Store>,
    records: Vec<Record>,
    key: Option<IdempotencyKey>,
    epoch: u64,
) -> Result<Vec<u64>, StoreError> {
    let worker = Arc::clone(store);
    match tokio::task::spawn_blocking(move || worker.append_fenced(records, key, epoch)).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::OutcomeUnknown {
            store: store.describe(),
            detail: format!("the blocking append task did not complete: {join}"),
        }),
    }
}

/// CRC-32 (IEEE, `crc32fast`) of a record's content, as stored in each row's `crc`
/// column, so offline tools can verify a store too. The input is unambiguous:
/// `len(dataset)` u64 LE, dataset bytes, kind code u8, step as `0` or `1` + u64 LE,
/// part as `0` or `1` + u32 LE, `len(payload)` u64 LE, payload bytes. The sequence
/// number is not included: gaps and reordering are detected by the contiguity check.
pub fn record_checksum(record: &Record) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&(record.dataset.len() as u64).to_le_bytes());
    h.update(record.dataset.as_bytes());
    h.update(&[record.kind.code()]);
    match record.step {
        Some(step) => {
            h.update(&[1]);
            h.update(&step.to_le_bytes());
        }
        None => h.update(&[0]),
    }
    match record.part {
        Some(part) => {
            h.update(&[1]);
            h.update(&part.to_le_bytes());
        }
        None => h.update(&[0]),
    }
    h.update(&(record.payload.len() as u64).to_le_bytes());
    h.update(&record.payload);
    h.finalize()
}

/// `url` with the password of `user:password@` and any `password=` query
/// parameter replaced by `***`, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let authority_start = scheme_end + 3;
        let rest = &out[authority_start..];
        let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_len];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            if let Some(colon) = userinfo.find(':') {
                let start = authority_start + colon + 1;
                let end = authority_start + at;
                out.replace_range(start..end, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let redacted: Vec<String> = query
            .split('&')
            .map(|pair| {
                let key = pair.split('=').next().unwrap_or("");
                if key.eq_ignore_ascii_case("password") {
                    format!("{key}=***")
                } else {
                    pair.to_string()
                }
            })
            .collect();
        out = format!("{head}{}", redacted.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_passwords_only() {
        assert_eq!(
            redact_url("postgres://alice:s3cr%40t@db.example:5432/ledger?sslmode=disable"),
            "postgres://alice:***@db.example:5432/ledger?sslmode=disable"
        );
        assert_eq!(
            redact_url("postgresql://bob@host/db?password=hunter2&options=-csearch_path%3Dx"),
            "postgresql://bob@host/db?password=***&options=-csearch_path%3Dx"
        );
        assert_eq!(redact_url("postgres://u:p:q@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact_url("sqlite:./data/x.sqlite"),
            "sqlite:./data/x.sqlite"
        );
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn bad_urls_are_refused_without_leaking_passwords() {
        for url in ["mysql://u:pw@h/db", "sqlite:", "sqlite::memory:", ""] {
            let err = open(url).err().expect("refused");
            assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err}");
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }

    #[test]
    fn validation_names_the_record() {
        let ok = Record {
            dataset: "d".into(),
            kind: RecordKind::Refresh,
            step: None,
            part: None,
            payload: vec![],
        };
        let cases = [
            Record {
                kind: RecordKind::StepPart,
                ..ok.clone()
            },
            Record {
                step: Some(u64::MAX),
                ..ok.clone()
            },
            Record {
                dataset: "a\0b".into(),
                ..ok.clone()
            },
            Record {
                dataset: "x".repeat(MAX_DATASET_BYTES + 1),
                ..ok.clone()
            },
        ];
        for bad in cases {
            let err = rows::prepare(vec![ok.clone(), bad]).err().expect("refused");
            assert!(
                matches!(err, StoreError::InvalidRecord { index: 1, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn checksum_depends_on_every_field() {
        let base = Record {
            dataset: "ds".into(),
            kind: RecordKind::StepPart,
            step: Some(1),
            part: Some(0),
            payload: vec![1, 2, 3],
        };
        let c = record_checksum(&base);
        let variants = [
            Record {
                dataset: "dt".into(),
                ..base.clone()
            },
            Record {
                kind: RecordKind::Refresh,
                ..base.clone()
            },
            Record {
                step: Some(2),
                ..base.clone()
            },
            Record {
                step: None,
                ..base.clone()
            },
            Record {
                part: None,
                ..base.clone()
            },
            Record {
                payload: vec![1, 2, 4],
                ..base.clone()
            },
        ];
        for v in variants {
            assert_ne!(record_checksum(&v), c, "{v:?}");
        }
    }

    #[test]
    fn row_checker_reports_gaps_and_lost_tails() {
        let row = |seq: i64| {
            let record = Record {
                dataset: "d".into(),
                kind: RecordKind::Release,
                step: None,
                part: None,
                payload: b"{}".to_vec(),
            };
            RawRow {
                seq,
                crc: i64::from(record_checksum(&record)),
                dataset: Ok(record.dataset),
                kind: 4,
                step: None,
                part: None,
                payload: record.payload,
            }
        };
        let mut c = RowChecker::new("s".into());
        c.check(row(1)).unwrap();
        let err = c.check(row(3)).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { seq: Some(3), .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("records 2..=2 are missing"),
            "{err}"
        );
        c.check(row(2)).unwrap();
        c.finish(2).unwrap();
        let err = c.finish(5).unwrap_err();
        assert!(err.to_string().contains("3..=5 are missing"), "{err}");
        let mut bad = row(3);
        bad.kind = 9;
        assert!(c
            .check(bad)
            .unwrap_err()
            .to_string()
            .contains("unknown record kind 9"));
    }
}

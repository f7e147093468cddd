//! SQLite backend: one file in WAL mode with `synchronous=FULL`, written by the
//! group-commit thread, read by a fresh connection per load.
//!
//! Why these settings: WAL lets a load (start-up, or an operator's copy) read a
//! consistent snapshot while appends continue, and a commit is one sequential WAL
//! write plus one fsync. `synchronous=FULL` syncs the WAL at every commit, so a
//! committed group survives power loss (`NORMAL` would not in WAL mode).
//!
//! Opening is defensive (`open.rs`): an empty ledger is the worst possible
//! misreading of a damaged file.

use std::path::{Path, PathBuf};

use rusqlite::types::ValueRef;
use rusqlite::{ffi, Connection, ErrorCode, TransactionBehavior};

use super::group::{Backend, BatchResult, GroupWriter};
use super::{
    pipelined_load, CompactionInfo, IdempotencyKey, LoadStats, Prepared, RawRow, Record,
    RowChecker, SnapshotInfo, StorageStats, Store, StoreError, StoredKey, StoredRecord,
};

mod archive;
mod open;
mod snapshots;

pub(crate) use open::check_versions;
use open::{open_connection, open_reader};

const INSERT_SQL: &str =
    "INSERT INTO dpledger_events (seq, dataset, kind, step, part, payload, crc) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const INSERT_KEY_SQL: &str =
    "INSERT INTO dpledger_idempotency (dataset, key, seq, request, answer) \
     VALUES (?1, ?2, ?3, ?4, ?5)";
const SELECT_KEY_SQL: &str =
    "SELECT seq, request, answer FROM dpledger_idempotency WHERE dataset = ?1 AND key = ?2";
const SELECT_LAST_SEQ: &str = "SELECT value FROM dpledger_meta WHERE key = 'last_seq'";
const SELECT_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE seq > ?1 ORDER BY seq";
const SELECT_DATASET_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE dataset = ?1 AND seq > ?2 ORDER BY seq";

/// A SQLite event log; see the [module documentation](self).
pub(crate) struct SqliteStore {
    path: PathBuf,
    name: String,
    writer: GroupWriter,
}

impl SqliteStore {
    /// Opens the store at `path`, creating it (and its directory) when absent.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let name = format!("sqlite:{}", path.display());
        let init_path = path.clone();
        let init_name = name.clone();
        let writer = GroupWriter::spawn(name.clone(), move || {
            SqliteBackend::open(&init_path, &init_name)
        })?;
        Ok(SqliteStore { path, name, writer })
    }
}

impl Store for SqliteStore {
    fn append(&self, records: Vec<Record>) -> Result<Vec<u64>, StoreError> {
        self.writer.append(records, None)
    }

    fn append_keyed(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> Result<Vec<u64>, StoreError> {
        self.writer.append(records, key)
    }

    fn revoke_token(&self, jti: &str, revoked_at: u64) -> Result<(), StoreError> {
        let store = self.name.as_str();
        let mut conn = open_connection(&self.path, store)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| db_error(store, "cannot revoke a token", &e))?;
        tx.execute(
            crate::store::revocation::INSERT_SQL_SQLITE,
            rusqlite::params![jti, i64::try_from(revoked_at).unwrap_or(i64::MAX)],
        )
        .map_err(|e| db_error(store, "cannot revoke a token", &e))?;
        tx.commit()
            .map_err(|e| db_error(store, "cannot revoke a token", &e))
    }

    fn revoked_tokens(&self) -> Result<Vec<String>, StoreError> {
        let store = self.name.as_str();
        let conn = open_reader(&self.path, store)?;
        let read = |e: rusqlite::Error| db_error(store, "cannot read the revoked tokens", &e);
        let mut statement = conn
            .prepare(crate::store::revocation::SELECT_SQL)
            .map_err(read)?;
        let rows = statement
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(read)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(read)
    }

    fn find_key(&self, dataset: &str, key: &str) -> Result<Option<StoredKey>, StoreError> {
        let store = self.name.as_str();
        let conn = open_reader(&self.path, store)?;
        let found = conn.query_row(SELECT_KEY_SQL, rusqlite::params![dataset, key], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, Vec<u8>>(2)?,
            ))
        });
        match found {
            Ok((seq, request, answer)) => Ok(Some(StoredKey {
                seq: u64::try_from(seq).unwrap_or(0),
                request,
                answer,
            })),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
            Err(e) => Err(db_error(store, "cannot read dpledger_idempotency", &e)),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn load_after(
        &self,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError> {
        let path = self.path.as_path();
        let name = self.name.as_str();
        pipelined_load(name, |sink| read_rows(path, name, after, sink), visit)
    }

    fn load_dataset(
        &self,
        dataset: &str,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError> {
        let path = self.path.as_path();
        let name = self.name.as_str();
        pipelined_load(
            name,
            |sink| snapshots::read_dataset_rows(path, name, dataset, after, sink),
            visit,
        )
    }

    fn dataset_starts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        snapshots::dataset_starts(&self.path, &self.name)
    }

    fn write_snapshot(
        &self,
        dataset: &str,
        seq: u64,
        bytes: &[u8],
    ) -> Result<SnapshotInfo, StoreError> {
        snapshots::write_snapshot(&self.path, &self.name, dataset, seq, bytes)
    }

    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        snapshots::list(&self.path, &self.name)
    }

    fn read_snapshot_chunks(
        &self,
        info: &SnapshotInfo,
        sink: &mut (dyn FnMut(&[u8]) -> Result<(), StoreError> + Send),
    ) -> Result<(), StoreError> {
        snapshots::read_snapshot(&self.path, &self.name, info, sink)
    }

    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        snapshots::delete_snapshot(&self.path, &self.name, id)
    }

    fn compactions(&self) -> Result<Vec<CompactionInfo>, StoreError> {
        snapshots::compactions(&self.path, &self.name)
    }

    fn compact(&self, snapshot: &SnapshotInfo) -> Result<CompactionInfo, StoreError> {
        snapshots::compact(&self.path, &self.name, snapshot)
    }

    fn storage(&self) -> Result<StorageStats, StoreError> {
        snapshots::storage(&self.path, &self.name)
    }

    fn put_archive_blocks(
        &self,
        dataset: &str,
        seq: u64,
        blocks: &[(u64, Vec<u8>)],
    ) -> Result<(), StoreError> {
        archive::put_blocks(&self.path, &self.name, dataset, seq, blocks)
    }

    fn complete_archive(&self, dataset: &str, seq: u64, blocks: u64) -> Result<(), StoreError> {
        archive::complete(&self.path, &self.name, dataset, seq, blocks)
    }

    fn archive(&self, dataset: &str) -> Result<Option<(u64, u64)>, StoreError> {
        archive::info(&self.path, &self.name, dataset)
    }

    fn read_archive_block(
        &self,
        dataset: &str,
        block: u64,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        archive::read_block(&self.path, &self.name, dataset, block)
    }
}

/// Maps a SQLite error, classifying corruption as such.
pub(super) fn db_error(store: &str, context: &str, e: &rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => StoreError::Corrupt {
            store: store.to_string(),
            seq: None,
            detail: format!("{context}: {e}"),
        },
        _ => StoreError::Backend {
            store: store.to_string(),
            detail: format!("{context}: {e}"),
        },
    }
}

struct SqliteBackend {
    conn: Connection,
    store: String,
}

impl SqliteBackend {
    fn open(path: &Path, store: &str) -> Result<SqliteBackend, StoreError> {
        let conn = open::open_writer(path, store)?;
        tracing::info!(store, "opened the event log");
        Ok(SqliteBackend {
            conn,
            store: store.to_string(),
        })
    }
}

/// Inserts one caller's batch (inside its savepoint) with consecutive numbers from
/// `first_seq`. A unique-index violation is that caller's [`StoreError::Duplicate`].
fn insert_batch(
    conn: &Connection,
    store: &str,
    batch: &[Prepared],
    first_seq: i64,
) -> Result<Vec<u64>, StoreError> {
    let mut stmt = conn
        .prepare_cached(INSERT_SQL)
        .map_err(|e| db_error(store, "cannot prepare the insert", &e))?;
    let mut seqs = Vec::with_capacity(batch.len());
    for (i, p) in batch.iter().enumerate() {
        let seq = first_seq + i as i64;
        let r = &p.record;
        let result = stmt.execute(rusqlite::params![
            seq,
            r.dataset,
            i64::from(r.kind.code()),
            p.step_i64(),
            p.part_i64(),
            r.payload,
            i64::from(p.crc),
        ]);
        if let Err(e) = result {
            let extended = e.sqlite_error().map(|s| s.extended_code);
            return Err(match extended {
                Some(ffi::SQLITE_CONSTRAINT_UNIQUE) => p.duplicate(),
                Some(ffi::SQLITE_CONSTRAINT_PRIMARYKEY) => StoreError::Corrupt {
                    store: store.to_string(),
                    seq: Some(seq as u64),
                    detail: "seq is already used although dpledger_meta.last_seq says the log \
                             ends before it"
                        .into(),
                },
                _ => db_error(store, &format!("insert of seq {seq} failed"), &e),
            });
        }
        seqs.push(seq as u64);
        if let Some(key) = &p.key {
            let stored = conn.prepare_cached(INSERT_KEY_SQL).and_then(|mut k| {
                k.execute(rusqlite::params![
                    r.dataset,
                    key.key,
                    seq,
                    key.request,
                    key.answer
                ])
            });
            if let Err(e) = stored {
                let extended = e.sqlite_error().map(|s| s.extended_code);
                return Err(match extended {
                    Some(ffi::SQLITE_CONSTRAINT_PRIMARYKEY | ffi::SQLITE_CONSTRAINT_UNIQUE) => {
                        p.key_used()
                    }
                    _ => db_error(store, "insert of an idempotency key failed", &e),
                });
            }
        }
    }
    Ok(seqs)
}

impl Backend for SqliteBackend {
    fn commit_group(&mut self, batches: &[&[Prepared]]) -> Result<Vec<BatchResult>, StoreError> {
        let store = self.store.as_str();
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| db_error(store, "cannot begin the write transaction", &e))?;
        let last: i64 = tx
            .query_row(SELECT_LAST_SEQ, [], |r| r.get(0))
            .map_err(|e| db_error(store, "cannot read dpledger_meta.last_seq", &e))?;
        let total: usize = batches.iter().map(|b| b.len()).sum();
        if last < 0 || last.checked_add(total as i64 + 1).is_none() {
            return Err(StoreError::Corrupt {
                store: store.to_string(),
                seq: None,
                detail: format!("dpledger_meta.last_seq is {last}"),
            });
        }
        let mut next = last + 1;
        let mut results = Vec::with_capacity(batches.len());
        for batch in batches {
            let sp = tx
                .savepoint()
                .map_err(|e| db_error(store, "cannot open a savepoint", &e))?;
            match insert_batch(&sp, store, batch, next) {
                Ok(seqs) => {
                    sp.commit()
                        .map_err(|e| db_error(store, "cannot release a savepoint", &e))?;
                    next += seqs.len() as i64;
                    results.push(Ok(seqs));
                }
                Err(e) => {
                    // Dropping the savepoint rolls this batch back and keeps the others.
                    drop(sp);
                    results.push(Err(e));
                }
            }
        }
        if next - 1 != last {
            tx.execute(
                "UPDATE dpledger_meta SET value = ?1 WHERE key = 'last_seq'",
                [next - 1],
            )
            .map_err(|e| db_error(store, "cannot update dpledger_meta.last_seq", &e))?;
        }
        tx.commit().map_err(|e| StoreError::OutcomeUnknown {
            store: store.to_string(),
            detail: format!("commit failed: {e}"),
        })?;
        Ok(results)
    }
}

/// Reads and verifies every row for [`Store::load`] on its own connection, inside
/// one read transaction (one snapshot of the WAL).
fn read_rows(
    path: &Path,
    store: &str,
    after: u64,
    sink: &mut dyn FnMut(StoredRecord) -> bool,
) -> Result<(), StoreError> {
    let conn = open_reader(path, store)?;
    conn.execute_batch("BEGIN")
        .map_err(|e| db_error(store, "cannot begin the read transaction", &e))?;
    let last: i64 = conn
        .query_row(SELECT_LAST_SEQ, [], |r| r.get(0))
        .map_err(|e| db_error(store, "cannot read dpledger_meta.last_seq", &e))?;
    let compacted = snapshots::compacted_upto(&conn, store)?;
    let mut checker = RowChecker::resuming(store.to_string(), after, compacted);
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    {
        let mut stmt = conn
            .prepare(SELECT_ROWS)
            .map_err(|e| db_error(store, "cannot read dpledger_events", &e))?;
        let mut rows = stmt
            .query([after])
            .map_err(|e| db_error(store, "cannot read dpledger_events", &e))?;
        loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) => {
                    let context = format!(
                        "reading dpledger_events after seq {} failed",
                        checker.last_seq()
                    );
                    return Err(db_error(store, &context, &e));
                }
            };
            let raw = raw_row(row, checker.last_seq() + 1, store)?;
            let Some(record) = checker.check(raw)? else {
                continue;
            };
            if !sink(record) {
                return Ok(());
            }
        }
    }
    checker.finish(last)?;
    conn.execute_batch("COMMIT")
        .map_err(|e| db_error(store, "cannot end the read transaction", &e))?;
    Ok(())
}

/// Extracts a row's columns without conversions, so wrong types are reported as
/// corruption of that row.
pub(super) fn raw_row(
    row: &rusqlite::Row<'_>,
    expected_seq: u64,
    store: &str,
) -> Result<RawRow, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        store: store.to_string(),
        seq: Some(expected_seq),
        detail,
    };
    let value = |i: usize| {
        row.get_ref(i)
            .map_err(|e| corrupt(format!("column {i} is unreadable: {e}")))
    };
    let int = |i: usize, name: &str| -> Result<i64, StoreError> {
        match value(i)? {
            ValueRef::Integer(v) => Ok(v),
            other => Err(corrupt(format!(
                "column {name} holds {:?}, not an integer",
                other.data_type()
            ))),
        }
    };
    let opt_int = |i: usize, name: &str| -> Result<Option<i64>, StoreError> {
        match value(i)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(v) => Ok(Some(v)),
            other => Err(corrupt(format!(
                "column {name} holds {:?}, not an integer",
                other.data_type()
            ))),
        }
    };
    let seq = int(0, "seq")?;
    let dataset = match value(1)? {
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| format!("invalid UTF-8: {e}")),
        other => Err(format!("holds {:?}, not text", other.data_type())),
    };
    let kind = int(2, "kind")?;
    let step = opt_int(3, "step")?;
    let part = opt_int(4, "part")?;
    let payload = match value(5)? {
        ValueRef::Blob(bytes) => bytes.to_vec(),
        other => {
            return Err(corrupt(format!(
                "column payload holds {:?}, not a blob",
                other.data_type()
            )))
        }
    };
    let crc = int(6, "crc")?;
    Ok(RawRow {
        seq,
        dataset,
        kind,
        step,
        part,
        payload,
        crc,
    })
}

//! SQLite side of snapshots and compaction (layout and rules in
//! `store::snapshots`): each operation on a connection of its own, beside the
//! group-commit writer, waiting for its lock like any other writer.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use sha2::{Digest, Sha256};

use super::{db_error, open_connection, open_reader, raw_row};
use crate::store::snapshots::{
    hex, now_secs, ChunkVerifier, RemovedDigest, ABANDONED_AFTER_SECS, CHUNK_BYTES, STORAGE_SQL,
};
use crate::store::{
    CompactionInfo, RowChecker, SnapshotInfo, StorageStats, StoreError, StoredRecord,
};

const SELECT_SNAPSHOTS: &str = "SELECT id, dataset, seq, created, bytes, sha256, pinned \
     FROM dpledger_snapshots WHERE complete = 1 ORDER BY dataset, seq DESC, id DESC";

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Per dataset, the last sequence number a compaction emptied.
pub(super) fn compacted_upto(
    conn: &Connection,
    store: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    let err = |e: rusqlite::Error| db_error(store, "cannot read dpledger_compactions", &e);
    let mut stmt = conn
        .prepare("SELECT dataset, upto FROM dpledger_compactions")
        .map_err(err)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(err)?;
    rows.map(|r| r.map(|(d, u)| (d, u64::try_from(u).unwrap_or(0))))
        .collect::<Result<_, _>>()
        .map_err(err)
}

/// One dataset's records after `after`, checksums verified, through the
/// `(dataset, seq)` index.
pub(super) fn read_dataset_rows(
    path: &Path,
    store: &str,
    dataset: &str,
    after: u64,
    sink: &mut dyn FnMut(StoredRecord) -> bool,
) -> Result<(), StoreError> {
    let conn = open_reader(path, store)?;
    conn.execute_batch("BEGIN")
        .map_err(|e| db_error(store, "cannot begin the read transaction", &e))?;
    let compacted = compacted_upto(&conn, store)?;
    let mut checker = RowChecker::resuming(store.to_string(), after, compacted);
    {
        let err = |e: rusqlite::Error| db_error(store, "cannot read dpledger_events", &e);
        let mut stmt = conn.prepare(super::SELECT_DATASET_ROWS).map_err(err)?;
        let mut rows = stmt.query(params![dataset, to_i64(after)]).map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let raw = raw_row(row, checker.last_seq() + 1, store)?;
            if !sink(checker.check_unordered(raw)?) {
                return Ok(());
            }
        }
    }
    conn.execute_batch("COMMIT")
        .map_err(|e| db_error(store, "cannot end the read transaction", &e))
}

pub(super) fn dataset_starts(path: &Path, store: &str) -> Result<Vec<(String, u64)>, StoreError> {
    let conn = open_reader(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot list the datasets", &e);
    let mut stmt = conn
        .prepare("SELECT dataset, seq FROM dpledger_events WHERE kind = 1 ORDER BY seq")
        .map_err(err)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(err)?;
    rows.map(|r| r.map(|(d, s)| (d, u64::try_from(s).unwrap_or(0))))
        .collect::<Result<_, _>>()
        .map_err(err)
}

fn info_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotInfo> {
    Ok(SnapshotInfo {
        id: row.get::<_, i64>(0)? as u64,
        dataset: row.get(1)?,
        seq: row.get::<_, i64>(2)? as u64,
        created: row.get::<_, i64>(3)? as u64,
        bytes: row.get::<_, i64>(4)? as u64,
        sha256: row.get(5)?,
        pinned: row.get::<_, i64>(6)? != 0,
    })
}

pub(super) fn list(path: &Path, store: &str) -> Result<Vec<SnapshotInfo>, StoreError> {
    let conn = open_reader(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot list the snapshots", &e);
    let mut stmt = conn.prepare(SELECT_SNAPSHOTS).map_err(err)?;
    let rows = stmt.query_map([], info_of).map_err(err)?;
    rows.collect::<Result<_, _>>().map_err(err)
}

/// Runs `f` in an immediate (write-locking) transaction and commits.
fn write_tx<T>(
    conn: &mut Connection,
    store: &str,
    context: &str,
    f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| db_error(store, context, &e))?;
    let value = f(&tx).map_err(|e| db_error(store, context, &e))?;
    tx.commit().map_err(|e| db_error(store, context, &e))?;
    Ok(value)
}

pub(super) fn write_snapshot(
    path: &Path,
    store: &str,
    dataset: &str,
    seq: u64,
    bytes: &[u8],
) -> Result<SnapshotInfo, StoreError> {
    let mut conn = open_connection(path, store)?;
    // A snapshot lost in a crash costs nothing (the log has it all), so its
    // chunks need no fsync each; the last transaction syncs (FULL) and, the WAL
    // being sequential, makes every earlier chunk durable with it.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| db_error(store, "cannot set synchronous", &e))?;
    let sha256 = hex(&Sha256::digest(bytes));
    let created = now_secs();
    let id = write_tx(&mut conn, store, "cannot start a snapshot", |tx| {
        abandon_old(tx, created)?;
        tx.execute(
            "INSERT INTO dpledger_snapshots (dataset, seq, created, bytes, sha256) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                dataset,
                to_i64(seq),
                to_i64(created),
                bytes.len() as i64,
                sha256
            ],
        )?;
        Ok(tx.last_insert_rowid())
    })?;
    for (idx, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        // Written in place through incremental blob I/O: binding the chunk
        // would make SQLite copy it into fresh memory first (engine::allocator).
        write_tx(&mut conn, store, "cannot write a snapshot chunk", |tx| {
            tx.execute(
                "INSERT INTO dpledger_snapshot_chunks (snapshot, idx, data) \
                 VALUES (?1, ?2, zeroblob(?3))",
                params![id, idx as i64, chunk.len() as i64],
            )?;
            let rowid = tx.last_insert_rowid();
            let mut blob = tx.blob_open(
                rusqlite::DatabaseName::Main,
                "dpledger_snapshot_chunks",
                "data",
                rowid,
                false,
            )?;
            blob.write_at(chunk, 0)
        })?;
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| db_error(store, "cannot set synchronous", &e))?;
    write_tx(&mut conn, store, "cannot complete a snapshot", |tx| {
        tx.execute(
            "UPDATE dpledger_snapshots SET complete = 1 WHERE id = ?1",
            [id],
        )
    })?;
    Ok(SnapshotInfo {
        id: id as u64,
        dataset: dataset.to_string(),
        seq,
        created,
        bytes: bytes.len() as u64,
        sha256,
        pinned: false,
    })
}

/// Remove snapshots that never completed and are old enough to be abandoned.
fn abandon_old(tx: &rusqlite::Transaction<'_>, now: u64) -> rusqlite::Result<()> {
    let cutoff = to_i64(now.saturating_sub(ABANDONED_AFTER_SECS));
    tx.execute(
        "DELETE FROM dpledger_snapshot_chunks WHERE snapshot IN \
         (SELECT id FROM dpledger_snapshots WHERE complete = 0 AND created < ?1)",
        [cutoff],
    )?;
    tx.execute(
        "DELETE FROM dpledger_snapshots WHERE complete = 0 AND created < ?1",
        [cutoff],
    )?;
    Ok(())
}

pub(super) fn read_snapshot(
    path: &Path,
    store: &str,
    info: &SnapshotInfo,
    sink: &mut (dyn FnMut(&[u8]) -> Result<(), StoreError> + Send),
) -> Result<(), StoreError> {
    let conn = open_reader(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot read a snapshot", &e);
    // One read transaction: the chunks listed are the chunks read.
    let tx = conn.unchecked_transaction().map_err(err)?;
    let listed: Vec<(i64, i64, i64)> = {
        let mut stmt = tx
            .prepare(
                "SELECT rowid, idx, length(data) FROM dpledger_snapshot_chunks \
                 WHERE snapshot = ?1 ORDER BY idx",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([to_i64(info.id)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(err)?;
        rows.collect::<Result<_, _>>().map_err(err)?
    };
    let corrupt = |idx: i64, detail: &str| StoreError::Corrupt {
        store: store.to_string(),
        seq: Some(info.seq),
        detail: format!("snapshot {} chunk {idx}: {detail}", info.id),
    };
    let mut verifier = ChunkVerifier::new(store, info);
    // Each chunk is read straight into one reused buffer (incremental blob
    // I/O): no fresh allocation per chunk, so a restart faults in one chunk's
    // worth of memory, not the whole snapshot's (engine::allocator).
    let mut buffer = Vec::new();
    for (rowid, idx, len) in listed {
        // The table is STRICT and `data` a NOT NULL BLOB, so `len` is its size.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > CHUNK_BYTES {
            return Err(corrupt(
                idx,
                &format!("{len} bytes, more than a chunk holds"),
            ));
        }
        let blob = tx
            .blob_open(
                rusqlite::DatabaseName::Main,
                "dpledger_snapshot_chunks",
                "data",
                rowid,
                true,
            )
            .map_err(err)?;
        buffer.resize(len, 0);
        blob.read_at_exact(&mut buffer, 0)
            .map_err(|e| corrupt(idx, &e.to_string()))?;
        drop(blob);
        verifier.chunk(idx, &buffer)?;
        sink(&buffer)?;
    }
    drop(tx);
    verifier.finish()
}

pub(super) fn delete_snapshot(path: &Path, store: &str, id: u64) -> Result<(), StoreError> {
    let mut conn = open_connection(path, store)?;
    let pinned = write_tx(&mut conn, store, "cannot delete a snapshot", |tx| {
        let pinned: Option<i64> = tx
            .query_row(
                "SELECT pinned FROM dpledger_snapshots WHERE id = ?1",
                [to_i64(id)],
                |r| r.get(0),
            )
            .optional()?;
        if pinned == Some(0) {
            tx.execute(
                "DELETE FROM dpledger_snapshot_chunks WHERE snapshot = ?1",
                [to_i64(id)],
            )?;
            tx.execute("DELETE FROM dpledger_snapshots WHERE id = ?1", [to_i64(id)])?;
        }
        Ok(pinned == Some(1))
    })?;
    if pinned {
        return Err(StoreError::Backend {
            store: store.to_string(),
            detail: format!("snapshot {id} is pinned by a compaction and is kept"),
        });
    }
    Ok(())
}

pub(super) fn compactions(path: &Path, store: &str) -> Result<Vec<CompactionInfo>, StoreError> {
    let conn = open_reader(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot read dpledger_compactions", &e);
    let mut stmt = conn
        .prepare(
            "SELECT dataset, upto, snapshot, records, bytes FROM dpledger_compactions \
             ORDER BY dataset",
        )
        .map_err(err)?;
    let rows = stmt
        .query_map([], |r| {
            Ok(CompactionInfo {
                dataset: r.get(0)?,
                upto: r.get::<_, i64>(1)? as u64,
                snapshot: r.get::<_, i64>(2)? as u64,
                records: r.get::<_, i64>(3)? as u64,
                bytes: r.get::<_, i64>(4)? as u64,
            })
        })
        .map_err(err)?;
    rows.collect::<Result<_, _>>().map_err(err)
}

pub(super) fn compact(
    path: &Path,
    store: &str,
    snapshot: &SnapshotInfo,
) -> Result<CompactionInfo, StoreError> {
    // The snapshot must read back intact before anything it stands for goes.
    read_snapshot(path, store, snapshot, &mut |_| Ok(()))?;
    let mut conn = open_connection(path, store)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| db_error(store, "cannot set synchronous", &e))?;
    let context = "cannot compact";
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| db_error(store, context, &e))?;
    let err = |e: rusqlite::Error| db_error(store, context, &e);
    let still_there: Option<i64> = tx
        .query_row(
            "SELECT id FROM dpledger_snapshots WHERE id = ?1 AND complete = 1",
            [to_i64(snapshot.id)],
            |r| r.get(0),
        )
        .optional()
        .map_err(err)?;
    if still_there.is_none() {
        return Err(StoreError::Backend {
            store: store.to_string(),
            detail: format!("snapshot {} is gone; nothing was compacted", snapshot.id),
        });
    }
    let previous: Option<(i64, i64, i64, Vec<u8>)> = tx
        .query_row(
            "SELECT upto, records, bytes, digest FROM dpledger_compactions WHERE dataset = ?1",
            [&snapshot.dataset],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .map_err(err)?;
    let from = previous.as_ref().map_or(0, |p| p.0);
    let mut digest = RemovedDigest::new();
    if let Some((_, records, bytes, ref old)) = previous {
        digest.chain(old, records as u64, bytes as u64);
    }
    {
        let mut stmt = tx
            .prepare(
                "SELECT seq, crc, length(payload) FROM dpledger_events \
                 WHERE dataset = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq",
            )
            .map_err(err)?;
        let mut rows = stmt
            .query(params![snapshot.dataset, from, to_i64(snapshot.seq)])
            .map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            digest.add(
                row.get::<_, i64>(0).map_err(err)? as u64,
                row.get::<_, i64>(1).map_err(err)? as u32,
                row.get::<_, i64>(2).map_err(err)? as u64,
            );
        }
    }
    tx.execute(
        "UPDATE dpledger_events SET payload = X'' WHERE dataset = ?1 AND seq > ?2 AND seq <= ?3",
        params![snapshot.dataset, from, to_i64(snapshot.seq)],
    )
    .map_err(err)?;
    tx.execute(
        "UPDATE dpledger_snapshots SET pinned = 1 WHERE id = ?1",
        [to_i64(snapshot.id)],
    )
    .map_err(err)?;
    let info = CompactionInfo {
        dataset: snapshot.dataset.clone(),
        upto: snapshot.seq.max(from as u64),
        snapshot: snapshot.id,
        records: digest.records,
        bytes: digest.bytes,
    };
    tx.execute(
        "INSERT INTO dpledger_compactions (dataset, upto, snapshot, records, bytes, digest, created) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (dataset) DO UPDATE SET \
         upto = excluded.upto, snapshot = excluded.snapshot, records = excluded.records, \
         bytes = excluded.bytes, digest = excluded.digest, created = excluded.created",
        params![
            info.dataset,
            to_i64(info.upto),
            to_i64(info.snapshot),
            to_i64(info.records),
            to_i64(info.bytes),
            digest.finish(),
            to_i64(now_secs())
        ],
    )
    .map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(info)
}

pub(super) fn storage(path: &Path, store: &str) -> Result<StorageStats, StoreError> {
    let conn = open_reader(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot measure the store", &e);
    let [log_sql, snapshot_sql, archive_sql] = STORAGE_SQL;
    let log = collect(&conn, log_sql, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(err)?;
    let snapshots = collect(&conn, snapshot_sql, |r| Ok((r.get(0)?, r.get(1)?))).map_err(err)?;
    let archives = collect(&conn, archive_sql, |r| Ok((r.get(0)?, r.get(1)?))).map_err(err)?;
    Ok(StorageStats::from_rows(log, snapshots, archives))
}

/// Every row of `sql` (no parameters), mapped.
fn collect<T>(
    conn: &rusqlite::Connection,
    sql: &str,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    conn.prepare(sql)?.query_map([], row)?.collect()
}

//! PostgreSQL side of snapshots and compaction (layout and rules in
//! `store::snapshots`): each operation on a connection of its own, beside the
//! group-commit writer.

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Config, IsolationLevel, Transaction};
use sha2::{Digest, Sha256};

use super::{connect, raw_row, wait_for_writers_in_flight, Ctx, SELECT_DATASET_ROWS};
use crate::store::snapshots::{
    hex, now_secs, ChunkVerifier, RemovedDigest, ABANDONED_AFTER_SECS, CHUNK_BYTES, STORAGE_SQL,
};
use crate::store::{
    CompactionInfo, RowChecker, SnapshotInfo, StorageStats, StoreError, StoredRecord,
};

const SELECT_SNAPSHOTS: &str = "SELECT id, dataset, seq, created, bytes, sha256, pinned \
     FROM dpledger_snapshots WHERE complete ORDER BY dataset, seq DESC, id DESC";

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Per dataset, the last sequence number a compaction emptied.
pub(super) fn compacted_upto(
    tx: &mut Transaction<'_>,
    ctx: &Ctx<'_>,
) -> Result<Vec<(String, u64)>, StoreError> {
    let rows = tx
        .query("SELECT dataset, upto FROM dpledger_compactions", &[])
        .map_err(|e| ctx.backend("cannot read dpledger_compactions", &e))?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get::<_, String>(0)
                    .map_err(|e| ctx.backend("cannot read dpledger_compactions", &e))?,
                r.try_get::<_, i64>(1)
                    .map_err(|e| ctx.backend("cannot read dpledger_compactions", &e))?
                    as u64,
            ))
        })
        .collect()
}

fn read_tx<'c>(client: &'c mut Client, ctx: &Ctx<'_>) -> Result<Transaction<'c>, StoreError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(|e| ctx.backend("cannot begin the read transaction", &e))
}

/// One dataset's records after `after`, checksums verified, through the
/// `(dataset, seq)` index.
pub(super) fn read_dataset_rows(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
    after: u64,
    sink: &mut dyn FnMut(StoredRecord) -> bool,
) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    wait_for_writers_in_flight(&mut client, ctx)?;
    let mut tx = read_tx(&mut client, ctx)?;
    let compacted = compacted_upto(&mut tx, ctx)?;
    let mut checker = RowChecker::resuming(ctx.store.to_string(), after, compacted);
    {
        let after = to_i64(after);
        let params: [&(dyn postgres::types::ToSql + Sync); 2] = [&dataset, &after];
        let mut rows = tx
            .query_raw(SELECT_DATASET_ROWS, params)
            .map_err(|e| ctx.backend("cannot read dpledger_events", &e))?;
        while let Some(row) = rows
            .next()
            .map_err(|e| ctx.backend("cannot read dpledger_events", &e))?
        {
            let raw = raw_row(&row, checker.last_seq() + 1, ctx)?;
            if !sink(checker.check_unordered(raw)?) {
                return Ok(());
            }
        }
    }
    tx.commit()
        .map_err(|e| ctx.backend("cannot end the read transaction", &e))
}

pub(super) fn dataset_starts(
    config: &Config,
    ctx: &Ctx<'_>,
) -> Result<Vec<(String, u64)>, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot list the datasets", &e);
    let rows = client
        .query(
            "SELECT dataset, seq FROM dpledger_events WHERE kind = 1 ORDER BY seq",
            &[],
        )
        .map_err(err)?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(err)?,
                r.try_get::<_, i64>(1).map_err(err)? as u64,
            ))
        })
        .collect()
}

fn info_of(row: &postgres::Row) -> Result<SnapshotInfo, postgres::Error> {
    Ok(SnapshotInfo {
        id: row.try_get::<_, i64>(0)? as u64,
        dataset: row.try_get(1)?,
        seq: row.try_get::<_, i64>(2)? as u64,
        created: row.try_get::<_, i64>(3)? as u64,
        bytes: row.try_get::<_, i64>(4)? as u64,
        sha256: row.try_get(5)?,
        pinned: row.try_get(6)?,
    })
}

pub(super) fn list(config: &Config, ctx: &Ctx<'_>) -> Result<Vec<SnapshotInfo>, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot list the snapshots", &e);
    let rows = client.query(SELECT_SNAPSHOTS, &[]).map_err(err)?;
    rows.iter().map(|r| info_of(r).map_err(err)).collect()
}

pub(super) fn write_snapshot(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
    seq: u64,
    bytes: &[u8],
) -> Result<SnapshotInfo, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot write a snapshot", &e);
    let sha256 = hex(&Sha256::digest(bytes));
    let created = now_secs();
    let cutoff = to_i64(created.saturating_sub(ABANDONED_AFTER_SECS));
    client
        .execute(
            "DELETE FROM dpledger_snapshot_chunks WHERE snapshot IN \
             (SELECT id FROM dpledger_snapshots WHERE NOT complete AND created < $1)",
            &[&cutoff],
        )
        .map_err(err)?;
    client
        .execute(
            "DELETE FROM dpledger_snapshots WHERE NOT complete AND created < $1",
            &[&cutoff],
        )
        .map_err(err)?;
    let id: i64 = client
        .query_one(
            "INSERT INTO dpledger_snapshots (dataset, seq, created, bytes, sha256) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
            &[
                &dataset,
                &to_i64(seq),
                &to_i64(created),
                &(bytes.len() as i64),
                &sha256,
            ],
        )
        .and_then(|r| r.try_get(0))
        .map_err(err)?;
    for (idx, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        client
            .execute(
                "INSERT INTO dpledger_snapshot_chunks (snapshot, idx, data) VALUES ($1, $2, $3)",
                &[&id, &(idx as i64), &chunk],
            )
            .map_err(err)?;
    }
    client
        .execute(
            "UPDATE dpledger_snapshots SET complete = true WHERE id = $1",
            &[&id],
        )
        .map_err(err)?;
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

pub(super) fn read_snapshot(
    config: &Config,
    ctx: &Ctx<'_>,
    info: &SnapshotInfo,
    sink: &mut (dyn FnMut(&[u8]) -> Result<(), StoreError> + Send),
) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot read a snapshot", &e);
    let mut tx = read_tx(&mut client, ctx)?;
    let mut verifier = ChunkVerifier::new(ctx.store, info);
    {
        let id = to_i64(info.id);
        let mut rows = tx
            .query_raw(
                "SELECT idx, data FROM dpledger_snapshot_chunks WHERE snapshot = $1 ORDER BY idx",
                [id],
            )
            .map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let idx: i64 = row.try_get(0).map_err(err)?;
            let data: &[u8] = row.try_get(1).map_err(err)?;
            verifier.chunk(idx, data)?;
            sink(data)?;
        }
    }
    tx.commit().map_err(err)?;
    verifier.finish()
}

pub(super) fn delete_snapshot(config: &Config, ctx: &Ctx<'_>, id: u64) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot delete a snapshot", &e);
    let mut tx = client.transaction().map_err(err)?;
    let pinned: Option<bool> = tx
        .query_opt(
            "SELECT pinned FROM dpledger_snapshots WHERE id = $1 FOR UPDATE",
            &[&to_i64(id)],
        )
        .map_err(err)?
        .map(|r| r.try_get(0))
        .transpose()
        .map_err(err)?;
    if pinned == Some(true) {
        return Err(StoreError::Backend {
            store: ctx.store.to_string(),
            detail: format!("snapshot {id} is pinned by a compaction and is kept"),
        });
    }
    tx.execute(
        "DELETE FROM dpledger_snapshot_chunks WHERE snapshot = $1",
        &[&to_i64(id)],
    )
    .map_err(err)?;
    tx.execute(
        "DELETE FROM dpledger_snapshots WHERE id = $1",
        &[&to_i64(id)],
    )
    .map_err(err)?;
    tx.commit().map_err(err)
}

pub(super) fn compactions(
    config: &Config,
    ctx: &Ctx<'_>,
) -> Result<Vec<CompactionInfo>, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot read dpledger_compactions", &e);
    let rows = client
        .query(
            "SELECT dataset, upto, snapshot, records, bytes FROM dpledger_compactions \
             ORDER BY dataset",
            &[],
        )
        .map_err(err)?;
    rows.iter()
        .map(|r| {
            Ok(CompactionInfo {
                dataset: r.try_get(0).map_err(err)?,
                upto: r.try_get::<_, i64>(1).map_err(err)? as u64,
                snapshot: r.try_get::<_, i64>(2).map_err(err)? as u64,
                records: r.try_get::<_, i64>(3).map_err(err)? as u64,
                bytes: r.try_get::<_, i64>(4).map_err(err)? as u64,
            })
        })
        .collect()
}

pub(super) fn compact(
    config: &Config,
    ctx: &Ctx<'_>,
    snapshot: &SnapshotInfo,
) -> Result<CompactionInfo, StoreError> {
    // The snapshot must read back intact before anything it stands for goes.
    read_snapshot(config, ctx, snapshot, &mut |_| Ok(()))?;
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot compact", &e);
    let mut tx = client.transaction().map_err(err)?;
    let still_there = tx
        .query_opt(
            "SELECT id FROM dpledger_snapshots WHERE id = $1 AND complete FOR UPDATE",
            &[&to_i64(snapshot.id)],
        )
        .map_err(err)?;
    if still_there.is_none() {
        return Err(StoreError::Backend {
            store: ctx.store.to_string(),
            detail: format!("snapshot {} is gone; nothing was compacted", snapshot.id),
        });
    }
    let previous = tx
        .query_opt(
            "SELECT upto, records, bytes, digest FROM dpledger_compactions \
             WHERE dataset = $1 FOR UPDATE",
            &[&snapshot.dataset],
        )
        .map_err(err)?;
    let mut digest = RemovedDigest::new();
    let mut from = 0i64;
    if let Some(row) = previous {
        from = row.try_get(0).map_err(err)?;
        let old: Vec<u8> = row.try_get(3).map_err(err)?;
        digest.chain(
            &old,
            row.try_get::<_, i64>(1).map_err(err)? as u64,
            row.try_get::<_, i64>(2).map_err(err)? as u64,
        );
    }
    let upto = to_i64(snapshot.seq);
    for row in tx
        .query(
            "SELECT seq, crc, length(payload)::BIGINT FROM dpledger_events \
             WHERE dataset = $1 AND seq > $2 AND seq <= $3 ORDER BY seq",
            &[&snapshot.dataset, &from, &upto],
        )
        .map_err(err)?
    {
        digest.add(
            row.try_get::<_, i64>(0).map_err(err)? as u64,
            row.try_get::<_, i64>(1).map_err(err)? as u32,
            row.try_get::<_, i64>(2).map_err(err)? as u64,
        );
    }
    tx.execute(
        "UPDATE dpledger_events SET payload = ''::bytea \
         WHERE dataset = $1 AND seq > $2 AND seq <= $3",
        &[&snapshot.dataset, &from, &upto],
    )
    .map_err(err)?;
    tx.execute(
        "UPDATE dpledger_snapshots SET pinned = true WHERE id = $1",
        &[&to_i64(snapshot.id)],
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
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (dataset) DO UPDATE SET \
         upto = excluded.upto, snapshot = excluded.snapshot, records = excluded.records, \
         bytes = excluded.bytes, digest = excluded.digest, created = excluded.created",
        &[
            &info.dataset,
            &to_i64(info.upto),
            &to_i64(info.snapshot),
            &to_i64(info.records),
            &to_i64(info.bytes),
            &digest.finish(),
            &to_i64(now_secs()),
        ],
    )
    .map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(info)
}

pub(super) fn storage(config: &Config, ctx: &Ctx<'_>) -> Result<StorageStats, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot measure the store", &e);
    let [log_sql, snapshot_sql, archive_sql] = STORAGE_SQL;
    let mut log = Vec::new();
    for r in client.query(log_sql, &[]).map_err(err)? {
        log.push((
            r.try_get(0).map_err(err)?,
            r.try_get(1).map_err(err)?,
            r.try_get(2).map_err(err)?,
        ));
    }
    let mut pairs = |sql: &str| -> Result<Vec<(String, i64)>, StoreError> {
        let mut out = Vec::new();
        for r in client.query(sql, &[]).map_err(err)? {
            out.push((r.try_get(0).map_err(err)?, r.try_get(1).map_err(err)?));
        }
        Ok(out)
    };
    let snapshots = pairs(snapshot_sql)?;
    let archives = pairs(archive_sql)?;
    Ok(StorageStats::from_rows(log, snapshots, archives))
}

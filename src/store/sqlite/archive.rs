//! SQLite side of archived datasets' per-example answers (`store::archive`):
//! blocks in `dpledger_archive_blocks`, the complete archive's marker in
//! `dpledger_archives`. Each operation on a connection of its own.

use std::path::Path;

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::{db_error, open_connection, open_reader};
use crate::store::archive::{check_block, to_i64};
use crate::store::StoreError;

pub(super) fn put_blocks(
    path: &Path,
    store: &str,
    dataset: &str,
    seq: u64,
    blocks: &[(u64, Vec<u8>)],
) -> Result<(), StoreError> {
    let mut conn = open_connection(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot write archive blocks", &e);
    // Blocks are rewritten from the ledger if lost: no sync of each batch.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(err)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    {
        let mut stmt = tx
            .prepare(
                "INSERT OR REPLACE INTO dpledger_archive_blocks (dataset, block, seq, crc, data) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(err)?;
        for (block, data) in blocks {
            stmt.execute(params![
                dataset,
                to_i64(*block),
                to_i64(seq),
                i64::from(crc32fast::hash(data)),
                data
            ])
            .map_err(err)?;
        }
    }
    tx.commit().map_err(err)
}

pub(super) fn complete(
    path: &Path,
    store: &str,
    dataset: &str,
    seq: u64,
    blocks: u64,
) -> Result<(), StoreError> {
    let mut conn = open_connection(path, store)?;
    let err = |e: rusqlite::Error| db_error(store, "cannot complete an archive", &e);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    tx.execute(
        "DELETE FROM dpledger_archive_blocks WHERE dataset = ?1 AND (seq <> ?2 OR block >= ?3)",
        params![dataset, to_i64(seq), to_i64(blocks)],
    )
    .map_err(err)?;
    tx.execute(
        "INSERT OR REPLACE INTO dpledger_archives (dataset, seq, blocks) VALUES (?1, ?2, ?3)",
        params![dataset, to_i64(seq), to_i64(blocks)],
    )
    .map_err(err)?;
    tx.commit().map_err(err)
}

pub(super) fn info(
    path: &Path,
    store: &str,
    dataset: &str,
) -> Result<Option<(u64, u64)>, StoreError> {
    let conn = open_reader(path, store)?;
    conn.query_row(
        "SELECT seq, blocks FROM dpledger_archives WHERE dataset = ?1",
        [dataset],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
    )
    .optional()
    .map_err(|e| db_error(store, "cannot read dpledger_archives", &e))
}

pub(super) fn read_block(
    path: &Path,
    store: &str,
    dataset: &str,
    block: u64,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    let conn = open_reader(path, store)?;
    let row = conn
        .query_row(
            "SELECT seq, crc, data FROM dpledger_archive_blocks WHERE dataset = ?1 AND block = ?2",
            params![dataset, to_i64(block)],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            },
        )
        .optional()
        .map_err(|e| db_error(store, "cannot read an archive block", &e))?;
    row.map(|(seq, crc, data)| check_block(store, dataset, block, seq, crc, data))
        .transpose()
}

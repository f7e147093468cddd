//! PostgreSQL side of archived datasets' per-example answers
//! (`store::archive`). Each operation on a connection of its own.

use postgres::Config;

use super::{connect, Ctx};
use crate::store::archive::{check_block, to_i64};
use crate::store::StoreError;

pub(super) fn put_blocks(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
    seq: u64,
    blocks: &[(u64, Vec<u8>)],
) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot write archive blocks", &e);
    let mut tx = client.transaction().map_err(err)?;
    // Blocks are rewritten from the ledger if lost: no wait for the WAL flush.
    tx.batch_execute("SET LOCAL synchronous_commit = off")
        .map_err(err)?;
    let stmt = tx
        .prepare(
            "INSERT INTO dpledger_archive_blocks (dataset, block, seq, crc, data) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (dataset, block) DO UPDATE \
             SET seq = EXCLUDED.seq, crc = EXCLUDED.crc, data = EXCLUDED.data",
        )
        .map_err(err)?;
    for (block, data) in blocks {
        let crc = i64::from(crc32fast::hash(data));
        tx.execute(
            &stmt,
            &[
                &dataset,
                &to_i64(*block),
                &to_i64(seq),
                &crc,
                &data.as_slice(),
            ],
        )
        .map_err(err)?;
    }
    tx.commit().map_err(err)
}

pub(super) fn complete(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
    seq: u64,
    blocks: u64,
) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot complete an archive", &e);
    let mut tx = client.transaction().map_err(err)?;
    tx.execute(
        "DELETE FROM dpledger_archive_blocks WHERE dataset = $1 AND (seq <> $2 OR block >= $3)",
        &[&dataset, &to_i64(seq), &to_i64(blocks)],
    )
    .map_err(err)?;
    tx.execute(
        "INSERT INTO dpledger_archives (dataset, seq, blocks) VALUES ($1, $2, $3) \
         ON CONFLICT (dataset) DO UPDATE SET seq = EXCLUDED.seq, blocks = EXCLUDED.blocks",
        &[&dataset, &to_i64(seq), &to_i64(blocks)],
    )
    .map_err(err)?;
    tx.commit().map_err(err)
}

pub(super) fn info(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
) -> Result<Option<(u64, u64)>, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot read dpledger_archives", &e);
    let row = client
        .query_opt(
            "SELECT seq, blocks FROM dpledger_archives WHERE dataset = $1",
            &[&dataset],
        )
        .map_err(err)?;
    row.map(|r| {
        Ok((
            r.try_get::<_, i64>(0).map_err(err)? as u64,
            r.try_get::<_, i64>(1).map_err(err)? as u64,
        ))
    })
    .transpose()
}

pub(super) fn read_block(
    config: &Config,
    ctx: &Ctx<'_>,
    dataset: &str,
    block: u64,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    let mut client = connect(config, ctx)?;
    let err = |e: postgres::Error| ctx.backend("cannot read an archive block", &e);
    let row = client
        .query_opt(
            "SELECT seq, crc, data FROM dpledger_archive_blocks WHERE dataset = $1 AND block = $2",
            &[&dataset, &to_i64(block)],
        )
        .map_err(err)?;
    let Some(r) = row else {
        return Ok(None);
    };
    let seq = r.try_get::<_, i64>(0).map_err(err)? as u64;
    let crc = r.try_get::<_, i64>(1).map_err(err)?;
    let data: Vec<u8> = r.try_get(2).map_err(err)?;
    check_block(ctx.store, dataset, block, seq, crc, data).map(Some)
}

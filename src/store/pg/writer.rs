//! The PostgreSQL side of group commit (`store/group.rs`): one connection with
//! its prepared statements, numbering a group's records under the `last_seq`
//! row lock, inserting them in one statement, and falling back to one
//! SAVEPOINT per caller so that only the caller with a duplicate step fails.

use std::collections::HashSet;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, Config, Statement, Transaction};

use super::schema::{init_schema, warn_if_not_durable};
use super::{connect, pg_text, Ctx, Secret};
use crate::store::group::{Backend, BatchResult};
use crate::store::{IdempotencyKey, Prepared, StoreError};

/// How long a writer waits for the `last_seq` row lock (held by another process's
/// group commit) unless the URL sets `lock_timeout`.
const WRITER_LOCK_TIMEOUT: Duration = Duration::from_secs(30);
const INSERT_SQL: &str =
    "INSERT INTO dpledger_events (seq, dataset, kind, step, part, payload, crc, epoch) \
     SELECT * FROM unnest($1::int8[], $2::text[], $3::int2[], $4::int8[], $5::int8[], \
     $6::bytea[], $7::int8[], $8::int8[])";
const LOCK_LAST_SEQ_SQL: &str = "SELECT value FROM dpledger_meta WHERE key = 'last_seq' FOR UPDATE";
const FIND_STEP_SQL: &str = "SELECT 1 FROM dpledger_events \
     WHERE kind = 2 AND dataset = $1 AND step = $2 AND COALESCE(part, 0) = $3";
const INSERT_KEYS_SQL: &str =
    "INSERT INTO dpledger_idempotency (dataset, key, seq, request, answer) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::bytea[], $5::bytea[])";
const STEP_INDEX: &str = "dpledger_step_unique";
const KEY_INDEX: &str = "dpledger_idempotency_pkey";
const PRIMARY_KEY: &str = "dpledger_events_pkey";

struct PgConn {
    client: Client,
    insert: Statement,
    lock_last_seq: Statement,
    find_step: Statement,
}

impl PgConn {
    fn new(mut client: Client, ctx: &Ctx<'_>) -> Result<PgConn, StoreError> {
        // A session stuck holding the last_seq lock (another process's hung
        // transaction) must fail appends with an error, not hang them forever;
        // a setting from the URL (`options=-clock_timeout=...`) is kept.
        let lock_timeout = client
            .query_one("SHOW lock_timeout", &[])
            .and_then(|row| row.try_get::<_, String>(0))
            .map_err(|e| ctx.backend("cannot read lock_timeout", &e))?;
        if lock_timeout == "0" {
            client
                .batch_execute(&format!(
                    "SET lock_timeout = '{}s'",
                    WRITER_LOCK_TIMEOUT.as_secs()
                ))
                .map_err(|e| ctx.backend("cannot set lock_timeout", &e))?;
        }
        let mut prepare = |sql: &str| {
            client
                .prepare(sql)
                .map_err(|e| ctx.backend("cannot prepare a statement", &e))
        };
        let insert = prepare(INSERT_SQL)?;
        let lock_last_seq = prepare(LOCK_LAST_SEQ_SQL)?;
        let find_step = prepare(FIND_STEP_SQL)?;
        Ok(PgConn {
            client,
            insert,
            lock_last_seq,
            find_step,
        })
    }
}

pub(super) struct PgBackend {
    config: Config,
    store: String,
    secret: Secret,
    conn: Option<PgConn>,
}

impl PgBackend {
    pub(super) fn open(
        config: Config,
        store: String,
        secret: Secret,
    ) -> Result<PgBackend, StoreError> {
        let ctx = Ctx {
            store: &store,
            secret: &secret,
        };
        let mut client = connect(&config, &ctx)?;
        init_schema(&mut client, &ctx)?;
        warn_if_not_durable(&mut client, &ctx);
        let conn = PgConn::new(client, &ctx)?;
        tracing::info!(store = %store, "opened the event log");
        Ok(PgBackend {
            config,
            store,
            secret,
            conn: Some(conn),
        })
    }
}

impl Backend for PgBackend {
    /// Commits on the writer's connection. Any failure of the transaction drops
    /// the connection, so the next group starts on a fresh one instead of
    /// failing on a dead one; a failure before COMMIT on a connection that was
    /// reused (it may have died while idle: nothing of the group was stored) is
    /// retried once on a fresh connection before the callers are answered.
    fn commit_group(&mut self, batches: &[&[Prepared]]) -> Result<Vec<BatchResult>, StoreError> {
        let reused = self.conn.is_some();
        match self.try_commit_group(batches) {
            Err(e @ StoreError::Backend { .. }) if reused => {
                tracing::warn!(store = %self.store, error = %e, "the writer's connection failed before COMMIT; retrying once on a new connection");
                self.try_commit_group(batches)
            }
            outcome => outcome,
        }
    }
}

impl PgBackend {
    fn try_commit_group(
        &mut self,
        batches: &[&[Prepared]],
    ) -> Result<Vec<BatchResult>, StoreError> {
        let ctx = Ctx {
            store: &self.store,
            secret: &self.secret,
        };
        let conn = match self.conn.take() {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => PgConn::new(connect(&self.config, &ctx)?, &ctx)?,
        };
        let conn = self.conn.insert(conn);
        let outcome = commit_group_on(conn, &ctx, batches);
        if outcome.is_err() || conn.client.is_closed() {
            self.conn = None;
        }
        outcome
    }
}

fn commit_group_on(
    conn: &mut PgConn,
    ctx: &Ctx<'_>,
    batches: &[&[Prepared]],
) -> Result<Vec<BatchResult>, StoreError> {
    let PgConn {
        client,
        insert,
        lock_last_seq,
        find_step,
    } = conn;
    let mut tx = client
        .transaction()
        .map_err(|e| ctx.backend("cannot begin the write transaction", &e))?;
    let last: i64 = tx
        .query_one(&*lock_last_seq, &[])
        .and_then(|row| row.try_get(0))
        .map_err(|e| ctx.backend("cannot lock dpledger_meta.last_seq", &e))?;
    let total: usize = batches.iter().map(|b| b.len()).sum();
    if last < 0 || last.checked_add(total as i64 + 1).is_none() {
        return Err(StoreError::Corrupt {
            store: ctx.store.to_string(),
            seq: None,
            detail: format!("dpledger_meta.last_seq is {last}"),
        });
    }
    let mut next = last + 1;
    let mut results = Vec::with_capacity(batches.len());
    // Fast path: the whole group in one statement (duplicates are rare: retries
    // and races). Round trips per group stay constant instead of three per caller.
    let mut grouped = false;
    if batches.len() > 1 {
        let all: Vec<&Prepared> = batches.iter().flat_map(|b| b.iter()).collect();
        let mut sp = tx
            .savepoint("dpledger_group")
            .map_err(|e| ctx.backend("cannot open a savepoint", &e))?;
        match insert_rows(&mut sp, insert, &all, next) {
            Ok(()) => {
                sp.commit()
                    .map_err(|e| ctx.backend("cannot release a savepoint", &e))?;
                for batch in batches {
                    let first = next as u64;
                    results.push(Ok((first..first + batch.len() as u64).collect()));
                    next += batch.len() as i64;
                }
                grouped = true;
            }
            // Someone's batch is refused: redo it caller by caller to find whose.
            Err(_) => sp
                .rollback()
                .map_err(|e| ctx.backend("cannot roll back a savepoint", &e))?,
        }
    }
    if !grouped {
        for batch in batches {
            let rows: Vec<&Prepared> = batch.iter().collect();
            let mut sp = tx
                .savepoint("dpledger_batch")
                .map_err(|e| ctx.backend("cannot open a savepoint", &e))?;
            match insert_rows(&mut sp, insert, &rows, next) {
                Ok(()) => {
                    sp.commit()
                        .map_err(|e| ctx.backend("cannot release a savepoint", &e))?;
                    let first = next as u64;
                    results.push(Ok((first..first + batch.len() as u64).collect()));
                    next += batch.len() as i64;
                }
                Err(e) => {
                    sp.rollback()
                        .map_err(|e| ctx.backend("cannot roll back a savepoint", &e))?;
                    let refused = classify_insert_error(&mut tx, find_step, ctx, batch, last, &e)?;
                    results.push(Err(refused));
                }
            }
        }
    }
    if next - 1 != last {
        tx.execute(
            "UPDATE dpledger_meta SET value = $1 WHERE key = 'last_seq'",
            &[&(next - 1)],
        )
        .map_err(|e| ctx.backend("cannot update dpledger_meta.last_seq", &e))?;
    }
    tx.commit().map_err(|e| StoreError::OutcomeUnknown {
        store: ctx.store.to_string(),
        detail: ctx.secret.clean(format!("commit failed: {}", pg_text(&e))),
    })?;
    Ok(results)
}

/// Inserts `rows` numbered from `first_seq` with one `INSERT ... SELECT FROM
/// unnest(...)` statement.
fn insert_rows(
    tx: &mut Transaction<'_>,
    insert: &Statement,
    rows: &[&Prepared],
    first_seq: i64,
) -> Result<(), postgres::Error> {
    let seqs: Vec<i64> = (first_seq..first_seq + rows.len() as i64).collect();
    let datasets: Vec<&str> = rows.iter().map(|p| p.record.dataset.as_str()).collect();
    let kinds: Vec<i16> = rows
        .iter()
        .map(|p| i16::from(p.record.kind.code()))
        .collect();
    let steps: Vec<Option<i64>> = rows.iter().map(|p| p.step_i64()).collect();
    let parts: Vec<Option<i64>> = rows.iter().map(|p| p.part_i64()).collect();
    let payloads: Vec<&[u8]> = rows.iter().map(|p| p.record.payload.as_slice()).collect();
    let crcs: Vec<i64> = rows.iter().map(|p| i64::from(p.crc)).collect();
    let epochs: Vec<Option<i64>> = rows.iter().map(|p| p.epoch.map(|e| e as i64)).collect();
    tx.execute(
        insert,
        &[
            &seqs, &datasets, &kinds, &steps, &parts, &payloads, &crcs, &epochs,
        ],
    )?;
    insert_keys(tx, rows, first_seq)
}

/// Stores the idempotency keys of `rows` (numbered from `first_seq`), if any,
/// in the same savepoint as the rows.
fn insert_keys(
    tx: &mut Transaction<'_>,
    rows: &[&Prepared],
    first_seq: i64,
) -> Result<(), postgres::Error> {
    let keyed: Vec<(i64, &Prepared, &IdempotencyKey)> = (first_seq..)
        .zip(rows.iter().copied())
        .filter_map(|(seq, p)| p.key.as_ref().map(|k| (seq, p, k)))
        .collect();
    if keyed.is_empty() {
        return Ok(());
    }
    let datasets: Vec<&str> = keyed
        .iter()
        .map(|(_, p, _)| p.record.dataset.as_str())
        .collect();
    let keys: Vec<&str> = keyed.iter().map(|(_, _, k)| k.key.as_str()).collect();
    let seqs: Vec<i64> = keyed.iter().map(|(seq, _, _)| *seq).collect();
    let requests: Vec<&[u8]> = keyed.iter().map(|(_, _, k)| &k.request[..]).collect();
    let answers: Vec<&[u8]> = keyed.iter().map(|(_, _, k)| &k.answer[..]).collect();
    tx.execute(
        INSERT_KEYS_SQL,
        &[&datasets, &keys, &seqs, &requests, &answers],
    )?;
    Ok(())
}

/// Turns a failed batch insert into that caller's error. A violation of the step
/// index is a [`StoreError::Duplicate`] naming the first offending record (found by
/// lookup, since the server's message is not meant to be parsed).
fn classify_insert_error(
    tx: &mut Transaction<'_>,
    find_step: &Statement,
    ctx: &Ctx<'_>,
    batch: &[Prepared],
    last: i64,
    e: &postgres::Error,
) -> Result<StoreError, StoreError> {
    let Some(db) = e.as_db_error() else {
        return Ok(ctx.backend("insert failed", e));
    };
    if db.code().code() == super::cluster::FENCED_SQLSTATE {
        return Ok(StoreError::Fenced {
            store: ctx.store.to_string(),
            dataset: batch
                .first()
                .map(|p| p.record.dataset.clone())
                .unwrap_or_default(),
            detail: db.message().to_string(),
        });
    }
    if *db.code() != SqlState::UNIQUE_VIOLATION {
        return Ok(ctx.backend("insert failed", e));
    }
    if db.constraint() == Some(PRIMARY_KEY) {
        return Ok(StoreError::Corrupt {
            store: ctx.store.to_string(),
            seq: None,
            detail: format!(
                "a sequence number after {last} is already used although dpledger_meta.last_seq \
                 says the log ends at {last}"
            ),
        });
    }
    if db.constraint() == Some(KEY_INDEX) {
        if let Some(p) = batch.iter().find(|p| p.key.is_some()) {
            return Ok(p.key_used());
        }
    }
    if db.constraint() != Some(STEP_INDEX) {
        return Ok(ctx.backend("insert failed", e));
    }
    let mut seen = HashSet::new();
    for p in batch {
        if let Some(key) = p.step_key() {
            if !seen.insert(key) {
                return Ok(p.duplicate());
            }
        }
    }
    for p in batch {
        if let Some((dataset, step, part)) = p.step_key() {
            let found = tx
                .query_opt(find_step, &[&dataset, &(step as i64), &i64::from(part)])
                .map_err(|e| ctx.backend("cannot look up the duplicate step", &e))?;
            if found.is_some() {
                return Ok(p.duplicate());
            }
        }
    }
    Ok(ctx.backend("insert failed", e))
}

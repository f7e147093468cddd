//! PostgreSQL backend: the same log and guarantees as SQLite, for deployments
//! where several server processes share one database.
//!
//! Design: one writer thread per store with one connection and group commit (see
//! `group.rs`), rather than a connection pool. Appends must be numbered without gaps
//! in commit order, so every writing transaction locks the `last_seq` row of
//! `dpledger_meta` (`SELECT ... FOR UPDATE`) and writes are serialised anyway; a
//! pool would only add connections waiting on that lock. Group commit instead
//! amortises the lock, the round trips and the server's WAL flush over every
//! pending append. A group is first inserted with one `INSERT ... SELECT FROM
//! unnest(...)` statement (a constant number of round trips per group: at 64
//! concurrent callers this took small appends from 4.5k/s to 30k/s); only if that
//! fails (a duplicate step: a retry or a race) is it redone caller by caller, each
//! caller's batch in its own SAVEPOINT, so that only the offending caller fails.
//! Several processes (or several `open`s) on one database serialise on the same
//! row lock, and the unique index makes the database itself refuse a step that
//! another process stored first.
//!
//! The `postgres` crate's blocking client runs its own tokio runtime and panics when
//! used from inside another runtime, so every connection is made and used on a
//! store thread (the writer, or the load helper), never on the caller's thread.
//!
//! Payloads are stored `EXTERNAL` (out of line, uncompressed): step payloads are
//! mostly random f64 bits that do not compress, so trying wastes CPU.

use std::collections::HashSet;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Config, IsolationLevel, NoTls, Statement, Transaction};

use super::group::{Backend, BatchResult, GroupWriter};
use super::sqlite::check_versions;
use super::{
    pipelined_load, redact_url, CompactionInfo, LoadStats, Prepared, RawRow, Record, RowChecker,
    SnapshotInfo, StorageStats, Store, StoreError, StoredRecord, SCHEMA_VERSION,
};

mod archive;
mod snapshots;

/// Connect timeout used when the URL sets none, so an unreachable server fails in
/// seconds instead of hanging start-up.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a writer waits for the `last_seq` row lock (held by another process's
/// group commit) unless the URL sets `lock_timeout`.
const WRITER_LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// `pg_advisory_xact_lock` key serialising table creation across processes
/// (ASCII "dpledger").
const INIT_LOCK_KEY: i64 = 0x6470_6c65_6467_6572;

const SCHEMA_SQL: &str = "
    CREATE TABLE dpledger_meta (
        key   TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );
    CREATE TABLE dpledger_events (
        seq     BIGINT PRIMARY KEY,
        dataset TEXT NOT NULL,
        kind    SMALLINT NOT NULL,
        step    BIGINT,
        part    BIGINT,
        payload BYTEA NOT NULL,
        crc     BIGINT NOT NULL
    );
    ALTER TABLE dpledger_events ALTER COLUMN payload SET STORAGE EXTERNAL;
    CREATE UNIQUE INDEX dpledger_step_unique
        ON dpledger_events (dataset, step, (COALESCE(part, 0))) WHERE kind = 2;
";
/// Schema version 2 (snapshots, compactions, indexes); idempotent, run at every
/// open under the set-up lock so that a version-1 store is upgraded in place.
const UPGRADE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_snapshots (
        id       BIGSERIAL PRIMARY KEY,
        dataset  TEXT NOT NULL,
        seq      BIGINT NOT NULL,
        created  BIGINT NOT NULL,
        bytes    BIGINT NOT NULL,
        sha256   TEXT NOT NULL,
        pinned   BOOLEAN NOT NULL DEFAULT false,
        complete BOOLEAN NOT NULL DEFAULT false
    );
    CREATE TABLE IF NOT EXISTS dpledger_snapshot_chunks (
        snapshot BIGINT NOT NULL,
        idx      BIGINT NOT NULL,
        data     BYTEA NOT NULL,
        PRIMARY KEY (snapshot, idx)
    );
    ALTER TABLE dpledger_snapshot_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
    CREATE TABLE IF NOT EXISTS dpledger_compactions (
        dataset  TEXT PRIMARY KEY,
        upto     BIGINT NOT NULL,
        snapshot BIGINT NOT NULL,
        records  BIGINT NOT NULL,
        bytes    BIGINT NOT NULL,
        digest   BYTEA NOT NULL,
        created  BIGINT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS dpledger_archive_blocks (
        dataset  TEXT NOT NULL,
        block    BIGINT NOT NULL,
        seq      BIGINT NOT NULL,
        crc      BIGINT NOT NULL,
        data     BYTEA NOT NULL,
        PRIMARY KEY (dataset, block)
    );
    CREATE TABLE IF NOT EXISTS dpledger_archives (
        dataset  TEXT PRIMARY KEY,
        seq      BIGINT NOT NULL,
        blocks   BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS dpledger_events_dataset ON dpledger_events (dataset, seq);
    CREATE INDEX IF NOT EXISTS dpledger_events_created ON dpledger_events (seq) WHERE kind = 1;
    UPDATE dpledger_meta SET value = 2 WHERE key = 'schema_version' AND value < 2;
";

const INSERT_SQL: &str =
    "INSERT INTO dpledger_events (seq, dataset, kind, step, part, payload, crc) \
     SELECT * FROM unnest($1::int8[], $2::text[], $3::int2[], $4::int8[], $5::int8[], \
     $6::bytea[], $7::int8[])";
const LOCK_LAST_SEQ_SQL: &str = "SELECT value FROM dpledger_meta WHERE key = 'last_seq' FOR UPDATE";
const FIND_STEP_SQL: &str = "SELECT 1 FROM dpledger_events \
     WHERE kind = 2 AND dataset = $1 AND step = $2 AND COALESCE(part, 0) = $3";
const SELECT_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE seq > $1 ORDER BY seq";
const SELECT_DATASET_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE dataset = $1 AND seq > $2 ORDER BY seq";
const STEP_INDEX: &str = "dpledger_step_unique";
const PRIMARY_KEY: &str = "dpledger_events_pkey";

/// Removes the password from text that may echo it (driver error messages).
#[derive(Clone)]
struct Secret(Option<String>);

impl Secret {
    fn clean(&self, text: String) -> String {
        match &self.0 {
            Some(p) if !p.is_empty() => text.replace(p.as_str(), "***"),
            _ => text,
        }
    }
}

/// Where a PostgreSQL error happened, for messages.
pub(super) struct Ctx<'a> {
    store: &'a str,
    secret: &'a Secret,
}

impl Ctx<'_> {
    pub(super) fn backend(&self, context: &str, e: &postgres::Error) -> StoreError {
        StoreError::Backend {
            store: self.store.to_string(),
            detail: self.secret.clean(format!("{context}: {}", pg_text(e))),
        }
    }
}

/// The driver's message with its cause: the driver's `Display` says only "db
/// error" or "error connecting to server" and keeps the server's message and the
/// I/O error in `source()`.
fn pg_text(e: &postgres::Error) -> String {
    let mut text = e.to_string();
    if let Some(db) = e.as_db_error() {
        text.push_str(&format!(
            ": {}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        ));
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A PostgreSQL event log; see the [module documentation](self).
pub(crate) struct PgStore {
    config: Config,
    name: String,
    secret: Secret,
    writer: GroupWriter,
}

impl PgStore {
    /// Connects, creates the tables when absent, checks the schema version and
    /// starts the writer.
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        let name = redact_url(url);
        let mut config: Config = url.parse().map_err(|e: postgres::Error| {
            let reason = pg_text(&e);
            StoreError::InvalidUrl {
                url: name.clone(),
                reason: Secret(password_in_url(url)).clean(reason),
            }
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            // Lets an operator find the store's sessions in pg_stat_activity.
            config.application_name("dpledger");
        }
        let secret = Secret(
            config
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
        );
        let (init_config, init_name, init_secret) = (config.clone(), name.clone(), secret.clone());
        let writer = GroupWriter::spawn(name.clone(), move || {
            PgBackend::open(init_config, init_name, init_secret)
        })?;
        Ok(PgStore {
            config,
            name,
            secret,
            writer,
        })
    }
}

/// The raw `user:password@` password of a URL, for scrubbing parse errors.
fn password_in_url(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    Some(userinfo.split_once(':')?.1.to_string())
}

impl Store for PgStore {
    fn append(&self, records: Vec<Record>) -> Result<Vec<u64>, StoreError> {
        self.writer.append(records)
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn load_after(
        &self,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError> {
        let ctx = self.ctx();
        let config = &self.config;
        pipelined_load(
            &self.name,
            |sink| read_rows(config, &ctx, after, sink),
            visit,
        )
    }

    fn load_dataset(
        &self,
        dataset: &str,
        after: u64,
        visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
    ) -> Result<LoadStats, StoreError> {
        let ctx = self.ctx();
        let config = &self.config;
        pipelined_load(
            &self.name,
            |sink| snapshots::read_dataset_rows(config, &ctx, dataset, after, sink),
            visit,
        )
    }

    fn dataset_starts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.on_thread(snapshots::dataset_starts)
    }

    fn write_snapshot(
        &self,
        dataset: &str,
        seq: u64,
        bytes: &[u8],
    ) -> Result<SnapshotInfo, StoreError> {
        self.on_thread(|config, ctx| snapshots::write_snapshot(config, ctx, dataset, seq, bytes))
    }

    fn snapshots(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        self.on_thread(snapshots::list)
    }

    fn read_snapshot_chunks(
        &self,
        info: &SnapshotInfo,
        sink: &mut (dyn FnMut(&[u8]) -> Result<(), StoreError> + Send),
    ) -> Result<(), StoreError> {
        self.on_thread(|config, ctx| snapshots::read_snapshot(config, ctx, info, sink))
    }

    fn delete_snapshot(&self, id: u64) -> Result<(), StoreError> {
        self.on_thread(|config, ctx| snapshots::delete_snapshot(config, ctx, id))
    }

    fn compactions(&self) -> Result<Vec<CompactionInfo>, StoreError> {
        self.on_thread(snapshots::compactions)
    }

    fn compact(&self, snapshot: &SnapshotInfo) -> Result<CompactionInfo, StoreError> {
        self.on_thread(|config, ctx| snapshots::compact(config, ctx, snapshot))
    }

    fn storage(&self) -> Result<StorageStats, StoreError> {
        self.on_thread(snapshots::storage)
    }

    fn put_archive_blocks(
        &self,
        dataset: &str,
        seq: u64,
        blocks: &[(u64, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.on_thread(|config, ctx| archive::put_blocks(config, ctx, dataset, seq, blocks))
    }

    fn complete_archive(&self, dataset: &str, seq: u64, blocks: u64) -> Result<(), StoreError> {
        self.on_thread(|config, ctx| archive::complete(config, ctx, dataset, seq, blocks))
    }

    fn archive(&self, dataset: &str) -> Result<Option<(u64, u64)>, StoreError> {
        self.on_thread(|config, ctx| archive::info(config, ctx, dataset))
    }

    fn read_archive_block(
        &self,
        dataset: &str,
        block: u64,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.on_thread(|config, ctx| archive::read_block(config, ctx, dataset, block))
    }
}

impl PgStore {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            store: &self.name,
            secret: &self.secret,
        }
    }

    /// Runs `f` on a scoped thread of its own: the `postgres` crate's blocking
    /// client starts a runtime and must not run on a tokio worker.
    fn on_thread<T: Send>(
        &self,
        f: impl FnOnce(&Config, &Ctx<'_>) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        let ctx = self.ctx();
        let config = &self.config;
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("dpledger-store-op".into())
                .spawn_scoped(scope, || f(config, &ctx))
                .map_err(|e| StoreError::Backend {
                    store: self.name.clone(),
                    detail: format!("cannot start a store thread: {e}"),
                })?
                .join()
                .unwrap_or_else(|_| {
                    Err(StoreError::Backend {
                        store: self.name.clone(),
                        detail: "a store thread panicked".into(),
                    })
                })
        })
    }
}

pub(super) fn connect(config: &Config, ctx: &Ctx<'_>) -> Result<Client, StoreError> {
    config
        .connect(NoTls)
        .map_err(|e| ctx.backend("cannot connect", &e))
}

/// The writer's connection with its prepared statements.
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

struct PgBackend {
    config: Config,
    store: String,
    secret: Secret,
    conn: Option<PgConn>,
}

impl PgBackend {
    fn open(config: Config, store: String, secret: Secret) -> Result<PgBackend, StoreError> {
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

/// Creates the tables if this schema has none, under an advisory lock so that
/// processes starting together do not race; then checks the schema version.
fn init_schema(client: &mut Client, ctx: &Ctx<'_>) -> Result<(), StoreError> {
    let err = |context: &str, e: postgres::Error| ctx.backend(context, &e);
    let mut tx = client
        .transaction()
        .map_err(|e| err("cannot begin the set-up transaction", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INIT_LOCK_KEY])
        .map_err(|e| err("cannot take the set-up lock", e))?;
    let row = tx
        .query_one(
            "SELECT to_regclass('dpledger_meta') IS NOT NULL, \
                    to_regclass('dpledger_events') IS NOT NULL, \
                    current_schema()",
            &[],
        )
        .map_err(|e| err("cannot inspect the schema", e))?;
    let has_meta: bool = row
        .try_get(0)
        .map_err(|e| err("cannot inspect the schema", e))?;
    let has_events: bool = row
        .try_get(1)
        .map_err(|e| err("cannot inspect the schema", e))?;
    let schema: Option<String> = row
        .try_get(2)
        .map_err(|e| err("cannot inspect the schema", e))?;
    let created = match (has_meta, has_events) {
        (false, false) => {
            tx.batch_execute(SCHEMA_SQL)
                .map_err(|e| err("cannot create the tables", e))?;
            tx.execute(
                "INSERT INTO dpledger_meta (key, value) VALUES ('schema_version', $1), ('last_seq', 0)",
                &[&(SCHEMA_VERSION as i64)],
            )
            .map_err(|e| err("cannot initialise dpledger_meta", e))?;
            true
        }
        (true, true) => false,
        (true, false) => {
            return Err(StoreError::Corrupt {
                store: ctx.store.to_string(),
                seq: None,
                detail: "dpledger_meta exists but dpledger_events is missing".into(),
            })
        }
        (false, true) => {
            return Err(StoreError::NotAStore {
                store: ctx.store.to_string(),
                detail: "dpledger_events exists without dpledger_meta".into(),
            })
        }
    };
    let meta = |tx: &mut Transaction<'_>, key: &str| -> Result<Option<i64>, StoreError> {
        let row = tx
            .query_opt("SELECT value FROM dpledger_meta WHERE key = $1", &[&key])
            .map_err(|e| err("cannot read dpledger_meta", e))?;
        match row {
            Some(row) => row
                .try_get(0)
                .map(Some)
                .map_err(|e| err("cannot read dpledger_meta", e)),
            None => Ok(None),
        }
    };
    let version = meta(&mut tx, "schema_version")?;
    let last_seq = meta(&mut tx, "last_seq")?;
    check_versions(ctx.store, version, last_seq)?;
    tx.batch_execute(UPGRADE_SQL)
        .map_err(|e| err("cannot upgrade the schema to version 2", e))?;
    tx.commit()
        .map_err(|e| err("cannot commit the set-up transaction", e))?;
    if created {
        tracing::warn!(
            store = ctx.store,
            schema = schema.as_deref().unwrap_or("?"),
            "created a new, empty event log (no dpledger tables existed in this schema)"
        );
    }
    Ok(())
}

/// Appends are durable on return only if the server syncs its WAL at commit.
fn warn_if_not_durable(client: &mut Client, ctx: &Ctx<'_>) {
    for setting in ["fsync", "synchronous_commit"] {
        if let Ok(row) = client.query_one(&format!("SHOW {setting}"), &[]) {
            if let Ok(value) = row.try_get::<_, String>(0) {
                if value == "off" {
                    tracing::warn!(
                        store = ctx.store,
                        setting,
                        "PostgreSQL has {setting}=off: acknowledged appends can be lost in a crash"
                    );
                }
            }
        }
    }
}

impl Backend for PgBackend {
    fn commit_group(&mut self, batches: &[&[Prepared]]) -> Result<Vec<BatchResult>, StoreError> {
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
        if conn.client.is_closed() {
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
    tx.execute(
        insert,
        &[&seqs, &datasets, &kinds, &steps, &parts, &payloads, &crcs],
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

/// Reads and verifies every row for [`Store::load`] on its own connection, in one
/// read-only repeatable-read transaction (one snapshot).
fn read_rows(
    config: &Config,
    ctx: &Ctx<'_>,
    after: u64,
    sink: &mut dyn FnMut(StoredRecord) -> bool,
) -> Result<(), StoreError> {
    let mut client = connect(config, ctx)?;
    wait_for_writers_in_flight(&mut client, ctx)?;
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(|e| ctx.backend("cannot begin the read transaction", &e))?;
    let last: i64 = tx
        .query_one(
            "SELECT value FROM dpledger_meta WHERE key = 'last_seq'",
            &[],
        )
        .and_then(|row| row.try_get(0))
        .map_err(|e| ctx.backend("cannot read dpledger_meta.last_seq", &e))?;
    let compacted = snapshots::compacted_upto(&mut tx, ctx)?;
    let mut checker = RowChecker::resuming(ctx.store.to_string(), after, compacted);
    {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let mut rows = tx
            .query_raw(SELECT_ROWS, [after])
            .map_err(|e| ctx.backend("cannot read dpledger_events", &e))?;
        loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) => {
                    let context = format!(
                        "reading dpledger_events after seq {} failed",
                        checker.last_seq()
                    );
                    return Err(ctx.backend(&context, &e));
                }
            };
            let raw = raw_row(&row, checker.last_seq() + 1, ctx)?;
            let Some(record) = checker.check(raw)? else {
                continue;
            };
            if !sink(record) {
                return Ok(());
            }
        }
    }
    checker.finish(last)?;
    tx.commit()
        .map_err(|e| ctx.backend("cannot end the read transaction", &e))?;
    Ok(())
}

/// Waits until no writing transaction is in flight before a load takes its
/// snapshot.
///
/// Every writer holds the `last_seq` row lock (`FOR UPDATE`) from its first
/// statement to the end of its COMMIT. A process killed while its COMMIT was in
/// flight leaves a backend that still finishes that commit (PostgreSQL completes a
/// commit it has received, deferred triggers and WAL flush included), possibly
/// after a restarted process has loaded the log: that process would then serve
/// state without a change the log holds (a refresh lowering a threshold, a
/// release's charge), so a trainer would clip at a threshold the log no longer
/// charges. Taking the same row `FOR SHARE` (in its own short transaction) blocks
/// until every such writer has committed or rolled back; the snapshot taken after
/// it contains every commit that was in flight when the load began. Writers that
/// start later belong to live processes, which see their own results.
pub(super) fn wait_for_writers_in_flight(
    client: &mut Client,
    ctx: &Ctx<'_>,
) -> Result<(), StoreError> {
    client
        .query_one(
            "SELECT value FROM dpledger_meta WHERE key = 'last_seq' FOR SHARE",
            &[],
        )
        .map(drop)
        .map_err(|e| ctx.backend("cannot wait for writers in flight (last_seq FOR SHARE)", &e))
}

pub(super) fn raw_row(
    row: &postgres::Row,
    expected_seq: u64,
    ctx: &Ctx<'_>,
) -> Result<RawRow, StoreError> {
    let corrupt = |column: &str, e: postgres::Error| StoreError::Corrupt {
        store: ctx.store.to_string(),
        seq: Some(expected_seq),
        detail: format!("column {column} is unreadable: {e}"),
    };
    Ok(RawRow {
        seq: row.try_get::<_, i64>(0).map_err(|e| corrupt("seq", e))?,
        dataset: Ok(row
            .try_get::<_, String>(1)
            .map_err(|e| corrupt("dataset", e))?),
        kind: i64::from(row.try_get::<_, i16>(2).map_err(|e| corrupt("kind", e))?),
        step: row
            .try_get::<_, Option<i64>>(3)
            .map_err(|e| corrupt("step", e))?,
        part: row
            .try_get::<_, Option<i64>>(4)
            .map_err(|e| corrupt("part", e))?,
        payload: row
            .try_get::<_, Vec<u8>>(5)
            .map_err(|e| corrupt("payload", e))?,
        crc: row.try_get::<_, i64>(6).map_err(|e| corrupt("crc", e))?,
    })
}

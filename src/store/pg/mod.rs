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

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Config, IsolationLevel, NoTls};

use super::group::GroupWriter;
use super::{
    pipelined_load, redact_url, CompactionInfo, IdempotencyKey, LoadStats, RawRow, Record,
    RowChecker, SnapshotInfo, StorageStats, Store, StoreError, StoredKey, StoredRecord,
};

mod archive;
pub(crate) mod cluster;
mod schema;
pub(crate) mod shard_commit;
pub(crate) mod shards;
pub(crate) mod single_node;
mod snapshots;
mod writer;

use writer::PgBackend;

/// Connect timeout used when the URL sets none, so an unreachable server fails in
/// seconds instead of hanging start-up.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const SELECT_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE seq > $1 ORDER BY seq";
const SELECT_DATASET_ROWS: &str = "SELECT seq, dataset, kind, step, part, payload, crc \
     FROM dpledger_events WHERE dataset = $1 AND seq > $2 ORDER BY seq";

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
        self.on_thread(|config, ctx| {
            let mut client = connect(config, ctx)?;
            client
                .execute(
                    crate::store::revocation::INSERT_SQL_PG,
                    &[&jti, &i64::try_from(revoked_at).unwrap_or(i64::MAX)],
                )
                .map_err(|e| ctx.backend("cannot revoke a token", &e))?;
            Ok(())
        })
    }

    fn revoked_tokens(&self) -> Result<Vec<String>, StoreError> {
        self.on_thread(|config, ctx| {
            let mut client = connect(config, ctx)?;
            let rows = client
                .query(crate::store::revocation::SELECT_SQL, &[])
                .map_err(|e| ctx.backend("cannot read the revoked tokens", &e))?;
            rows.iter()
                .map(|r| {
                    r.try_get::<_, String>(0)
                        .map_err(|e| ctx.backend("cannot read the revoked tokens", &e))
                })
                .collect()
        })
    }

    fn find_key(&self, dataset: &str, key: &str) -> Result<Option<StoredKey>, StoreError> {
        self.on_thread(|config, ctx| {
            let mut client = connect(config, ctx)?;
            let row = client
                .query_opt(
                    "SELECT seq, request, answer FROM dpledger_idempotency \
                     WHERE dataset = $1 AND key = $2",
                    &[&dataset, &key],
                )
                .map_err(|e| ctx.backend("cannot read dpledger_idempotency", &e))?;
            row.map(|r| {
                Ok(StoredKey {
                    seq: u64::try_from(r.try_get::<_, i64>(0)?).unwrap_or(0),
                    request: r.try_get(1)?,
                    answer: r.try_get(2)?,
                })
            })
            .transpose()
            .map_err(|e: postgres::Error| ctx.backend("cannot read dpledger_idempotency", &e))
        })
    }

    fn append_fenced(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
        epoch: u64,
    ) -> Result<Vec<u64>, StoreError> {
        self.writer.append_with_epoch(records, key, Some(epoch))
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

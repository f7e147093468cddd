//! The PostgreSQL schema: created once under an advisory lock (processes
//! starting together do not race), upgraded in place, its version checked; and
//! a warning when the server's settings make acknowledged appends losable.

use postgres::{Client, Transaction};

use super::Ctx;
use crate::store::sqlite::check_versions;
use crate::store::{StoreError, SCHEMA_VERSION};

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
    ALTER TABLE dpledger_events ADD COLUMN IF NOT EXISTS epoch BIGINT;
    UPDATE dpledger_meta SET value = 2 WHERE key = 'schema_version' AND value < 2;
";

/// Creates the tables if this schema has none, under an advisory lock so that
/// processes starting together do not race; then checks the schema version.
pub(super) fn init_schema(client: &mut Client, ctx: &Ctx<'_>) -> Result<(), StoreError> {
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
    tx.batch_execute(crate::store::idempotency::TABLE_SQL)
        .map_err(|e| err("cannot create dpledger_idempotency", e))?;
    tx.batch_execute(crate::store::revocation::PG_TABLE_SQL)
        .map_err(|e| err("cannot create dpledger_revoked_tokens", e))?;
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
pub(super) fn warn_if_not_durable(client: &mut Client, ctx: &Ctx<'_>) {
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

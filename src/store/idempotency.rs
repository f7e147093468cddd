//! Idempotency keys: a change sent with a client's key is stored
//! with that key, in the same transaction as its records, so that a retry of
//! the same request is recognised after a restart, a failover, or a commit
//! whose outcome was unknown, and is never applied twice. The key and the
//! check of its form are the protocol's
//! ([`IdempotencyKey`](crate::ledger::IdempotencyKey)); this module is how the
//! store keeps it.
//!
//! Kept in a table of its own beside the log, rather than in the records, so
//! that the record format and its checksums do not change:
//!
//! ```sql
//! dpledger_idempotency(dataset TEXT, key TEXT, seq INTEGER, request BLOB, answer BLOB,
//!                      PRIMARY KEY (dataset, key))
//! ```
//!
//! `seq` is the first record the keyed change wrote; `request` is a digest of the
//! request (the caller decides what it covers: method, path, body); `answer` is
//! what the caller needs to answer a retry (opaque to the store). The primary key
//! makes the *database* refuse a second change with the same key
//! ([`StoreError::KeyUsed`](super::StoreError::KeyUsed)), even from two processes,
//! or from a retry racing a commit still in flight. Additive: a store without
//! the table gets it when opened (no schema version change; an older build
//! ignores it).

/// Longest answer stored with a key, in bytes (a release with many groups is a
/// few hundred kilobytes at most).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// A key found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    /// The first record its change wrote.
    pub seq: u64,
    /// Digest of the request it was first sent with.
    pub request: Vec<u8>,
    /// What the change stored for its retries.
    pub answer: Vec<u8>,
}

/// Creates the table in a store that has none (both backends; run at open).
pub(crate) const TABLE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_idempotency (
        dataset TEXT NOT NULL,
        key     TEXT NOT NULL,
        seq     BIGINT NOT NULL,
        request BYTEA NOT NULL,
        answer  BYTEA NOT NULL,
        PRIMARY KEY (dataset, key)
    );
";

/// The same for SQLite (its types).
pub(crate) const SQLITE_TABLE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_idempotency (
        dataset TEXT NOT NULL,
        key     TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        request BLOB NOT NULL,
        answer  BLOB NOT NULL,
        PRIMARY KEY (dataset, key)
    ) STRICT;
";

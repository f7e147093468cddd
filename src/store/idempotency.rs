//! Idempotency keys: a change sent with a client's key is stored
//! with that key, in the same transaction as its records, so that a retry of
//! the same request is recognised after a restart, a failover, or a commit
//! whose outcome was unknown, and is never applied twice.
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

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// Longest answer stored with a key, in bytes (a release with many groups is a
/// few hundred kilobytes at most).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// A client's key for one change, stored with the change's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The key as the client sent it: 1 to [`MAX_KEY_BYTES`] visible ASCII characters.
    pub key: String,
    /// Digest of the request it was sent with (same key with another request: refused).
    pub request: Vec<u8>,
    /// What a retry is answered from (the caller's encoding; may be empty).
    pub answer: Vec<u8>,
}

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

/// Whether `key` is acceptable: 1 to [`MAX_KEY_BYTES`] visible ASCII characters
/// (no spaces or control characters).
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_BYTES).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_of_bounded_length() {
        assert!(valid_key("a"));
        assert!(valid_key("8e0f6c2a-2f7b-4c55-9a8e-0c3b7d1f9e21"));
        assert!(valid_key(&"k".repeat(MAX_KEY_BYTES)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"k".repeat(MAX_KEY_BYTES + 1)));
        assert!(!valid_key("a b"));
        assert!(!valid_key("a\nb"));
        assert!(!valid_key("clé"));
    }
}

//! Revoked tokens: the ids (`jti`) of bearer tokens refused before their expiry.
//!
//! Kept in the store, beside the log, so that a revocation survives restarts and
//! is seen by every server process on the same store (every node of a cluster
//! reads the list again periodically: `serve --revocation-reload`):
//!
//! ```sql
//! dpledger_revoked_tokens(jti TEXT PRIMARY KEY, revoked_at INTEGER)
//! ```
//!
//! Additive: a store without the table gets it when opened (no schema version
//! change; an older build ignores it, and then honours no revocation).

/// Longest token id accepted, in bytes.
pub const MAX_JTI_BYTES: usize = 128;

/// Whether `jti` is a token id the store accepts: 1 to [`MAX_JTI_BYTES`]
/// characters of `A-Z a-z 0-9 - _ .` (what the server mints is 32 hex digits).
pub fn valid_jti(jti: &str) -> bool {
    !jti.is_empty()
        && jti.len() <= MAX_JTI_BYTES
        && jti
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The SQLite table.
pub(crate) const SQLITE_TABLE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_revoked_tokens (
        jti        TEXT PRIMARY KEY,
        revoked_at INTEGER NOT NULL
    ) STRICT;
";

/// The PostgreSQL table.
pub(crate) const PG_TABLE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_revoked_tokens (
        jti        TEXT PRIMARY KEY,
        revoked_at BIGINT NOT NULL
    );
";

/// Insert a revocation (revoking twice keeps the first time).
pub(crate) const INSERT_SQL_SQLITE: &str =
    "INSERT INTO dpledger_revoked_tokens (jti, revoked_at) VALUES (?1, ?2) ON CONFLICT (jti) DO NOTHING";

/// The same for PostgreSQL.
pub(crate) const INSERT_SQL_PG: &str =
    "INSERT INTO dpledger_revoked_tokens (jti, revoked_at) VALUES ($1, $2) ON CONFLICT (jti) DO NOTHING";

/// Every revoked id.
pub(crate) const SELECT_SQL: &str = "SELECT jti FROM dpledger_revoked_tokens";

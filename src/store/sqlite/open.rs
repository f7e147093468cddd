//! Opening a SQLite store defensively, because an empty ledger is the worst
//! possible misreading of a damaged file. A new store is initialised under a
//! temporary name and linked into place only when complete, so an existing file
//! at the path is always a complete store and anything else is refused: an
//! empty or short file, a header that is not SQLite's, a file shorter than its
//! header says, a foreign application id, a failed `PRAGMA quick_check`,
//! missing metadata. Also the schema, and the per-connection settings every
//! connection (writer, readers) gets.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::db_error;
use crate::store::{StoreError, SCHEMA_VERSION};

/// `PRAGMA application_id` of dpledger stores: ASCII `DPLG`.
pub(crate) const APPLICATION_ID: i32 = 0x4450_4c47;
/// Page size of new stores. Step payloads are tens of KiB; 16 KiB pages cut the
/// overflow-page chains and WAL frames per record by 4 compared with SQLite's 4 KiB
/// default (measured: ~40% more ingest throughput, see `benches/store.rs`), while a
/// small JSON event still costs only a few pages per commit.
const PAGE_SIZE: i64 = 16384;
/// How long a write waits for another process holding the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
const HEADER_LEN: usize = 100;

const SCHEMA_SQL: &str = "
    CREATE TABLE dpledger_meta (
        key   TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE dpledger_events (
        seq     INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        kind    INTEGER NOT NULL,
        step    INTEGER,
        part    INTEGER,
        payload BLOB NOT NULL,
        crc     INTEGER NOT NULL
    ) STRICT;
    CREATE UNIQUE INDEX dpledger_step_unique
        ON dpledger_events (dataset, step, coalesce(part, 0)) WHERE kind = 2;
";

/// Schema version 2 (snapshots, compactions, indexes); idempotent, run at every
/// open so that a version-1 store is upgraded in place.
const UPGRADE_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_snapshots (
        id       INTEGER PRIMARY KEY,
        dataset  TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        created  INTEGER NOT NULL,
        bytes    INTEGER NOT NULL,
        sha256   TEXT NOT NULL,
        pinned   INTEGER NOT NULL DEFAULT 0,
        complete INTEGER NOT NULL DEFAULT 0
    ) STRICT;
    CREATE TABLE IF NOT EXISTS dpledger_snapshot_chunks (
        snapshot INTEGER NOT NULL,
        idx      INTEGER NOT NULL,
        data     BLOB NOT NULL,
        PRIMARY KEY (snapshot, idx)
    ) STRICT;
    CREATE TABLE IF NOT EXISTS dpledger_compactions (
        dataset  TEXT PRIMARY KEY,
        upto     INTEGER NOT NULL,
        snapshot INTEGER NOT NULL,
        records  INTEGER NOT NULL,
        bytes    INTEGER NOT NULL,
        digest   BLOB NOT NULL,
        created  INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE IF NOT EXISTS dpledger_archive_blocks (
        dataset  TEXT NOT NULL,
        block    INTEGER NOT NULL,
        seq      INTEGER NOT NULL,
        crc      INTEGER NOT NULL,
        data     BLOB NOT NULL,
        PRIMARY KEY (dataset, block)
    ) STRICT;
    CREATE TABLE IF NOT EXISTS dpledger_archives (
        dataset  TEXT PRIMARY KEY,
        seq      INTEGER NOT NULL,
        blocks   INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX IF NOT EXISTS dpledger_events_dataset ON dpledger_events (dataset, seq);
    CREATE INDEX IF NOT EXISTS dpledger_events_created ON dpledger_events (seq) WHERE kind = 1;
    UPDATE dpledger_meta SET value = 2 WHERE key = 'schema_version' AND value < 2;
";

/// The writer's connection to the store at `path`: created when absent, every
/// check of the module note passed, WAL and `synchronous=FULL` on, the schema
/// upgraded to the current version.
pub(super) fn open_writer(path: &Path, store: &str) -> Result<Connection, StoreError> {
    match fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(StoreError::NotAStore {
                store: store.to_string(),
                detail: format!(
                    "the path is not a regular file but a {}",
                    if meta.is_dir() {
                        "directory"
                    } else {
                        "special file"
                    }
                ),
            })
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_store(path, store)?,
        Err(e) => return Err(io_error(store, "cannot access the store file", &e)),
    }
    check_file(path, store)?;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| db_error(store, "cannot open the database", &e))?;
    configure(&conn, store)?;
    check_database(&conn, store)?;
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE; {UPGRADE_SQL} {} {} COMMIT;",
        crate::store::idempotency::SQLITE_TABLE_SQL,
        crate::store::revocation::SQLITE_TABLE_SQL
    ))
    .map_err(|e| db_error(store, "cannot upgrade the schema to version 2", &e))?;
    Ok(conn)
}

/// Applies the per-connection settings and checks that WAL mode is on.
fn configure(conn: &Connection, store: &str) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_error(store, "cannot set busy_timeout", &e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| db_error(store, "cannot enable WAL mode", &e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend {
            store: store.to_string(),
            detail: format!("cannot enable WAL mode (journal_mode is {mode:?})"),
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| db_error(store, "cannot set synchronous=FULL", &e))?;
    Ok(())
}

/// Checks the raw file before SQLite sees it: SQLite would happily treat an empty
/// file as a new database, and reports short files vaguely.
fn check_file(path: &Path, store: &str) -> Result<(), StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        store: store.to_string(),
        seq: None,
        detail,
    };
    let mut file = fs::File::open(path).map_err(|e| io_error(store, "cannot open", &e))?;
    let len = file
        .metadata()
        .map_err(|e| io_error(store, "cannot stat", &e))?
        .len();
    if len == 0 {
        return Err(corrupt(
            "the file is empty (0 bytes); a dpledger store is never empty, so it was truncated \
             or replaced. Restore it from a backup, or delete it to start a new, empty ledger"
                .into(),
        ));
    }
    let mut header = Vec::with_capacity(HEADER_LEN);
    file.by_ref()
        .take(HEADER_LEN as u64)
        .read_to_end(&mut header)
        .map_err(|e| io_error(store, "cannot read the header", &e))?;
    if header.len() < HEADER_LEN || &header[..16] != SQLITE_MAGIC {
        let shown: Vec<String> = header.iter().take(16).map(|b| format!("{b:02x}")).collect();
        return Err(corrupt(format!(
            "not a SQLite database: {len} bytes starting with [{}] instead of \
             \"SQLite format 3\\0\" (damaged, truncated, or not a dpledger store)",
            shown.join(" ")
        )));
    }
    // Page size (offset 16, big-endian; 1 means 65536), database size in pages
    // (offset 28, valid when the change counter at 24 equals offset 92).
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536u64,
        p => u64::from(p),
    };
    let counter = &header[24..28];
    let valid_for = &header[92..96];
    let pages = u64::from(u32::from_be_bytes([
        header[28], header[29], header[30], header[31],
    ]));
    let wal_len = fs::metadata(wal_path(path)).map(|m| m.len()).unwrap_or(0);
    // With a non-empty WAL a crash during a checkpoint can legitimately leave the
    // file shorter than its header says (the WAL still holds the pages).
    if wal_len == 0 && counter == valid_for && pages > 0 {
        let expected = pages.saturating_mul(page_size);
        if len < expected {
            return Err(corrupt(format!(
                "the file is truncated: its header says {pages} pages of {page_size} bytes \
                 ({expected} bytes) but it has {len} bytes"
            )));
        }
    }
    Ok(())
}

fn wal_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// Checks identity, integrity and schema version of an open database.
fn check_database(conn: &Connection, store: &str) -> Result<(), StoreError> {
    let app_id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| db_error(store, "cannot read the database header", &e))?;
    if app_id != APPLICATION_ID {
        return Err(StoreError::NotAStore {
            store: store.to_string(),
            detail: format!(
                "application id is {app_id:#010x}, dpledger stores have {APPLICATION_ID:#010x} \
                 (\"DPLG\"): another application's database, or a damaged header"
            ),
        });
    }
    let mut problems = Vec::new();
    {
        let mut stmt = conn
            .prepare("PRAGMA quick_check(20)")
            .map_err(|e| db_error(store, "PRAGMA quick_check failed", &e))?;
        let mut rows = stmt
            .query([])
            .map_err(|e| db_error(store, "PRAGMA quick_check failed", &e))?;
        loop {
            match rows.next() {
                Ok(Some(row)) => {
                    let line: String = row.get(0).unwrap_or_else(|e| format!("unreadable: {e}"));
                    problems.push(line);
                }
                Ok(None) => break,
                Err(e) => return Err(db_error(store, "PRAGMA quick_check failed", &e)),
            }
        }
    }
    if problems.len() != 1 || problems[0] != "ok" {
        return Err(StoreError::Corrupt {
            store: store.to_string(),
            seq: None,
            detail: format!("PRAGMA quick_check found: {}", problems.join("; ")),
        });
    }
    let tables: Vec<String> = {
        let mut stmt = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'dpledger_%'",
            )
            .map_err(|e| db_error(store, "cannot read the schema", &e))?;
        let names = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| db_error(store, "cannot read the schema", &e))?;
        names
    };
    for table in ["dpledger_meta", "dpledger_events"] {
        if !tables.iter().any(|t| t == table) {
            return Err(StoreError::NotAStore {
                store: store.to_string(),
                detail: format!("table {table} is missing"),
            });
        }
    }
    let meta = |key: &str| -> Result<Option<i64>, StoreError> {
        let mut stmt = conn
            .prepare("SELECT value FROM dpledger_meta WHERE key = ?1")
            .map_err(|e| db_error(store, "cannot read dpledger_meta", &e))?;
        let mut rows = stmt
            .query([key])
            .map_err(|e| db_error(store, "cannot read dpledger_meta", &e))?;
        match rows.next() {
            Ok(Some(row)) => row
                .get(0)
                .map(Some)
                .map_err(|e| db_error(store, "cannot read dpledger_meta", &e)),
            Ok(None) => Ok(None),
            Err(e) => Err(db_error(store, "cannot read dpledger_meta", &e)),
        }
    };
    check_versions(store, meta("schema_version")?, meta("last_seq")?)
}

/// Shared by both backends: the schema version must be known and `last_seq` present.
pub(crate) fn check_versions(
    store: &str,
    version: Option<i64>,
    last_seq: Option<i64>,
) -> Result<(), StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        store: store.to_string(),
        seq: None,
        detail,
    };
    match version {
        None => return Err(corrupt("dpledger_meta has no schema_version".into())),
        Some(v) if v < 1 => return Err(corrupt(format!("invalid schema_version {v}"))),
        Some(v) if v as u64 > SCHEMA_VERSION => {
            return Err(StoreError::NewerSchema {
                store: store.to_string(),
                found: v as u64,
                supported: SCHEMA_VERSION,
            })
        }
        Some(_) => {}
    }
    match last_seq {
        Some(v) if v >= 0 => Ok(()),
        Some(v) => Err(corrupt(format!("invalid dpledger_meta.last_seq {v}"))),
        None => Err(corrupt("dpledger_meta has no last_seq".into())),
    }
}

/// Creates a complete, empty store at `path` atomically: built under a temporary
/// name, synced, then hard-linked into place (which fails rather than replace a
/// store that another process created meanwhile).
fn create_store(path: &Path, store: &str) -> Result<(), StoreError> {
    // A WAL without its database is what remains of a store deleted or moved in
    // part. SQLite would replay it onto a new file; refuse instead.
    let wal = wal_path(path);
    if let Ok(meta) = fs::metadata(&wal) {
        if meta.len() > 0 {
            return Err(StoreError::Corrupt {
                store: store.to_string(),
                seq: None,
                detail: format!(
                    "the database file is missing but its write-ahead log {} ({} bytes) is \
                     present: restore the database file, or remove the log to start a new, \
                     empty ledger",
                    wal.display(),
                    meta.len()
                ),
            });
        }
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    fs::create_dir_all(&parent).map_err(|e| {
        io_error(
            store,
            &format!("cannot create directory {}", parent.display()),
            &e,
        )
    })?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = parent.join(format!(".{file_name}.init-{}-{nanos}", std::process::id()));
    let result = initialise(&tmp, store).and_then(|()| link_into_place(&tmp, path, store));
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = tmp.as_os_str().to_owned();
        p.push(suffix);
        let _ = fs::remove_file(PathBuf::from(p));
    }
    result?;
    if let Ok(dir) = fs::File::open(&parent) {
        let _ = dir.sync_all();
    }
    tracing::warn!(
        store,
        "created a new, empty event log (no store existed at this path)"
    );
    Ok(())
}

fn initialise(tmp: &Path, store: &str) -> Result<(), StoreError> {
    // The log holds every example's history: readable only by this user, like
    // the server secret. SQLite gives its -wal and -shm files the database
    // file's permissions.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| io_error(store, "cannot create the database file", &e))?;
    }
    let conn = Connection::open_with_flags(
        tmp,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| db_error(store, "cannot create the database", &e))?;
    let init = |conn: &Connection| -> rusqlite::Result<()> {
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        conn.pragma_update(None, "application_id", APPLICATION_ID)?;
        Ok(())
    };
    init(&conn).map_err(|e| db_error(store, "cannot initialise the database", &e))?;
    configure(&conn, store)?;
    let sql = format!(
        "BEGIN; {SCHEMA_SQL} INSERT INTO dpledger_meta (key, value) VALUES \
         ('schema_version', {SCHEMA_VERSION}), ('last_seq', 0); {UPGRADE_SQL} COMMIT;"
    );
    conn.execute_batch(&sql)
        .map_err(|e| db_error(store, "cannot create the tables", &e))?;
    // Closing the last connection checkpoints the WAL into the file and removes it.
    conn.close()
        .map_err(|(_, e)| db_error(store, "cannot close the new database", &e))?;
    let file =
        fs::File::open(tmp).map_err(|e| io_error(store, "cannot reopen the new file", &e))?;
    file.sync_all()
        .map_err(|e| io_error(store, "cannot sync the new file", &e))?;
    Ok(())
}

fn link_into_place(tmp: &Path, path: &Path, store: &str) -> Result<(), StoreError> {
    match fs::hard_link(tmp, path) {
        Ok(()) => Ok(()),
        // Another process created the store first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        // File systems without hard links: rename, which is atomic but could replace
        // a store created in the last microseconds by another process.
        Err(_) => {
            if path.exists() {
                return Ok(());
            }
            fs::rename(tmp, path)
                .map_err(|e| io_error(store, "cannot move the new store into place", &e))
        }
    }
}

/// A read-only connection of its own (loads and snapshot reads run beside the
/// writer thread).
pub(super) fn open_reader(path: &Path, store: &str) -> Result<Connection, StoreError> {
    let conn = open_connection(path, store)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| db_error(store, "cannot set query_only", &e))?;
    Ok(conn)
}

/// A connection of its own to an existing store, waiting for the writer's locks.
pub(super) fn open_connection(path: &Path, store: &str) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| db_error(store, "cannot open the database", &e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| db_error(store, "cannot set busy_timeout", &e))?;
    Ok(conn)
}

fn io_error(store: &str, context: &str, e: &std::io::Error) -> StoreError {
    StoreError::Backend {
        store: store.to_string(),
        detail: format!("{context}: {e}"),
    }
}

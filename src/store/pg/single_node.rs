//! One single-node server per PostgreSQL store.
//!
//! A server that is not in cluster mode keeps every dataset of the store in its
//! memory and assumes no one else appends; a second such server on the same
//! store would answer from ledgers that lag the first one's writes. So a
//! single-node server holds a session-level advisory lock, keyed by the store's
//! schema, on a dedicated connection for as long as it runs, and a second one
//! refuses to start, naming the holder (its `application_name` carries the pid
//! and host). Cluster nodes take no such lock: they share a store by design,
//! through leases and fencing. PostgreSQL releases the lock when the holder's
//! session ends (a crash included), so nothing stale is left behind.
//!
//! The connection is checked every few seconds; if it was lost (a database
//! restart), the lock is taken again on a new one, and if another server took
//! it meanwhile an error is logged every time it is checked.

use std::time::Duration;

use postgres::{Client, Config, NoTls};

use crate::store::{redact_url, StoreError};

/// First key of the two-key advisory lock (ASCII `DPLS`); the second is the
/// hash of the store's schema, so that stores in different schemas of one
/// database do not exclude each other.
const SINGLE_NODE_CLASS: i32 = 0x4450_4c53;

/// How long a start waits for the lock before refusing (the session of a
/// server killed just before may still be ending).
const RESTART_PATIENCE: Duration = Duration::from_secs(3);

/// How often the lock's connection is checked.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The held lock; the connection (and so the lock) lives as long as this does.
#[derive(Debug)]
pub struct SingleNodeLock {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for SingleNodeLock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn config_for(url: &str) -> Result<Config, StoreError> {
    let mut config: Config = url.parse().map_err(|e| StoreError::InvalidUrl {
        url: redact_url(url),
        reason: format!("{e}"),
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    config.application_name(&format!("dpledger serve pid {} {host}", std::process::id()));
    Ok(config)
}

fn backend(url: &str, context: &str, e: &postgres::Error) -> StoreError {
    StoreError::Backend {
        store: redact_url(url),
        detail: format!("{context}: {e}"),
    }
}

/// Take the lock on `client`: `Ok(None)` when taken, `Ok(Some(holder))` when
/// another session holds it.
fn try_lock(client: &mut Client) -> Result<Option<String>, postgres::Error> {
    let taken: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext(current_schema()))",
            &[&SINGLE_NODE_CLASS],
        )?
        .get(0);
    if taken {
        return Ok(None);
    }
    // Best effort: who holds it (visible to the same database user).
    let holder = client
        .query_opt(
            "SELECT coalesce(a.application_name, '') || ' (backend pid ' || a.pid || \
                    coalesce(', client ' || host(a.client_addr), '') || ')' \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
               AND l.classid = $1::int4::oid \
               AND l.objid = hashtext(current_schema())::oid \
               AND l.objsubid = 2 \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&SINGLE_NODE_CLASS],
        )
        .ok()
        .flatten()
        .and_then(|row| row.try_get::<_, String>(0).ok())
        .unwrap_or_else(|| "another session".into());
    Ok(Some(holder))
}

/// Hold the single-node lock of the store at `url` for as long as the returned
/// guard lives; refuse when another single-node server holds it. Blocking: call
/// it outside any tokio runtime (the `postgres` client runs its own).
pub fn hold_single_node_lock(url: &str) -> Result<SingleNodeLock, StoreError> {
    let config = config_for(url)?;
    let mut client = config
        .connect(NoTls)
        .map_err(|e| backend(url, "cannot connect for the single-node lock", &e))?;
    // A server restarted right after it was killed: its old session may take a
    // moment to notice and end, so try for a few seconds before refusing.
    let patience = std::time::Instant::now() + RESTART_PATIENCE;
    let holder = loop {
        match try_lock(&mut client)
            .map_err(|e| backend(url, "cannot take the single-node lock", &e))?
        {
            None => break None,
            Some(h) if std::time::Instant::now() >= patience => break Some(h),
            Some(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    if let Some(holder) = holder {
        return Err(StoreError::Backend {
            store: redact_url(url),
            detail: format!(
                "another single-node dpledger server holds this store: {holder}; stop it \
                 first, or run every server with --cluster (docs/cluster.md)"
            ),
        });
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let url = url.to_string();
    std::thread::Builder::new()
        .name("dpledger-single-node-lock".into())
        .spawn(move || keep(client, config, &url, &flag))
        .map_err(|e| StoreError::Backend {
            store: "postgres".into(),
            detail: format!("cannot start the lock thread: {e}"),
        })?;
    Ok(SingleNodeLock { stop })
}

/// Keep the lock's session alive; take the lock again after a lost connection.
fn keep(mut client: Client, config: Config, url: &str, stop: &std::sync::atomic::AtomicBool) {
    let mut held = true;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(CHECK_EVERY);
        if held && client.is_valid(Duration::from_secs(5)).is_ok() {
            continue;
        }
        match config.connect(NoTls) {
            Ok(mut fresh) => match try_lock(&mut fresh) {
                Ok(None) => {
                    if !held {
                        tracing::info!("the single-node lock is held again");
                    }
                    held = true;
                    client = fresh;
                }
                Ok(Some(holder)) => {
                    held = false;
                    tracing::error!(
                        store = %redact_url(url),
                        %holder,
                        "lost the single-node lock after a lost connection, and another \
                         server holds it now: stop one of the two"
                    );
                }
                Err(e) => {
                    held = false;
                    tracing::warn!(error = %e, "cannot take the single-node lock again");
                }
            },
            Err(e) => {
                held = false;
                tracing::warn!(error = %e, "the single-node lock's connection is lost");
            }
        }
    }
}

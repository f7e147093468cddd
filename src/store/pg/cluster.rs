//! The SQL of cluster coordination (see `store::cluster`): the node registry,
//! the leases and the fencing trigger. Async (`tokio-postgres`, the driver the
//! blocking `postgres` crate wraps) because the lease manager runs on the
//! server's runtime, where the blocking client must not be used. One
//! connection, re-made when it breaks; every statement is bounded by
//! `statement_timeout` so a stuck database cannot hang a renewal forever.

use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};

use crate::store::{redact_url, StoreError};

/// SQLSTATE raised by the fencing trigger (class `DP`, not used by PostgreSQL).
pub(crate) const FENCED_SQLSTATE: &str = "DPF01";

/// Takes the transaction-scoped lock of a dataset name, so that a plain and a
/// sharded creation of one name (`claim_new`, `pg/shards.rs`) serialise.
pub(super) const NAME_LOCK_SQL: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('dpledger.name.' || $1, 0))";

/// `pg_advisory_xact_lock` key serialising the cluster set-up across nodes.
const CLUSTER_INIT_LOCK_KEY: i64 = 0x6470_6c63_6c75_7374;

const CLUSTER_SCHEMA_SQL: &str = "
    CREATE TABLE IF NOT EXISTS dpledger_nodes (
        node_id     TEXT PRIMARY KEY,
        advertise   TEXT NOT NULL,
        heartbeat   TIMESTAMPTZ NOT NULL,
        draining    BOOLEAN NOT NULL DEFAULT false,
        memory_free BIGINT
    );
    ALTER TABLE dpledger_nodes ADD COLUMN IF NOT EXISTS ledger_bytes BIGINT;
    CREATE TABLE IF NOT EXISTS dpledger_leases (
        dataset    TEXT PRIMARY KEY,
        owner      TEXT,
        epoch      BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    ALTER TABLE dpledger_events ADD COLUMN IF NOT EXISTS epoch BIGINT;
    CREATE TABLE IF NOT EXISTS dpledger_shards (
        dataset  TEXT PRIMARY KEY,
        examples BIGINT NOT NULL,
        shards   INT NOT NULL,
        spec     TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS dpledger_decisions (
        id      TEXT PRIMARY KEY,
        outcome TEXT NOT NULL,
        created TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS dpledger_decisions_created ON dpledger_decisions (created);
    CREATE TABLE IF NOT EXISTS dpledger_node_secret (
        id     SMALLINT PRIMARY KEY CHECK (id = 1),
        secret BYTEA NOT NULL
    );
    CREATE OR REPLACE FUNCTION dpledger_fence() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        current_epoch BIGINT;
    BEGIN
        SELECT epoch INTO current_epoch FROM dpledger_leases
            WHERE dataset = NEW.dataset FOR SHARE;
        IF NEW.epoch IS NULL OR current_epoch IS NULL OR current_epoch <> NEW.epoch THEN
            RAISE EXCEPTION 'write to dataset % fenced: writer epoch %, current epoch %',
                NEW.dataset, NEW.epoch, current_epoch USING ERRCODE = 'DPF01';
        END IF;
        RETURN NEW;
    END $$;
    CREATE OR REPLACE TRIGGER dpledger_fence BEFORE INSERT ON dpledger_events
        FOR EACH ROW EXECUTE FUNCTION dpledger_fence();
    INSERT INTO dpledger_leases (dataset, owner, epoch, expires_at)
        SELECT dataset, NULL, 0, '-infinity' FROM dpledger_events WHERE kind = 1
        ON CONFLICT (dataset) DO NOTHING;
";

/// What a node reports of its memory at each heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMemory {
    /// Memory available for new datasets, in bytes (`None`: unknown).
    pub free: Option<u64>,
    /// Memory its ledgers in memory use, in bytes.
    pub ledger_bytes: u64,
}

/// One node as registered.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    /// Its id (`--node-id`).
    pub node_id: String,
    /// The URL other nodes and clients reach it at.
    pub advertise: String,
    /// Milliseconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: i64,
    /// Set when it was asked to hand its datasets over.
    pub draining: bool,
    /// Memory it reported free for new datasets, in bytes.
    pub memory_free: Option<i64>,
    /// Memory its ledgers in memory use, in bytes (the storage report's figure).
    pub ledger_bytes: Option<i64>,
}

/// One dataset's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    /// The dataset.
    pub dataset: String,
    /// The holder (`None`: released, anyone may take it).
    pub owner: Option<String>,
    /// The holder's advertised URL, when the holder is registered.
    pub advertise: Option<String>,
    /// Bumped at every takeover; the log's records carry it.
    pub epoch: u64,
    /// Milliseconds until it expires by the database's clock (negative: expired).
    pub expires_in_ms: i64,
}

/// A connection to the coordination tables; see the module documentation.
pub struct ClusterDb {
    config: Config,
    name: String,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl std::fmt::Debug for ClusterDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterDb")
            .field("store", &self.name)
            .finish()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl ClusterDb {
    /// Connects to the store's database (`postgres://...`, the same URL as the
    /// store) and creates the coordination tables and the fencing trigger when
    /// absent. `timeout` bounds every statement.
    pub async fn connect(url: &str, timeout: Duration) -> Result<ClusterDb, StoreError> {
        let name = redact_url(url);
        let mut config: Config = url.parse().map_err(|e| StoreError::InvalidUrl {
            url: name.clone(),
            reason: format!("{e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeout);
        }
        config.application_name("dpledger-cluster");
        let millis = timeout.as_millis().max(1);
        let existing = config.get_options().unwrap_or("").to_string();
        // A transaction left open by a frozen process (SIGSTOP, a partition)
        // would hold its locks (a cross-shard commit holds `last_seq`, which
        // every writer needs) until TCP gives up: the server ends it instead.
        config.options(
            format!(
                "{existing} -c statement_timeout={millis} \
                 -c idle_in_transaction_session_timeout={millis}"
            )
            .trim(),
        );
        let db = ClusterDb {
            config,
            name,
            client: tokio::sync::Mutex::new(None),
        };
        db.init().await?;
        Ok(db)
    }

    fn backend(&self, context: &str, e: &tokio_postgres::Error) -> StoreError {
        let mut detail = format!("{context}: {e}");
        if let Some(db) = e.as_db_error() {
            detail.push_str(&format!(": {} ({})", db.message(), db.code().code()));
        }
        StoreError::Backend {
            store: self.name.clone(),
            detail,
        }
    }

    /// Runs `f` on the connection, connecting first when there is none; a
    /// broken connection is dropped so that the next call reconnects.
    pub(super) async fn with_client<T>(
        &self,
        context: &str,
        f: impl for<'c> FnOnce(
            &'c mut Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + Send + 'c>,
        >,
    ) -> Result<T, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            let (client, connection) = self
                .config
                .connect(NoTls)
                .await
                .map_err(|e| self.backend("cannot connect", &e))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "the cluster connection closed");
                }
            });
            *guard = Some(client);
        }
        let Some(client) = guard.as_mut() else {
            unreachable!("connected above")
        };
        let result = f(client).await;
        if client.is_closed() {
            *guard = None;
        }
        result.map_err(|e| self.backend(context, &e))
    }

    async fn init(&self) -> Result<(), StoreError> {
        self.with_client("cannot create the cluster tables", |c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                tx.execute(
                    "SELECT pg_advisory_xact_lock($1)",
                    &[&CLUSTER_INIT_LOCK_KEY],
                )
                .await?;
                tx.batch_execute(CLUSTER_SCHEMA_SQL).await?;
                tx.commit().await
            })
        })
        .await
    }

    /// Registers the node or refreshes its heartbeat, advertised URL, free
    /// memory and the memory its ledgers use; answers whether it was asked to
    /// drain.
    pub async fn heartbeat(
        &self,
        node: &str,
        advertise: &str,
        memory: NodeMemory,
    ) -> Result<bool, StoreError> {
        let (node, advertise) = (node.to_string(), advertise.to_string());
        let big = |m: u64| m.min(i64::MAX as u64) as i64;
        let (memory, ledgers) = (memory.free.map(big), big(memory.ledger_bytes));
        self.with_client("cannot write the heartbeat", move |c| {
            Box::pin(async move {
                let row = c
                    .query_one(
                        "INSERT INTO dpledger_nodes (node_id, advertise, heartbeat, memory_free, \
                         ledger_bytes) VALUES ($1, $2, now(), $3, $4) \
                         ON CONFLICT (node_id) DO UPDATE SET advertise = $2, heartbeat = now(), \
                         memory_free = $3, ledger_bytes = $4 RETURNING draining",
                        &[&node, &advertise, &memory, &ledgers],
                    )
                    .await?;
                row.try_get(0)
            })
        })
        .await
    }

    /// Clears the node's draining flag (a restarted node serves again).
    pub async fn set_draining(&self, node: &str, draining: bool) -> Result<bool, StoreError> {
        let node = node.to_string();
        self.with_client("cannot set the draining flag", move |c| {
            Box::pin(async move {
                let n = c
                    .execute(
                        "UPDATE dpledger_nodes SET draining = $2 WHERE node_id = $1",
                        &[&node, &draining],
                    )
                    .await?;
                Ok(n > 0)
            })
        })
        .await
    }

    /// Extends every lease `node` holds to `now() + ttl`, answering the leases
    /// it still holds (a lease it lost is absent).
    pub async fn renew(&self, node: &str, ttl: Duration) -> Result<Vec<(String, u64)>, StoreError> {
        let node = node.to_string();
        let ttl = ms(ttl);
        self.with_client("cannot renew the leases", move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "UPDATE dpledger_leases SET expires_at = now() + $2::float8 * interval '1 millisecond' \
                         WHERE owner = $1 RETURNING dataset, epoch",
                        &[&node, &ttl],
                    )
                    .await?;
                rows.iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get::<_, i64>(1)? as u64)))
                    .collect()
            })
        })
        .await
    }

    /// Takes up to `limit` expired (or released) leases for `node`, bumping
    /// their epochs; answers them. Rows locked by another taker are skipped.
    pub async fn acquire_expired(
        &self,
        node: &str,
        ttl: Duration,
        limit: i64,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.acquire_expired_for(node, ttl, limit, Duration::ZERO)
            .await
    }

    /// Like [`ClusterDb::acquire_expired`], taking only leases expired for at
    /// least `grace`: a node already holding its fair share leaves a fresh
    /// vacancy to the nodes below it, and steps in only when none did.
    pub async fn acquire_expired_for(
        &self,
        node: &str,
        ttl: Duration,
        limit: i64,
        grace: Duration,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let node = node.to_string();
        let ttl = ms(ttl);
        let grace = ms(grace);
        self.with_client("cannot acquire leases", move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "UPDATE dpledger_leases l SET owner = $1, epoch = l.epoch + 1, \
                         expires_at = now() + $2::float8 * interval '1 millisecond' \
                         WHERE l.dataset IN (SELECT dataset FROM dpledger_leases \
                            WHERE expires_at < now() - $4::float8 * interval '1 millisecond' \
                            ORDER BY expires_at, dataset LIMIT $3 \
                            FOR UPDATE SKIP LOCKED) \
                         AND l.expires_at < now() RETURNING l.dataset, l.epoch",
                        &[&node, &ttl, &limit, &grace],
                    )
                    .await?;
                rows.iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get::<_, i64>(1)? as u64)))
                    .collect()
            })
        })
        .await
    }

    /// The lease of a dataset being created by `node`: a new lease at epoch 1,
    /// or `node`'s own lease if it already holds one (a retried creation).
    /// `None`: another node holds it, or held it (the dataset exists).
    pub async fn claim_new(
        &self,
        dataset: &str,
        node: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let (dataset, node) = (dataset.to_string(), node.to_string());
        let ttl = ms(ttl);
        self.with_client("cannot claim a lease", move |c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                // A sharded dataset's name is taken in `dpledger_shards` under
                // the same lock (`pg/shards.rs`): one of two racing creations
                // of a name, sharded or not, sees the other.
                tx.execute(NAME_LOCK_SQL, &[&dataset]).await?;
                let sharded = tx
                    .query_opt(
                        "SELECT 1 FROM dpledger_shards WHERE dataset = $1",
                        &[&dataset],
                    )
                    .await?;
                if sharded.is_some() {
                    return Ok(None);
                }
                let row = tx
                    .query_opt(
                        "INSERT INTO dpledger_leases (dataset, owner, epoch, expires_at) \
                         VALUES ($1, $2, 1, now() + $3::float8 * interval '1 millisecond') \
                         ON CONFLICT (dataset) DO UPDATE SET expires_at = EXCLUDED.expires_at \
                         WHERE dpledger_leases.owner = $2 AND dpledger_leases.expires_at > now() \
                         RETURNING epoch",
                        &[&dataset, &node, &ttl],
                    )
                    .await?;
                let epoch = row
                    .map(|r| r.try_get::<_, i64>(0).map(|e| e as u64))
                    .transpose()?;
                tx.commit().await?;
                Ok(epoch)
            })
        })
        .await
    }

    /// Gives a lease up (handover): expired at once (`now()`, so that takers
    /// can tell a fresh vacancy from an old one), owner cleared, epoch kept
    /// (the next taker bumps it). Only the holder at `epoch` can release.
    pub async fn release(&self, dataset: &str, node: &str, epoch: u64) -> Result<bool, StoreError> {
        let (dataset, node) = (dataset.to_string(), node.to_string());
        let epoch = epoch as i64;
        self.with_client("cannot release a lease", move |c| {
            Box::pin(async move {
                let n = c
                    .execute(
                        "UPDATE dpledger_leases SET owner = NULL, expires_at = now() \
                         WHERE dataset = $1 AND owner = $2 AND epoch = $3",
                        &[&dataset, &node, &epoch],
                    )
                    .await?;
                Ok(n > 0)
            })
        })
        .await
    }

    /// Every lease with its holder's advertised URL, by dataset.
    pub async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.with_client("cannot read the leases", |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT l.dataset, l.owner, n.advertise, l.epoch, \
                         CASE WHEN l.expires_at = '-infinity' THEN -1 ELSE \
                         (extract(epoch FROM (l.expires_at - now())) * 1000)::int8 END \
                         FROM dpledger_leases l LEFT JOIN dpledger_nodes n ON n.node_id = l.owner \
                         ORDER BY l.dataset",
                        &[],
                    )
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(LeaseRow {
                            dataset: r.try_get(0)?,
                            owner: r.try_get(1)?,
                            advertise: r.try_get(2)?,
                            epoch: r.try_get::<_, i64>(3)? as u64,
                            expires_in_ms: r.try_get(4)?,
                        })
                    })
                    .collect()
            })
        })
        .await
    }

    /// Every registered node, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        self.with_client("cannot read the nodes", |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT node_id, advertise, \
                         (extract(epoch FROM (now() - heartbeat)) * 1000)::int8, draining, memory_free, \
                         ledger_bytes \
                         FROM dpledger_nodes ORDER BY node_id",
                        &[],
                    )
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(NodeRow {
                            node_id: r.try_get(0)?,
                            advertise: r.try_get(1)?,
                            heartbeat_age_ms: r.try_get(2)?,
                            draining: r.try_get(3)?,
                            memory_free: r.try_get(4)?,
                            ledger_bytes: r.try_get(5)?,
                        })
                    })
                    .collect()
            })
        })
        .await
    }
}

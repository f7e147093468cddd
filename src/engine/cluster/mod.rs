//! Cluster mode: this node's identity and leases, and how datasets
//! come and go from its memory. PostgreSQL is the coordinator (`store::cluster`):
//! each dataset has one lease with an epoch; this node serves a dataset only
//! while it holds the lease, loads it (snapshot + log) when it takes the lease,
//! and drops it from memory when it loses it. Every write carries the epoch the
//! dataset was loaded under, and the database refuses a stale one, so a node
//! that lost a lease without noticing (paused, partitioned) cannot change the
//! log; see `docs/cluster.md` for the whole argument.
//!
//! | file | its one job |
//! |---|---|
//! | `mod.rs` | [`ClusterNode`]: identity, lease validity, adopting and losing datasets, the cluster view |
//! | `leases.rs` | the lease loop: heartbeat, renewal, takeover of expired leases, drain, rebalancing |
//! | `placement.rs` | where a new dataset or shard goes (most free memory; shards spread in turn), fair shares, the node's memory figures |
//! | `node_mark.rs` | the node mark: an HMAC with the cluster's secret that only nodes can put on a node-to-node call |
//! | `unknown.rs` | a short-lived negative cache of dataset names that exist nowhere |

mod leases;
mod node_mark;
mod placement;
mod unknown;

pub use node_mark::{unix_ms, MarkRefusal, NodeMarks, MARK_WINDOW};
pub use placement::{choose_node, Share};

use super::error::{EngineError, EngineResult};
use super::shard_names::owning_dataset;
use super::{Dataset, Engine, SnapshotPolicy};
use crate::store::cluster::{ClusterDb, LeaseRow, NodeMemory, NodeRow};
use crate::store::{Store, StoreError};
use dashmap::DashMap;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A dataset's lease as routing and the cluster map see it: the engine's own,
/// read from the store's row at the boundary (`ClusterNode::read_leases`),
/// so that callers above the engine never name a store type.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
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

/// A node of the cluster as the cluster map shows it: the engine's own, read
/// from the store's row at the boundary ([`ClusterNode::view`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
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
    /// Memory its ledgers in memory use, in bytes.
    pub ledger_bytes: Option<i64>,
}

impl From<NodeRow> for Node {
    fn from(row: NodeRow) -> Node {
        Node {
            node_id: row.node_id,
            advertise: row.advertise,
            heartbeat_age_ms: row.heartbeat_age_ms,
            draining: row.draining,
            memory_free: row.memory_free,
            ledger_bytes: row.ledger_bytes,
        }
    }
}

impl From<LeaseRow> for Lease {
    fn from(row: LeaseRow) -> Lease {
        Lease {
            dataset: row.dataset,
            owner: row.owner,
            advertise: row.advertise,
            epoch: row.epoch,
            expires_in_ms: row.expires_in_ms,
        }
    }
}

/// How this node takes part in a cluster (`dpledger serve --cluster`).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Unique id of this node (one process per id at a time).
    pub node_id: String,
    /// The URL other nodes forward requests to and clients are told about.
    pub advertise: String,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Memory this node offers to ledgers (`None`: what the machine has
    /// available), for placement.
    pub memory_bytes: Option<u64>,
}

/// This node's part of the cluster; see the module documentation.
#[derive(Debug)]
pub struct ClusterNode {
    /// Identity and lease length.
    pub config: ClusterConfig,
    pub(in crate::engine) db: ClusterDb,
    /// Until when (by this process's monotonic clock) every lease this node
    /// renewed is certainly still valid in the database: the instant the last
    /// successful renewal was *sent*, plus the TTL, minus a safety margin.
    valid_until: Mutex<Option<Instant>>,
    /// Set when this node hands its datasets over (drain, SIGTERM).
    draining: AtomicBool,
    /// Datasets whose leases this node took and is loading.
    adopting: Mutex<HashSet<String>>,
    /// The leases as last read and when, for routing (refreshed by the lease
    /// loop every quarter TTL).
    leases: Mutex<(Option<Instant>, Vec<Lease>)>,
    /// The nodes as last read (heartbeats and memory), for placement.
    nodes: Mutex<Vec<NodeRow>>,
    /// Signalled when a draining node holds no dataset any more.
    drained: tokio::sync::Notify,
    /// The connection of changes across shards (not the lease loop's, so
    /// that a commit or a decision never holds up a lease renewal).
    pub(in crate::engine) changes: ClusterDb,
    /// The cluster's key of node marks (never logged: `Debug` redacts it).
    marks: NodeMarks,
    /// Dataset names found to exist nowhere, lately (routing's negative cache).
    unknown: unknown::UnknownIds,
}

/// Bound of each statement of a commit across shards or of a decision (on
/// their own connection, [`ClusterNode::changes`]).
pub(in crate::engine) const CHANGE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Records replayed by a takeover's load from which the new owner writes a
/// snapshot at once (see `Engine::adopt`): half what the snapshot policy lets
/// accumulate between snapshots, and at most 1,000 (replaying a thousand steps
/// of a large batch costs seconds, about what loading a snapshot of 10^6
/// examples does).
fn takeover_snapshot_after(policy: &SnapshotPolicy) -> u64 {
    match policy.every_records {
        0 => 1_000,
        every => (every / 2).clamp(1, 1_000),
    }
}

/// The refusal of a request for a dataset this node does not serve.
pub(crate) fn not_owner(id: &str) -> EngineError {
    EngineError::NotOwner(format!(
        "this node does not serve dataset {id:?} right now (its lease is elsewhere or moving): \
         retry, at the owner named in the cluster map (GET /v1/cluster)"
    ))
}

impl ClusterNode {
    /// Connects the coordination tables (`store_url` is the store's PostgreSQL
    /// URL) and gives up every lease a previous process with this node id held:
    /// they are taken again with a new epoch, so that nothing that process may
    /// still have in flight can land after this one loads.
    pub async fn connect(store_url: &str, config: ClusterConfig) -> anyhow::Result<ClusterNode> {
        anyhow::ensure!(
            config.lease_ttl >= Duration::from_millis(200),
            "--lease-ttl-ms must be at least 200"
        );
        let db = ClusterDb::connect(store_url, statement_timeout(config.lease_ttl)).await?;
        // Its own connection: a commit across shards or a decision that waits
        // for one must not hold up this node's lease renewals.
        let changes = ClusterDb::connect(store_url, CHANGE_STATEMENT_TIMEOUT).await?;
        // The cluster's secret: made by the first node, read by the others.
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
        let marks = NodeMarks::new(changes.node_secret(fresh).await?);
        let memory = NodeMemory {
            free: match (memory_free(), config.memory_bytes) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            ledger_bytes: 0,
        };
        db.heartbeat(&config.node_id, &config.advertise, memory)
            .await?;
        db.set_draining(&config.node_id, false).await?;
        let sent = Instant::now();
        for (dataset, epoch) in db.renew(&config.node_id, config.lease_ttl).await? {
            db.release(&dataset, &config.node_id, epoch).await?;
        }
        let nodes = db.nodes().await.unwrap_or_default();
        // The database answered: this node may create datasets at once.
        let valid_until = sent + config.lease_ttl - config.lease_ttl / 4;
        Ok(ClusterNode {
            config,
            db,
            valid_until: Mutex::new(Some(valid_until)),
            draining: AtomicBool::new(false),
            adopting: Mutex::new(HashSet::new()),
            leases: Mutex::new((None, Vec::new())),
            nodes: Mutex::new(nodes),
            drained: tokio::sync::Notify::new(),
            changes,
            marks,
            unknown: unknown::UnknownIds::default(),
        })
    }

    /// Whether this node's leases are certainly still valid (a paused or
    /// partitioned node stops serving before its leases can expire).
    pub fn leases_valid(&self) -> bool {
        let until = *self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        until.is_some_and(|t| Instant::now() < t)
    }

    /// The cluster's node marks: what this node puts on the node-to-node
    /// calls it makes and checks on those it receives (`node_mark.rs`).
    pub fn marks(&self) -> &NodeMarks {
        &self.marks
    }

    /// Whether this node is handing its datasets over.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts handing every dataset over (the lease loop does it, one by one).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Waits until a draining node holds no dataset.
    pub async fn wait_drained(&self) {
        self.drained.notified().await
    }

    /// The lease of a dataset being created here, at epoch 1 (the API sends a
    /// creation to the node [`ClusterNode::placement`] chooses, which creates
    /// it on itself; see `docs/cluster.md`).
    /// While the returned guard lives, the lease loop leaves the new lease
    /// alone (it is held but the dataset is not registered yet).
    pub(super) async fn claim_new(self: &Arc<Self>, id: &str) -> EngineResult<(u64, Creating)> {
        if self.is_draining() || !self.leases_valid() {
            return Err(not_owner(id));
        }
        self.forget_absent(id);
        self.adopting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string());
        let guard = Creating {
            node: self.clone(),
            id: id.to_string(),
        };
        match self
            .db
            .claim_new(id, &self.config.node_id, self.config.lease_ttl)
            .await
        {
            Ok(Some(epoch)) => {
                // Again: a request that read no lease just before the claim
                // may have remembered the name since.
                self.forget_absent(id);
                Ok((epoch, guard))
            }
            Ok(None) => Err(EngineError::conflict(format!(
                "dataset {id:?} already exists"
            ))),
            Err(e) => Err(EngineError::store(e)),
        }
    }

    /// The lease of `id` as last read (refreshed from the database when it is
    /// not known or expired), for routing.
    pub async fn lease_of(&self, id: &str) -> Option<Lease> {
        self.lease_lookup_cached(id).await.ok().flatten()
    }

    /// As [`ClusterNode::lease_of`], with a failed read of the database as
    /// `Err` rather than as no lease.
    pub async fn lease_lookup_cached(&self, id: &str) -> EngineResult<Option<Lease>> {
        let cached = {
            let cache = self.leases.lock().unwrap_or_else(|e| e.into_inner());
            let age = cache.0.map(|at| at.elapsed().as_millis() as i64);
            cache.1.iter().find(|l| l.dataset == id).cloned().zip(age)
        };
        // A cached lease of another node that is still live (its expiry read
        // minus the cache's age) routes without a round trip to the database.
        if let Some((lease, age)) = cached {
            let theirs = lease
                .owner
                .as_deref()
                .is_some_and(|o| o != self.config.node_id);
            if theirs && lease.expires_in_ms > age {
                return Ok(Some(lease));
            }
        }
        self.lease_lookup(id).await
    }

    /// Dataset `id`'s lease read from the database (as [`ClusterNode::lease_of`]
    /// without the cache): `Err` when the read failed, which is not "no lease"
    /// (routing's negative cache must not remember a name it could not read).
    pub async fn lease_lookup(&self, id: &str) -> EngineResult<Option<Lease>> {
        let fresh = self.read_leases().await.map_err(EngineError::store)?;
        let found = fresh.iter().find(|l| l.dataset == id).cloned();
        self.remember_leases(fresh);
        Ok(found)
    }

    pub(super) fn remember_leases(&self, leases: Vec<Lease>) {
        self.unknown.forget_leased(&leases);
        *self.leases.lock().unwrap_or_else(|e| e.into_inner()) = (Some(Instant::now()), leases);
    }

    /// Every node and every lease, from the database.
    pub async fn view(&self) -> EngineResult<(Vec<Node>, Vec<Lease>)> {
        let nodes = self.db.nodes().await.map_err(EngineError::store)?;
        let leases = self.read_leases().await.map_err(EngineError::store)?;
        Ok((nodes.into_iter().map(Node::from).collect(), leases))
    }

    /// Every lease, read from the database.
    pub(super) async fn read_leases(&self) -> Result<Vec<Lease>, StoreError> {
        let rows = self.db.leases().await?;
        Ok(rows.into_iter().map(Lease::from).collect())
    }

    /// Asks node `id` to drain (it sees the flag at its next heartbeat);
    /// `false` when no such node is registered.
    pub async fn request_drain(&self, id: &str) -> EngineResult<bool> {
        if id == self.config.node_id {
            self.start_draining();
        }
        self.db
            .set_draining(id, true)
            .await
            .map_err(EngineError::store)
    }
}

/// A dataset being created on this node (see [`ClusterNode::claim_new`]).
pub(super) struct Creating {
    node: Arc<ClusterNode>,
    id: String,
}

impl Drop for Creating {
    fn drop(&mut self) {
        self.node
            .adopting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Bound on every coordination statement: a third of the TTL, so that a slow
/// database shows up as a failed renewal well before the lease runs out.
fn statement_timeout(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// Memory available to new datasets (Linux `MemAvailable`), for placement and
/// the cluster view; `None` where it cannot be read.
pub fn memory_free() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

impl Engine {
    /// An engine for a cluster node: it starts with no dataset in memory and
    /// serves those whose leases its lease loop ([`Engine::run_cluster`]) takes.
    pub fn for_cluster(store: Arc<dyn Store>, node: ClusterNode) -> Engine {
        Engine {
            datasets: Arc::new(DashMap::new()),
            store,
            cluster: Some(Arc::new(node)),
            sharding: Default::default(),
        }
    }

    /// Every dataset of the deployment, sorted: in single-node mode those this
    /// process holds; in a cluster, every dataset created in the shared log,
    /// whichever node serves it now (so that any node lists the same).
    pub async fn all_dataset_ids(&self) -> EngineResult<Vec<String>> {
        if self.cluster.is_none() {
            return Ok(self.dataset_ids());
        }
        let store = self.store.clone();
        let starts = tokio::task::spawn_blocking(move || store.dataset_starts())
            .await
            .map_err(|_| EngineError::Internal("listing the datasets failed".into()))?
            .map_err(EngineError::store)?;
        // A shard is listed as its sharded dataset.
        let mut ids: Vec<String> = starts
            .into_iter()
            .map(|(id, _)| owning_dataset(&id).0.to_string())
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// This node's cluster part (`None`: single-node mode).
    pub fn cluster(&self) -> Option<&Arc<ClusterNode>> {
        self.cluster.as_ref()
    }

    /// Whether this node serves dataset `id` now: always in single-node mode
    /// (a missing dataset is then a 404 of the handler); in a cluster, only
    /// while it holds the dataset's lease.
    pub fn serves(&self, id: &str) -> bool {
        match &self.cluster {
            None => true,
            Some(node) => node.leases_valid() && self.datasets.contains_key(id),
        }
    }

    /// Drops `ds` from memory because its lease moved (a write was fenced, a
    /// renewal did not return it), answering the refusal for the request.
    pub(super) fn lose(&self, ds: &Dataset) -> EngineError {
        let removed = self
            .datasets
            .remove_if(&ds.id, |_, d| std::ptr::eq(Arc::as_ptr(d), ds));
        if removed.is_some() {
            tracing::warn!(
                dataset = ds.id,
                "lost the dataset's lease: no longer serving it"
            );
            metrics::counter!("dpledger_cluster_leases_lost_total").increment(1);
        }
        not_owner(&ds.id)
    }

    /// Loads dataset `id` (newest snapshot + its log after it) under lease
    /// `epoch` and starts serving it. When the load replayed a long tail of the
    /// log ([`takeover_snapshot_after`] records), a snapshot is written at once,
    /// in the background: the next takeover (another failure, a drain) would
    /// otherwise replay the same records again, and more, until the snapshot
    /// policy's count is reached.
    async fn adopt(&self, id: &str, epoch: u64, snapshots: SnapshotPolicy) -> EngineResult<()> {
        let started = Instant::now();
        let ds = self.reload(id).await?;
        ds.epoch.store(epoch, Ordering::Release);
        let replayed = ds.snapshot_mark().records_since;
        self.datasets.insert(id.to_string(), ds);
        if replayed >= takeover_snapshot_after(&snapshots) {
            let engine = self.clone();
            let id = id.to_string();
            tokio::spawn(async move {
                if let Err(e) = engine.snapshot(&id, snapshots.keep).await {
                    tracing::warn!(dataset = id, error = %e, "snapshot after a takeover failed");
                }
            });
        }
        metrics::counter!("dpledger_cluster_leases_taken_total").increment(1);
        tracing::info!(
            dataset = id,
            epoch,
            seconds = started.elapsed().as_secs_f64(),
            "took the dataset's lease and loaded it"
        );
        Ok(())
    }

    /// Hands dataset `id` over (drain): snapshot it so the next owner loads
    /// fast, stop serving it under its write lock (in-flight changes finish
    /// first), then release the lease for another node to take.
    async fn hand_over(&self, id: &str, keep: usize) {
        let Some(node) = self.cluster.clone() else {
            return;
        };
        if let Err(e) = self.snapshot(id, keep).await {
            tracing::warn!(dataset = id, error = %e, "snapshot before handover failed");
        }
        let Some(ds) = self.datasets.get(id).map(|d| d.clone()) else {
            return;
        };
        let guard = ds.ledger.write().await;
        self.datasets.remove_if(id, |_, d| Arc::ptr_eq(d, &ds));
        let epoch = ds.epoch.load(Ordering::Acquire);
        match node.db.release(id, &node.config.node_id, epoch).await {
            Ok(_) => tracing::info!(dataset = id, epoch, "handed the dataset over"),
            Err(e) => tracing::warn!(dataset = id, error = %e,
                "releasing the lease failed: it moves when it expires"),
        }
        drop(guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_takeover_snapshots_after_half_the_policy_count_at_most_a_thousand() {
        let with = |every_records| SnapshotPolicy {
            every_records,
            ..SnapshotPolicy::default()
        };
        assert_eq!(takeover_snapshot_after(&with(200)), 100);
        assert_eq!(takeover_snapshot_after(&with(10_000)), 1_000);
        assert_eq!(takeover_snapshot_after(&with(0)), 1_000);
        assert_eq!(takeover_snapshot_after(&with(1)), 1);
    }
}

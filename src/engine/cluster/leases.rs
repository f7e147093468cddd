//! The lease loop of a cluster node. Every quarter TTL it
//!
//! 1. writes its heartbeat (free memory, the ledgers' memory), learning whether
//!    it was asked to drain;
//! 2. renews every lease it holds in one statement; the renewal that succeeds
//!    moves the node's local serving deadline to *send time + TTL − margin*, and
//!    a dataset in memory whose lease did not come back is dropped; when renewals
//!    fail until the deadline passes, the node stops serving everything (it
//!    cannot know whether its leases still hold);
//! 3. takes expired leases (a dead owner's, or released ones) and loads those
//!    datasets, unless it is draining — up to its fair share at once, beyond it
//!    only vacancies nobody took for a TTL (`placement.rs`); a lease it holds
//!    but has not loaded (a failed load) is released with its epoch, to be
//!    taken again cleanly;
//! 4. when draining, hands its datasets over one by one, and says when none is
//!    left; when it holds more than its fair share while another node holds
//!    less (a node joined), hands one over instead of taking any.
//!
//! Every `PRUNE_EVERY` (10 minutes) it also deletes decided cross-shard changes older
//! than `DECISIONS_KEPT` (a day; the argument is at the constant), in the
//! background on the changes' own connection, so that renewals never wait.

use super::{ClusterNode, Share};
use crate::engine::{Engine, SnapshotPolicy};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Leases taken per round, so that a node starting among live ones, or the
/// survivors of a death, share the datasets instead of one taking all.
const TAKE_PER_ROUND: usize = 4;

/// Margin after a lease's expiry before trying to take it: the database's
/// test is strict (`expires_at < now()`), and the expiry read is a round old.
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// How often a node prunes old decisions of cross-shard changes.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Rows deleted per statement (each bounded by the statement timeout).
const PRUNE_BATCH: i64 = 10_000;

impl ClusterNode {
    /// Deletes decided cross-shard changes older than `DECISIONS_KEPT`, a
    /// batch at a time, until fewer than a batch are left.
    async fn prune_decisions(&self) {
        use crate::store::cluster::DECISIONS_KEPT;
        loop {
            match self
                .changes
                .prune_decisions(DECISIONS_KEPT, PRUNE_BATCH)
                .await
            {
                Ok(n) if n as i64 >= PRUNE_BATCH => continue,
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(deleted = n, "pruned old decisions of cross-shard changes");
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning old decisions of cross-shard changes failed");
                    return;
                }
            }
        }
    }
}

impl ClusterNode {
    /// How long until the soonest expiry, within `round`, of a lease another
    /// node holds (from the leases last read, their age deducted). A live
    /// owner renews every quarter TTL, so its lease never comes this close
    /// to expiring; one that does belongs to a dead or frozen owner.
    fn expiring_before(&self, round: Duration) -> Option<Duration> {
        let cache = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let age = cache.0?.elapsed().as_millis() as i64;
        let me = self.config.node_id.as_str();
        cache
            .1
            .iter()
            .filter(|l| l.owner.as_deref().is_some_and(|o| o != me))
            .map(|l| l.expires_in_ms - age)
            .filter(|&left| left >= 0 && (left as u128) < round.as_millis())
            .min()
            .map(|left| Duration::from_millis(left as u64) + EXPIRY_MARGIN)
    }
}

impl Engine {
    /// Runs the lease loop until the task is dropped (a no-op in single-node
    /// mode). `snapshots`: the snapshot policy (snapshots kept per dataset at
    /// a handover, and when a takeover snapshots at once).
    pub async fn run_cluster(&self, snapshots: SnapshotPolicy) {
        let Some(node) = self.cluster.clone() else {
            return;
        };
        let round = node.config.lease_ttl / 4;
        let mut tick = tokio::time::interval(round);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pruned: Option<Instant> = None;
        loop {
            tick.tick().await;
            self.cluster_round(&node, snapshots).await;
            if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                pruned = Some(Instant::now());
                let node = node.clone();
                tokio::spawn(async move { node.prune_decisions().await });
            }
            // A lease of another node that runs out before the next round (its
            // owner missed renewals: dead or frozen) is taken when it expires,
            // not up to a round later: detection costs the TTL, not TTL + TTL/4.
            if let Some(wait) = node.expiring_before(round) {
                tokio::time::sleep(wait).await;
                self.cluster_round(&node, snapshots).await;
                tick.reset();
            }
        }
    }

    async fn cluster_round(&self, node: &Arc<ClusterNode>, snapshots: SnapshotPolicy) {
        let me = node.config.node_id.as_str();
        let ttl = node.config.lease_ttl;
        match node
            .db
            .heartbeat(me, &node.config.advertise, self.node_memory())
            .await
        {
            Ok(true) if !node.is_draining() => {
                tracing::info!("asked to drain: handing every dataset over");
                node.start_draining();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
        let sent = Instant::now();
        match node.db.renew(me, ttl).await {
            Ok(held) => {
                let margin = ttl / 4;
                *node.valid_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(sent + ttl - margin);
                self.reconcile(node, held).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the leases failed");
                if !node.leases_valid() {
                    self.drop_all("the leases could not be renewed in time");
                }
            }
        }
        if !node.leases_valid() {
            return;
        }
        if node.is_draining() {
            if let Ok(nodes) = node.db.nodes().await {
                node.remember_nodes(nodes);
            }
            let next = self.datasets.iter().map(|e| e.key().clone()).next();
            match next {
                Some(id) => self.hand_over(&id, snapshots.keep).await,
                None => node.drained.notify_waiters(),
            }
        } else {
            self.share_round(node, snapshots).await;
        }
        if let Ok(leases) = node.read_leases().await {
            node.remember_leases(leases);
        }
        metrics::gauge!("dpledger_cluster_datasets_owned").set(self.datasets.len() as f64);
    }

    /// Takes vacant leases up to this node's fair share, or hands one dataset
    /// over when it holds more than its share while a node lacks work.
    async fn share_round(&self, node: &Arc<ClusterNode>, snapshots: SnapshotPolicy) {
        let me = node.config.node_id.as_str();
        let ttl = node.config.lease_ttl;
        let (nodes, leases) = match (node.db.nodes().await, node.read_leases().await) {
            (Ok(n), Ok(l)) => (n, l),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "reading the cluster failed");
                return;
            }
        };
        let share = Share::of(me, &nodes, &leases, ttl);
        node.remember_nodes(nodes);
        if share.surplus() {
            let adopting = node
                .adopting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut mine: Vec<String> = self
                .datasets
                .iter()
                .map(|e| e.key().clone())
                .filter(|id| !adopting.contains(id))
                .collect();
            mine.sort();
            if let Some(id) = mine.into_iter().next() {
                tracing::info!(
                    dataset = id,
                    owned = share.owned,
                    fair = share.ceil,
                    "rebalancing: handing a dataset over to a node with less"
                );
                metrics::counter!("dpledger_cluster_rebalanced_total").increment(1);
                self.hand_over(&id, snapshots.keep).await;
                return;
            }
        }
        let (limit, grace) = share.takes(TAKE_PER_ROUND, ttl);
        match node
            .db
            .acquire_expired_for(me, ttl, limit as i64, grace)
            .await
        {
            Ok(taken) => {
                for (id, epoch) in taken {
                    self.spawn_adopt(node, id, epoch, snapshots);
                }
            }
            Err(e) => tracing::warn!(error = %e, "taking expired leases failed"),
        }
    }

    /// Drops from memory every dataset whose lease (at its epoch) did not come
    /// back from the renewal, and releases leases held but not loaded.
    async fn reconcile(&self, node: &Arc<ClusterNode>, held: Vec<(String, u64)>) {
        let held: HashMap<String, u64> = held.into_iter().collect();
        // A dataset being created holds a lease the renewal may have missed
        // (claimed while it ran): it is left alone until the next round.
        let creating = node
            .adopting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let lost: Vec<String> = self
            .datasets
            .iter()
            .filter(|e| !creating.contains(e.key()))
            .filter(|e| held.get(e.key()) != Some(&e.value().epoch.load(Ordering::Acquire)))
            .map(|e| e.key().clone())
            .collect();
        for id in lost {
            if let Some(ds) = self.datasets.get(&id).map(|d| d.clone()) {
                let _ = self.lose(&ds);
            }
        }
        let orphans: Vec<(String, u64)> = {
            let adopting = node.adopting.lock().unwrap_or_else(|e| e.into_inner());
            held.into_iter()
                .filter(|(id, _)| !self.datasets.contains_key(id) && !adopting.contains(id))
                .collect()
        };
        for (id, epoch) in orphans {
            if node
                .db
                .release(&id, &node.config.node_id, epoch)
                .await
                .is_ok()
            {
                tracing::info!(dataset = id, epoch, "released a lease held but not loaded");
            }
        }
    }

    fn drop_all(&self, why: &str) {
        let all: Vec<_> = self.datasets.iter().map(|e| e.value().clone()).collect();
        if !all.is_empty() {
            tracing::warn!(datasets = all.len(), why, "no longer serving any dataset");
        }
        for ds in all {
            let _ = self.lose(&ds);
        }
    }

    fn spawn_adopt(
        &self,
        node: &Arc<ClusterNode>,
        id: String,
        epoch: u64,
        snapshots: SnapshotPolicy,
    ) {
        node.adopting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
        let engine = self.clone();
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.adopt(&id, epoch, snapshots).await {
                tracing::error!(dataset = id, error = %e, "loading a taken dataset failed; releasing its lease");
                let _ = node.db.release(&id, &node.config.node_id, epoch).await;
            }
            node.adopting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        });
    }
}

//! Where datasets live: a new dataset goes to the live node with
//! the most free memory (ties: the smallest node id), and a node holding more
//! than its fair share of the cluster's datasets hands one over (graceful
//! handover: snapshot, release, another node loads it) while some live node
//! holds less than its share — which is how a node that joins gets work.
//!
//! Both decisions read what the lease loop last read from PostgreSQL (the
//! nodes' heartbeats with their memory, and the leases), at most a quarter TTL
//! old: placement is advice, never a safety property (the lease decides who
//! writes).

use super::{ClusterNode, Lease, NodeRow};
use crate::engine::Engine;
use crate::store::cluster::NodeMemory;
use std::time::Duration;

/// Whether `n` takes part in placement and fair shares: a recent heartbeat
/// (younger than half the TTL: a dead node drops out before its leases
/// expire, so survivors count without it when they take them) and not
/// draining.
fn active(n: &NodeRow, ttl: Duration) -> bool {
    !n.draining && (n.heartbeat_age_ms.max(0) as u128) < ttl.as_millis() / 2
}

/// The node a new dataset goes to: the active node with the most free memory
/// (a node whose figure is unknown comes last), ties broken by the smallest id.
/// `None` when no node is active.
pub fn choose_node(nodes: &[NodeRow], ttl: Duration) -> Option<&NodeRow> {
    nodes.iter().filter(|n| active(n, ttl)).min_by(|a, b| {
        let free = |n: &NodeRow| n.memory_free.unwrap_or(-1);
        free(b)
            .cmp(&free(a))
            .then_with(|| a.node_id.cmp(&b.node_id))
    })
}

/// A node's share of the cluster's datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Live leases the node holds.
    pub owned: usize,
    /// `datasets / active nodes`, rounded down and up.
    pub floor: usize,
    /// See `floor`.
    pub ceil: usize,
    /// Some active node holds fewer than `floor`.
    pub someone_below_floor: bool,
}

impl Share {
    /// `me`'s share, from the nodes and leases as read (every lease counts,
    /// live or not: each dataset needs an owner).
    pub fn of(me: &str, nodes: &[NodeRow], leases: &[Lease], ttl: Duration) -> Share {
        let owned_by = |id: &str| {
            leases
                .iter()
                .filter(|l| l.expires_in_ms > 0 && l.owner.as_deref() == Some(id))
                .count()
        };
        let active: Vec<&NodeRow> = nodes.iter().filter(|n| active(n, ttl)).collect();
        let count = active.len().max(1);
        let total = leases.len();
        let floor = total / count;
        Share {
            owned: owned_by(me),
            floor,
            ceil: total.div_ceil(count),
            someone_below_floor: active.iter().any(|n| owned_by(&n.node_id) < floor),
        }
    }

    /// Whether the node should hand a dataset over now.
    pub fn surplus(&self) -> bool {
        self.owned > self.ceil && self.someone_below_floor
    }

    /// How many vacant leases to take this round, and how long a vacancy must
    /// have been open first: a node below its share takes fresh vacancies (up
    /// to its share); one at or above it takes only those nobody took for a
    /// whole TTL (so that a handed-over dataset goes to the node that lacks
    /// work, yet no dataset stays unowned).
    pub fn takes(&self, per_round: usize, ttl: Duration) -> (usize, Duration) {
        if self.owned < self.ceil {
            ((self.ceil - self.owned).min(per_round), Duration::ZERO)
        } else {
            (per_round, ttl)
        }
    }
}

impl ClusterNode {
    /// The nodes `shards` shards go to: the active nodes by most free memory
    /// (ties: smallest id), in turn, so that shards land on different nodes
    /// where there are enough. Empty when no heartbeat was read yet.
    pub fn spread(&self, shards: usize) -> Vec<NodeRow> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut order = Vec::new();
        while let Some(next) = choose_node(&nodes, self.config.lease_ttl).cloned() {
            nodes.retain(|n| n.node_id != next.node_id);
            order.push(next);
        }
        if order.is_empty() {
            return Vec::new();
        }
        (0..shards)
            .map(|i| order[i % order.len()].clone())
            .collect()
    }

    /// The node a new dataset should be created on, by the heartbeats last
    /// read; `None` for this node (or when nothing was read yet).
    pub fn placement(&self) -> Option<NodeRow> {
        let me = self.config.node_id.as_str();
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if self.is_draining() {
            nodes.retain(|n| n.node_id != me);
        }
        choose_node(&nodes, self.config.lease_ttl)
            .filter(|n| n.node_id != me)
            .cloned()
    }

    pub(super) fn remember_nodes(&self, nodes: Vec<NodeRow>) {
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = nodes;
    }
}

impl Engine {
    /// This node's memory for its heartbeat: what its ledgers in memory use
    /// (the storage report's figure; a ledger locked for a write right now is
    /// left out rather than waited for), and what is free for new datasets:
    /// the machine's available memory, or `--node-memory-bytes` minus the
    /// ledgers' use when set (whichever is smaller).
    pub(in crate::engine) fn node_memory(&self) -> NodeMemory {
        let ledger_bytes = self.ledger_memory_bytes();
        let machine = super::memory_free();
        let offered = self
            .cluster
            .as_ref()
            .and_then(|n| n.config.memory_bytes)
            .map(|m| m.saturating_sub(ledger_bytes));
        let free = match (machine, offered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        NodeMemory { free, ledger_bytes }
    }

    /// What this node's ledgers in memory use, in bytes (the storage report's
    /// figure; a ledger locked for a write right now is left out rather than
    /// waited for).
    pub fn ledger_memory_bytes(&self) -> u64 {
        self.datasets
            .iter()
            .filter_map(|e| e.value().ledger.try_read().ok().map(|l| l.memory_bytes()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, free: Option<i64>, age: i64, draining: bool) -> NodeRow {
        NodeRow {
            node_id: id.into(),
            advertise: format!("http://{id}"),
            heartbeat_age_ms: age,
            draining,
            memory_free: free,
            ledger_bytes: Some(0),
        }
    }

    fn lease(d: &str, owner: Option<&str>, live: bool) -> Lease {
        Lease {
            dataset: d.into(),
            owner: owner.map(String::from),
            advertise: None,
            epoch: 1,
            expires_in_ms: if live { 1000 } else { -5 },
        }
    }

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn placement_picks_the_most_free_memory_among_active_nodes() {
        let nodes = vec![
            node("a", Some(100), 0, false),
            node("b", Some(300), 0, false),
            node("c", Some(900), 0, true),      // draining
            node("d", Some(800), 6_000, false), // heartbeat too old
            node("e", None, 0, false),
        ];
        assert_eq!(choose_node(&nodes, TTL).unwrap().node_id, "b");
        // Ties go to the smallest id.
        let tied = vec![node("z", Some(5), 0, false), node("m", Some(5), 0, false)];
        assert_eq!(choose_node(&tied, TTL).unwrap().node_id, "m");
        // An unknown figure loses to any known one, but beats nothing.
        assert_eq!(
            choose_node(&[node("e", None, 0, false)], TTL)
                .unwrap()
                .node_id,
            "e"
        );
        assert!(choose_node(&[node("c", Some(1), 0, true)], TTL).is_none());
    }

    #[test]
    fn a_joining_node_gets_a_fair_share() {
        let nodes = vec![
            node("a", None, 0, false),
            node("b", None, 0, false),
            node("c", None, 0, false),
        ];
        let mut leases: Vec<Lease> = (0..6)
            .map(|i| lease(&format!("d{i}"), Some(if i < 3 { "a" } else { "b" }), true))
            .collect();
        let a = Share::of("a", &nodes, &leases, TTL);
        assert_eq!((a.owned, a.floor, a.ceil), (3, 2, 2));
        assert!(a.surplus());
        let c = Share::of("c", &nodes, &leases, TTL);
        assert!(!c.surplus());
        assert_eq!(c.takes(4, TTL), (2, Duration::ZERO));
        // a handed one over and c took it: a is at its share, c still below.
        leases[0] = lease("d0", Some("c"), true);
        let a = Share::of("a", &nodes, &leases, TTL);
        assert!(!a.surplus());
        assert_eq!(a.takes(4, TTL), (4, TTL));
        // Balanced: nobody moves.
        leases[3] = lease("d3", Some("c"), true);
        for me in ["a", "b", "c"] {
            assert!(!Share::of(me, &nodes, &leases, TTL).surplus(), "{me}");
        }
    }

    #[test]
    fn uneven_placement_moves_only_when_a_node_lacks_work() {
        let nodes = vec![
            node("a", None, 0, false),
            node("b", None, 0, false),
            node("c", None, 0, false),
        ];
        // Two datasets on one node of three: the others hold 0 = floor.
        let leases = vec![lease("x", Some("a"), true), lease("y", Some("a"), true)];
        assert!(!Share::of("a", &nodes, &leases, TTL).surplus());
        // A dead owner's expired leases: the survivors are below their share
        // and take them at once.
        let leases = vec![lease("x", Some("z"), false), lease("y", Some("a"), true)];
        let b = Share::of("b", &nodes, &leases, TTL);
        assert_eq!(b.takes(4, TTL), (1, Duration::ZERO));
    }
}

//! Changes of a sharded dataset made across its shards (`docs/sharding.md`,
//! "The change protocol"): the coordinating side, as an engine subsystem.
//!
//! One generic coordinator ([`Coordinator`], `coordinator.rs`) prepares a
//! change on every shard, decides what to commit from the shards' answers,
//! commits one record per shard in one fenced PostgreSQL transaction and asks
//! every owner to decide; a release while steps are in flight prepares again
//! at the furthest shard's step, a few rounds, before a retryable refusal.
//! Releases, release budgets, release policies, labels after creation and
//! archiving are its changes (`changes.rs`); the policy's releases start here
//! too, on the node that owns a dataset's first shard (`policy.rs`).
//!
//! The engine reaches other nodes only through [`Peers`], which it receives
//! at start-up ([`Engine::set_peers`]; the HTTP layer implements it): a shard
//! this node owns is prepared and decided in-process, on this engine, and
//! every other through its owner. The owners' side of the protocol (prepare,
//! hold, decide) is `cluster::shard_release`. Nothing here knows HTTP: a
//! peer's refusal comes back as [`EngineError::Peer`], kept whole so that the
//! caller hears what the owner said.

mod changes;
mod coordinator;
mod merge;
mod policy;

pub use changes::check_policy;
pub use coordinator::{ChangeAnswer, Coordinator};
pub use merge::{check_interactive, check_sharded_request, release_of_shards, Apart};

use super::cluster::shard_release::{Decision, Prepared, ShardChange};
pub use super::error::PeerRefusal;
use super::error::{EngineError, EngineResult};
use super::Engine;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

/// A node of the cluster that owns a shard, as a call to it needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The node's id.
    pub node_id: String,
    /// Its advertised base URL.
    pub advertise: String,
}

/// The caller's credential, as it was presented, passed on to the owners of
/// the shards, which authorise it again for their shard (opaque to the
/// engine). A change without one (a policy release) is the node's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential(pub Vec<u8>);

/// One call of the change protocol to a shard's owner.
#[derive(Debug, Clone)]
pub struct PeerCall {
    /// The owner.
    pub owner: Owner,
    /// The shard (`{dataset}~{start}`).
    pub shard: String,
    /// The change's id.
    pub change_id: String,
    /// The caller's credential, if the change has a caller.
    pub credential: Option<Credential>,
}

/// What a call to a peer gives: owned, so that each shard's call runs on a
/// task of its own.
pub type PeerFuture<T> = Pin<Box<dyn Future<Output = EngineResult<T>> + Send + 'static>>;

/// How the engine calls the owners of shards on other nodes (the HTTP
/// layer's node-to-node client, node-marked): the typed calls of the change
/// protocol, so that the coordinator never builds a request or reads an
/// answer. A refusal is [`EngineError::Peer`] as the owner answered, or the
/// refusal the engine would give (an owner that cannot be reached, no answer
/// in time).
pub trait Peers: Send + Sync + std::fmt::Debug {
    /// Prepare `change` on `call.shard` at step `at` (the shard's own when
    /// `None`): the owner's [`Prepared`], its writes held until decided.
    fn prepare(&self, call: PeerCall, change: ShardChange, at: Option<u64>)
        -> PeerFuture<Prepared>;
    /// Ask the owner of `call.shard` to decide the change now (it asks
    /// PostgreSQL, not the caller).
    fn decide(&self, call: PeerCall) -> PeerFuture<Decision>;
}

/// The subsystem's state in the engine: the peers (set once at start) and
/// the sharded datasets whose policy release is in flight here.
#[derive(Default)]
pub(crate) struct Sharding {
    peers: OnceLock<Arc<dyn Peers>>,
    /// Per dataset with a policy release in flight: whether another fell due
    /// since (it then runs once after, coalescing the rest).
    policy_slots: Mutex<HashMap<String, bool>>,
}

impl Engine {
    /// Give the engine its way to other nodes (cluster mode, at start-up,
    /// before serving). A second call is ignored: the first peers stay.
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        let _ = self.sharding.peers.set(peers);
    }

    /// The peers set at start-up.
    fn peers(&self) -> EngineResult<Arc<dyn Peers>> {
        self.sharding
            .peers
            .get()
            .cloned()
            .ok_or_else(|| EngineError::Internal("this node cannot reach its peers".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_reads_its_detail_and_class() {
        let refusal = PeerRefusal {
            status: 503,
            content_type: Some("application/problem+json".into()),
            retry_after: Some("1".into()),
            body: br#"{"detail":"moving: retry"}"#.to_vec(),
        };
        assert_eq!(refusal.to_string(), "moving: retry");
        assert!(EngineError::Peer(refusal.clone()).is_retryable());
        let plain = PeerRefusal {
            status: 413,
            body: b"too large".to_vec(),
            ..refusal
        };
        assert_eq!(plain.to_string(), "refused with 413");
        assert!(!EngineError::Peer(plain).is_retryable());
    }
}

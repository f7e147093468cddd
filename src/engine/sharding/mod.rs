//! Sharded datasets (`docs/sharding.md`), as an engine subsystem: a dataset
//! created with `"shards": k` is `k` contiguous id ranges, each an ordinary
//! dataset of the cluster (`{dataset}~{start}`) with its own lease, ledger
//! and log. Cluster membership (leases, placement, node marks) is
//! `engine::cluster`; everything about shards is here.
//!
//! | file | its one job |
//! |---|---|
//! | `mod.rs` | the [`Peers`] trait by which the engine reaches other nodes, and the subsystem's state |
//! | `layout.rs` | shard names, id ranges, the layout row and where new shards go |
//! | `create.rs` | a sharded dataset's creation: checked, its layout recorded, each shard created on its node |
//! | `split.rs` | a step or refresh split by id range into its shards' parts, their answers merged |
//! | `labels.rs` | labels after creation: the dataset's label order and each shard's record |
//! | `coordinator.rs` | the one coordinator of changes across shards: prepare, decide, commit, the retry rule |
//! | `commit.rs` | the coordinator's commit: one fenced record per shard in one transaction, and a change's stored answer |
//! | `changes.rs` | the changes it makes: releases, release budgets, policies, labels, archiving |
//! | `merge.rs` | what the coordinator decides from the shards' prepared answers (pure) |
//! | `policy.rs` | a sharded dataset's policy releases, started by the owner of its first shard |
//! | `owners.rs` | the owners' side of a change: prepared, held until decided, the decision applied |
//! | `protocol.rs` | the protocol's messages: the change, an owner's prepared answer, the commit's outcome, the decision |
//! | `prepare.rs` | a shard's prepare of a release: statistics from a view at one step, then the write lock |
//! | `scatter.rs` | a dataset's steps, refreshes and reads whatever its layout: one ledger's answer, or its shards' merged |
//!
//! The coordinator prepares a change on every shard, decides what to commit
//! from the shards' answers, commits one record per shard in one fenced
//! PostgreSQL transaction and asks every owner to decide; a release while
//! steps are in flight prepares again at the furthest shard's step, a few
//! rounds, before a retryable refusal. The engine reaches other nodes only
//! through [`Peers`], which it receives at start-up ([`Engine::set_peers`];
//! the HTTP layer implements it): a shard this node owns is prepared and
//! decided in-process, on this engine, and every other through its owner.
//! Nothing here knows HTTP: a peer's refusal comes back as
//! [`EngineError::Peer`], kept whole so that the caller hears what the owner
//! said.

mod changes;
mod commit;
mod coordinator;
mod create;
pub mod labels;
mod layout;
mod merge;
pub mod owners;
mod policy;
mod prepare;
pub mod protocol;
mod scatter;
mod split;

pub use super::shard_names::{owning_dataset, parse_shard_id, shard_id, SHARD_SEPARATOR};
pub use changes::check_policy;
pub use coordinator::{ChangeAnswer, Coordinator};
pub use create::{ShardCreated, ShardCreation};
pub use layout::{
    check_no_shard_fields, check_shard_request, check_single_ledger, shard_ranges, shards_for,
    ShardLayout, DEFAULT_MAX_SHARD_EXAMPLES, MAX_SHARDS,
};
pub use merge::{check_interactive, check_sharded_request, release_of_shards, Apart};
pub use split::{merge_status, split_range, split_step, SplitStep};

pub use super::error::PeerRefusal;
use super::error::{EngineError, EngineResult};
use super::queries::{ExampleQuery, IdRange, PrivacyQuery};
use super::Engine;
use crate::ledger::{RefreshOutcome, StepOutcome, StepReport, WorstCaseBounds};
/// A node of the cluster that owns a shard, as a call to it needs it (the
/// node a not-owner answer names, too).
pub use dpledger_api::problem::OwnerRef;
use dpledger_api::views::{DatasetView, PrivacyView, Thresholds};
use protocol::{Decision, Prepared, ShardChange};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

/// The caller's credential, as it was presented, passed on to the owners of
/// the shards, which authorise it again for their shard (opaque to the
/// engine). A change without one (a policy release) is the node's own.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(pub Vec<u8>);

impl std::fmt::Debug for Credential {
    /// Never the secret itself: a credential may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// One call of the change protocol to a shard's owner.
#[derive(Debug, Clone)]
pub struct PeerCall {
    /// The owner.
    pub owner: OwnerRef,
    /// The shard (`{dataset}~{start}`).
    pub shard: String,
    /// The change's id.
    pub change_id: String,
    /// The caller's credential, if the change has a caller.
    pub credential: Option<Credential>,
}

/// One request of a sharded dataset's caller to the owner of one of its
/// shards on another node: a step's part, a refresh's part or a read.
#[derive(Debug, Clone)]
pub struct ShardCall {
    /// The owner.
    pub owner: OwnerRef,
    /// The shard (`{dataset}~{start}`).
    pub shard: String,
    /// The caller's credential, which the owner authorises for its shard.
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
    /// Apply a step's part to `call.shard` (exactly once by step and part,
    /// as any step).
    fn step(&self, call: ShardCall, part: StepReport) -> PeerFuture<StepOutcome>;
    /// Apply a refresh's part to `call.shard`, under the caller's
    /// idempotency key (`key`) when it sent one.
    fn refresh(&self, call: ShardCall, part: RefreshPart) -> PeerFuture<RefreshOutcome>;
    /// The view of `call.shard`.
    fn view(&self, call: ShardCall) -> PeerFuture<DatasetView>;
    /// The thresholds of `call.shard`'s own ids `range`.
    fn thresholds(&self, call: ShardCall, range: IdRange) -> PeerFuture<Thresholds>;
    /// The privacy of `call.shard`'s own example `example`.
    fn example_privacy(
        &self,
        call: ShardCall,
        example: u64,
        query: ExampleQuery,
    ) -> PeerFuture<PrivacyView>;
    /// The worst case of `call.shard`.
    fn worst_case(&self, call: ShardCall, query: PrivacyQuery) -> PeerFuture<WorstCaseBounds>;
    /// Archive `call.shard` alone (completing a dataset some of whose shards
    /// are archived already; idempotent).
    fn archive(&self, call: ShardCall) -> PeerFuture<()>;
    /// Create `call.shard` on its node as `creation` says (the caller's
    /// credential authorised there as administrator): created, found to
    /// exist already (a retried creation), or its node unreachable with
    /// nothing sent.
    fn create_shard(&self, call: ShardCall, creation: ShardCreation) -> PeerFuture<ShardCreated>;
}

/// A refresh's part for one shard: its own ids and their norms, and the
/// caller's idempotency key as sent (each shard binds it to its own part).
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshPart {
    /// The shard's own ids.
    pub ids: Vec<u64>,
    /// Their norms.
    pub norms: Vec<f64>,
    /// The caller's `Idempotency-Key`, if it sent one.
    pub key: Option<String>,
}

impl RefreshPart {
    /// The part's body as sent to its shard (and bound to the key, whether
    /// the shard is called in-process or over HTTP).
    pub fn body(&self) -> Vec<u8> {
        serde_json::json!({"ids": self.ids, "norms": self.norms})
            .to_string()
            .into_bytes()
    }
}

/// The subsystem's state in the engine: the peers (set once at start) and
/// the sharded datasets whose policy release is in flight here.
#[derive(Default)]
pub(crate) struct Sharding {
    peers: OnceLock<Arc<dyn Peers>>,
    /// Per dataset with a policy release in flight: whether another fell due
    /// since (it then runs once after, coalescing the rest).
    policy_slots: Mutex<HashMap<String, bool>>,
    /// The owners' side: changes prepared on this node's shards, by shard and
    /// change id, each waiting for its decision (`owners.rs`).
    held: owners::Held,
    /// Sharded datasets' layouts as read (they never change), for routing
    /// without a database round trip (`layout.rs`).
    layouts: dashmap::DashMap<String, Arc<ShardLayout>>,
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

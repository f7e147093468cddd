//! The messages of the change protocol across shards (`docs/sharding.md`,
//! "The change protocol"): the change a coordinator prepares on every shard,
//! what each owner answers, the commit's outcome and the decision, as the
//! engine's own types (the store's are converted at the boundary, so that
//! nothing above the engine names them). The owners' side is `owners.rs`,
//! the coordinator's `coordinator.rs`.

use crate::engine::error::{EngineError, EngineResult};
use crate::release::{BudgetStatus, LeftOut, ReleasePolicy, ReleaseRequest, ReleaseSummary};
use crate::store::cluster as stored;
use crate::store::RecordKind;
use serde::{Deserialize, Serialize};

/// A fresh id for a change across shards. The engine's, so that the
/// coordinator never names the store; the id's form (the time it was made,
/// then random bits) is the store's, whose commit reads that time to refuse a
/// change too old to commit
/// ([`CHANGE_COMMITS_WITHIN`](crate::store::cluster::CHANGE_COMMITS_WITHIN)).
pub fn new_change_id() -> String {
    stored::new_change_id()
}

/// What a commit across shards did (`Engine::commit_each_across`, `commit.rs`): the engine's
/// own answer (the store's, converted at the boundary), so that callers above
/// the engine never name a store type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrossCommit {
    /// Every record is in the log: their sequence numbers, in order (empty
    /// when the commit was known only from its decision row).
    Committed(Vec<u64>),
    /// Nothing was written: a shard's epoch is no longer its lease's (named).
    Fenced(String),
    /// Nothing was written: the change was already decided (an owner aborted
    /// it when its wait ran out).
    Decided,
    /// Nothing was written: the idempotency key is stored already.
    KeyUsed,
}

impl From<stored::CrossCommit> for CrossCommit {
    fn from(c: stored::CrossCommit) -> CrossCommit {
        match c {
            stored::CrossCommit::Committed(seqs) => CrossCommit::Committed(seqs),
            stored::CrossCommit::Fenced(detail) => CrossCommit::Fenced(detail),
            stored::CrossCommit::Decided => CrossCommit::Decided,
            stored::CrossCommit::KeyUsed => CrossCommit::KeyUsed,
        }
    }
}

/// A change's decision as recorded ([`Engine::decide_shard_change`](crate::engine::Engine::decide_shard_change)): the
/// engine's own (the store's, converted at the boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Its records are in the logs.
    Committed,
    /// None of its records is, nor ever will be.
    Aborted,
}

impl From<stored::Decision> for Decision {
    fn from(d: stored::Decision) -> Decision {
        match d {
            stored::Decision::Committed => Decision::Committed,
            stored::Decision::Aborted => Decision::Aborted,
        }
    }
}

/// The kind of the record a change across shards writes on each shard: only
/// the kinds such a change can write, so that a caller cannot commit, say, a
/// step across shards, and never names the store's [`RecordKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardRecordKind {
    /// A release charged to every shard.
    Release,
    /// A new release budget.
    BudgetChange,
    /// A new release policy, or none.
    ReleasePolicy,
    /// Labels after creation.
    Labels,
    /// The dataset archived.
    Archived,
}

impl From<ShardRecordKind> for RecordKind {
    fn from(kind: ShardRecordKind) -> RecordKind {
        match kind {
            ShardRecordKind::Release => RecordKind::Release,
            ShardRecordKind::BudgetChange => RecordKind::BudgetChange,
            ShardRecordKind::ReleasePolicy => RecordKind::ReleasePolicy,
            ShardRecordKind::Labels => RecordKind::Labels,
            ShardRecordKind::Archived => RecordKind::Archived,
        }
    }
}

/// A change of a sharded dataset prepared on every shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ShardChange {
    /// A curator's release (validated).
    Release(ReleaseRequest),
    /// A new release budget (zCDP rho).
    Budget(f64),
    /// A new release policy (validated), or none (`policy.rs`).
    Policy(Option<ReleasePolicy>),
    /// Labels after creation (`labels.rs`): the shard only answers its
    /// label names; each shard's record is cut by the coordinator.
    Labels,
    /// Archiving the dataset: one `Archived` record per shard, prepared at one
    /// step (`at`, as a release), so that every shard is archived after the
    /// same steps and a step in flight is applied by all or by none.
    Archive,
}

/// What a shard's owner answers a prepare with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    /// The owner's epoch: the shard's record is fenced by it.
    pub epoch: u64,
    /// The shard's next step (the steps it applied).
    pub step: u64,
    /// The shard's release budget and spend.
    pub budget: BudgetStatus,
    /// A release's delta, bound `B` and sufficient statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<PreparedRelease>,
    /// The shard's label names in its order (`labels.rs` derives the
    /// dataset's from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

/// A release's part of [`Prepared`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedRelease {
    /// Delta of the epsilons.
    pub delta: f64,
    /// The worst-case epsilon `B` at the shard's step (data-independent: the
    /// same on every shard at the same step).
    pub bound: f64,
    /// The shard's examples' statistics (a left-out example's term is 0).
    pub summary: ReleaseSummary,
    /// The shard's examples (its own ids) that the release leaves out of its
    /// input: its cost would take them past their individual budget (spec
    /// §6). Kept in the shard's release record, for replay; never served.
    #[serde(default, skip_serializing_if = "LeftOut::is_empty")]
    pub left_out: LeftOut,
}

/// What a coordinator checks of a change, checked again by each owner: an
/// owner never computes on what a coordinator refuses (`bins: 0`, a budget
/// that is not a finite rho >= 0), whichever node sent it.
pub(crate) fn validate_change(change: &mut ShardChange) -> EngineResult<()> {
    match change {
        ShardChange::Release(request) => request.validate().map_err(EngineError::from),
        ShardChange::Policy(Some(policy)) => policy.validate().map_err(EngineError::from),
        ShardChange::Policy(None) => Ok(()),
        ShardChange::Budget(rho) if rho.is_finite() && *rho >= 0.0 => Ok(()),
        ShardChange::Labels | ShardChange::Archive => Ok(()),
        ShardChange::Budget(rho) => {
            Err(EngineError::from(crate::accounting::InvalidArgument::new(
                "rho",
                format!("a release budget is a finite rho >= 0, not {rho}"),
            )))
        }
    }
}

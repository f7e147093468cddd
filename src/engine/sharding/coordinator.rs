//! The generic change coordinator: prepare a change on every shard, decide
//! from the answers, commit one record per shard in one fenced transaction,
//! then ask every owner to decide (`docs/sharding.md`, "The change
//! protocol"). Each change (`changes.rs`) says what it prepares, checks and
//! commits; this file is what they share: whom to call for a shard (this
//! engine for the shards it owns, [`Peers`] for the rest), the first refusal
//! among the shards, the commit's outcomes and the idempotency key's stored
//! answer.

use super::protocol::{
    validate_change, CrossCommit, Decision, Prepared, ShardChange, ShardRecordKind,
};
use super::ShardLayout;
use super::{Credential, OwnerRef, PeerCall, Peers};
use crate::engine::cluster::ClusterNode;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::Engine;
use crate::ledger::IdempotencyKey;
use std::sync::Arc;
use std::time::Duration;

/// How long an owner holds its shard's writes for a prepared change before
/// deciding it alone (abort, unless the commit landed).
pub const HOLD: Duration = Duration::from_secs(5);

/// Rounds of prepares while the shards are found at different steps.
pub(super) const ROUNDS: u32 = 20;

/// A coordinated change's answer: the JSON it answers (and stores under its
/// idempotency key), and whether it created something (a release) rather
/// than changed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeAnswer {
    /// Whether the change created a resource (a release).
    pub created: bool,
    /// The answer's body.
    pub body: serde_json::Value,
}

impl ChangeAnswer {
    /// An answer as stored: a release's answer names its release, which the
    /// others never do.
    fn stored(body: serde_json::Value) -> ChangeAnswer {
        ChangeAnswer {
            created: body.get("release").is_some(),
            body,
        }
    }
}

/// Coordinates changes of one sharded dataset on behalf of one caller (or
/// of the node itself, without a credential): what every change across
/// shards needs, made by [`Engine::coordinate`].
#[derive(Clone)]
pub struct Coordinator {
    pub(super) engine: Engine,
    pub(super) node: Arc<ClusterNode>,
    pub(super) peers: Arc<dyn Peers>,
    pub(super) layout: Arc<ShardLayout>,
    pub(super) credential: Option<Credential>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("dataset", &self.layout.dataset)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The coordinator of changes of sharded dataset `layout.dataset` for a
    /// caller who presented `credential` (passed on to the owners, which
    /// authorise it for their shards; `None`: the node's own change). The
    /// caller must be authorised for the dataset already.
    pub fn coordinate(
        &self,
        layout: Arc<ShardLayout>,
        credential: Option<Credential>,
    ) -> EngineResult<Coordinator> {
        let node = self
            .cluster()
            .cloned()
            .ok_or_else(|| EngineError::conflict("sharded datasets exist only in cluster mode"))?;
        Ok(Coordinator {
            engine: self.clone(),
            node,
            peers: self.peers()?,
            layout,
            credential,
        })
    }

    /// The owner's side of a prepare, whoever coordinates (another node's
    /// call, or this node's own coordinator in-process): the change checked
    /// again (an owner never computes on what a coordinator refuses, whichever
    /// node sent it), then prepared and held for at most `HOLD`.
    pub async fn prepare_for_coordinator(
        &self,
        shard: &str,
        id: &str,
        mut change: ShardChange,
        at: Option<u64>,
    ) -> EngineResult<Prepared> {
        validate_change(&mut change)?;
        self.prepare_shard_change(shard, id, change, at, HOLD).await
    }
}

/// Whom to call for a shard.
pub(super) enum Target {
    /// This node owns it: called in-process.
    Here,
    /// Another node owns it.
    There(OwnerRef),
}

impl Coordinator {
    /// The owner to call for shard `s`: this node when it serves the shard,
    /// else the live lease's holder; none while its lease moves.
    pub(super) async fn target(&self, shard: &str) -> EngineResult<Target> {
        if self.engine.serves(shard) {
            return Ok(Target::Here);
        }
        match self.node.lease_of(shard).await {
            Some(l) if l.expires_in_ms > 0 => {
                if let Some((node_id, advertise)) = l.owner.zip(l.advertise) {
                    return Ok(Target::There(OwnerRef { node_id, advertise }));
                }
            }
            _ => {}
        }
        Err(EngineError::NotOwner(format!(
            "shard {shard:?} has no live owner now (its lease is moving or it is being created): retry"
        )))
    }

    /// The call of change `id` to `owner` for `shard`.
    fn call(&self, owner: OwnerRef, shard: String, id: &str) -> PeerCall {
        PeerCall {
            owner,
            shard,
            change_id: id.to_string(),
            credential: self.credential.clone(),
        }
    }

    /// Prepare `change` as `id` on shard `s`, wherever it is owned.
    async fn prepare_one(
        self,
        s: usize,
        id: String,
        change: ShardChange,
        at: Option<u64>,
    ) -> EngineResult<Prepared> {
        let shard = self.layout.shard_dataset(s);
        match self.target(&shard).await? {
            Target::Here => {
                self.engine
                    .prepare_for_coordinator(&shard, &id, change, at)
                    .await
            }
            Target::There(owner) => {
                let call = self.call(owner, shard, &id);
                self.peers.prepare(call, change, at).await
            }
        }
    }

    /// Ask shard `s`'s owner to decide `id` now.
    async fn decide_one(self, s: usize, id: String) -> EngineResult<Decision> {
        let shard = self.layout.shard_dataset(s);
        match self.target(&shard).await? {
            Target::Here => self.engine.decide_shard_change(&shard, &id).await,
            Target::There(owner) => self.peers.decide(self.call(owner, shard, &id)).await,
        }
    }

    /// Prepare `change` as `id` on every shard in parallel: each shard's
    /// [`Prepared`], or the first shard's refusal (after every shard was
    /// asked to decide, i.e. abort).
    pub(super) async fn prepare_all(
        &self,
        id: &str,
        change: &ShardChange,
        at: Option<u64>,
    ) -> EngineResult<Vec<Prepared>> {
        let tasks: Vec<_> = (0..self.layout.ranges.len())
            .map(|s| {
                let one = self
                    .clone()
                    .prepare_one(s, id.to_string(), change.clone(), at);
                tokio::spawn(one)
            })
            .collect();
        let mut prepared = Vec::with_capacity(tasks.len());
        let mut failure = None;
        for task in tasks {
            match task.await {
                Ok(Ok(p)) => prepared.push(p),
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert(EngineError::Internal("a shard request failed".into()));
                }
            }
        }
        match failure {
            None => Ok(prepared),
            Some(e) => {
                self.decide_all(id).await;
                Err(e)
            }
        }
    }

    /// Ask every shard's owner to decide `id` now (each asks PostgreSQL). An
    /// owner that does not hear it decides alone when its hold runs out.
    pub(super) async fn decide_all(&self, id: &str) {
        let tasks: Vec<_> = (0..self.layout.ranges.len())
            .map(|s| tokio::spawn(self.clone().decide_one(s, id.to_string())))
            .collect();
        for task in tasks {
            if let Ok(Err(e)) = task.await {
                tracing::warn!(change = id, error = %e, "a shard did not decide a change at once");
            }
        }
    }

    /// The answer a change with idempotency key `key` stored, if it was made
    /// (a key used for another request is refused).
    pub(super) async fn stored_answer(
        &self,
        key: &Option<IdempotencyKey>,
    ) -> EngineResult<Option<ChangeAnswer>> {
        let Some(k) = key else { return Ok(None) };
        let d = &self.layout.dataset;
        let Some(done) = self.engine.sharded_key(d, &k.key).await? else {
            return Ok(None);
        };
        if done.request != k.request {
            return Err(EngineError::KeyReused { key: k.key.clone() });
        }
        let body = serde_json::from_slice(&done.answer)
            .map_err(|e| EngineError::Internal(format!("the stored answer is unreadable: {e}")))?;
        Ok(Some(ChangeAnswer::stored(body)))
    }

    /// Commit the shards' records of change `id` (`payloads[s]` for shard
    /// `s`, each fenced by the epoch it prepared under), stored under `key`
    /// with `answer`, and tell the owners; `answer` once committed, the
    /// stored answer when the key was stored meanwhile, else the refusal.
    pub(super) async fn commit(
        &self,
        id: &str,
        kind: ShardRecordKind,
        payloads: Vec<Vec<u8>>,
        prepared: &[Prepared],
        key: Option<IdempotencyKey>,
        answer: ChangeAnswer,
    ) -> EngineResult<ChangeAnswer> {
        let targets = prepared
            .iter()
            .zip(payloads)
            .enumerate()
            .map(|(s, (p, payload))| (self.layout.shard_dataset(s), p.epoch, payload))
            .collect();
        let answer_bytes = serde_json::to_vec(&answer.body).unwrap_or_default();
        let stored_key = key.clone().map(|k| {
            (
                self.layout.dataset.clone(),
                IdempotencyKey {
                    answer: answer_bytes,
                    ..k
                },
            )
        });
        let committed = self
            .engine
            .commit_each_across(id, kind, targets, stored_key)
            .await;
        self.decide_all(id).await;
        match committed? {
            CrossCommit::Committed(_) => Ok(answer),
            CrossCommit::KeyUsed => match self.stored_answer(&key).await? {
                Some(done) => Ok(done),
                None => Err(EngineError::ShardsApart(
                    "the idempotency key was stored meanwhile: retry".into(),
                )),
            },
            CrossCommit::Fenced(detail) => Err(EngineError::NotOwner(format!(
                "a shard's owner changed during the change, nothing was charged: retry ({detail})"
            ))),
            CrossCommit::Decided => Err(EngineError::ShardsApart(
                "a shard's owner stopped waiting for the change, nothing was charged: retry".into(),
            )),
        }
    }

    /// [`Self::commit`] with the same payload on every shard.
    pub(super) async fn commit_same(
        &self,
        id: &str,
        kind: ShardRecordKind,
        payload: Vec<u8>,
        prepared: &[Prepared],
        key: Option<IdempotencyKey>,
        answer: ChangeAnswer,
    ) -> EngineResult<ChangeAnswer> {
        let payloads = vec![payload; prepared.len()];
        self.commit(id, kind, payloads, prepared, key, answer).await
    }
}

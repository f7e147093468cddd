//! Release policies of a sharded dataset over HTTP (the engine's
//! side is `engine::cluster::shard_policy`, the argument in `docs/sharding.md`
//! "Release policies").
//!
//! * `PUT /v1/datasets/{d}/release-policy` (any node) writes one
//!   `ReleasePolicy` record to every shard's log or to none, through the
//!   cross-shard protocol of releases and budgets (`shard_release.rs`): every
//!   shard's book holds the same policy. `GET` is answered by the first shard.
//! * [`Coordinator`], installed at start as the engine's
//!   [`ShardPolicyHook`], runs the release when the owner of the first shard
//!   sees a due step: the curator's cross-shard release
//!   ([`release_across`]) with trigger `policy`, on a task, at most one per
//!   dataset at a time; releases falling due meanwhile coalesce into one
//!   deferred release, as for an unsharded dataset (`engine::policy`). Its
//!   outcome (a refusal, say budget spent) is kept in the first shard's book.
//! * A policy release has no caller whose token could be passed on: its
//!   node-to-node calls carry the node mark alone (`Shards::send` marks every
//!   call of the protocol; `docs/cluster.md` "Node-to-node authentication"),
//!   which each owner accepts as the node's own call.

use super::auth::{Access, Claims};
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::problem::Problem;
use super::release_routes::{PolicyUpdate, PolicyView};
use super::shard_release::{
    change_id, commit, decide_all, prepare_all, release_across, serve_with, stored_answer,
};
use super::shard_routes::Shards;
use super::state::AppState;
use crate::engine::cluster::shard_labels::dataset_label_names;
use crate::engine::cluster::shard_policy::ShardPolicyHook;
use crate::engine::cluster::shard_release::{
    check_interactive, check_sharded_request, ShardChange, ShardRecordKind,
};
use crate::engine::cluster::{ClusterNode, ShardLayout};
use crate::engine::{BudgetRefusal, EngineError, EngineResult};
use crate::ledger::IdempotencyKey;
use crate::release::{ReleasePolicy, ReleaseTrigger};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Tries of one policy release while the answer is retryable (another
/// release holds a shard's turn, an owner is moving, the shards stay apart).
const TRIES: u32 = 6;

/// What a sharded dataset's policy must be, besides valid: its request must
/// have sufficient statistics to merge ([`check_sharded_request`]).
pub(super) fn check_policy(policy: &mut ReleasePolicy, names: &[String]) -> EngineResult<()> {
    policy.validate()?;
    check_sharded_request(&policy.request, names)
}

/// Answers `PUT /v1/datasets/{d}/release-policy` of a sharded dataset, run to
/// its end even if the caller goes (owners hold their shards' writes until
/// the change is decided).
pub(super) async fn serve(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Response {
    serve_with(state, node, layout, request, set_policy).await
}

/// The same policy on every shard, in one transaction.
async fn set_policy(
    shards: Shards,
    claims: Claims,
    idempotency: IdempotencyHeader,
    raw: RawBody,
) -> Result<Response, Response> {
    let refuse = |e: EngineError| Problem::from(e).into_response();
    let d = shards.layout.dataset.clone();
    claims
        .authorize(Access::Curate(&d))
        .map_err(IntoResponse::into_response)?;
    let key = idempotency
        .key(raw.bytes())
        .map_err(IntoResponse::into_response)?;
    let update: PolicyUpdate = raw.json().map_err(IntoResponse::into_response)?;
    let mut policy = update.policy;
    if let Some(p) = &mut policy {
        p.validate().map_err(|e| refuse(e.into()))?;
        check_interactive(&p.request).map_err(refuse)?;
    }
    if let Some(done) = stored_answer(&shards, &key).await? {
        return Ok(done);
    }
    let id = change_id();
    let prepared = prepare_all(&shards, &id, &ShardChange::Policy(policy.clone()), None).await?;
    // Groups need labels: the dataset's names (labels after creation
    // included) are known once the shards answered.
    if let Some(p) = &policy {
        let shard_names = prepared.iter().map(|p| p.labels.as_slice());
        let names = dataset_label_names(&shards.layout.label_names, shard_names);
        let checked = names.map_or_else(
            || {
                Err(EngineError::conflict(
                    "the shards' label names differ: retry",
                ))
            },
            |names| check_sharded_request(&p.request, &names),
        );
        if let Err(e) = checked {
            decide_all(&shards, &id).await;
            return Err(refuse(e));
        }
    }
    let payload = serde_json::to_vec(&json!({ "policy": policy })).unwrap_or_default();
    let answer = serde_json::to_value(PolicyView {
        policy,
        policy_error: None,
    })
    .unwrap_or_default();
    Ok(commit(
        &shards,
        &id,
        ShardRecordKind::ReleasePolicy,
        payload,
        &prepared,
        key,
        StatusCode::OK,
        answer,
    )
    .await)
}

/// Install this node's [`Coordinator`] as the engine's hook (cluster mode).
pub(super) fn install(state: &Arc<AppState>) {
    if let Some(node) = state.engine.cluster() {
        node.set_policy_hook(Arc::new(Coordinator {
            inner: Arc::new(Inner {
                state: Arc::downgrade(state),
                slots: Mutex::new(HashMap::new()),
            }),
        }));
    }
}

/// Runs sharded policy releases on this node (the owner of their first
/// shards); see the module documentation.
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").finish_non_exhaustive()
    }
}

struct Inner {
    /// Weak: the engine holds the hook, the state holds the engine.
    state: Weak<AppState>,
    /// Per dataset with a release in flight: whether another fell due since.
    slots: Mutex<HashMap<String, bool>>,
}

impl ShardPolicyHook for Coordinator {
    fn due(&self, dataset: &str, _step: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(deferred) = slots.get_mut(dataset) {
                // One in flight: defer one behind it; later ones coalesce.
                if std::mem::replace(deferred, true) {
                    metrics::counter!("dpledger_policy_releases_coalesced_total").increment(1);
                }
                return;
            }
            slots.insert(dataset.to_string(), false);
        }
        let (inner, dataset) = (self.inner.clone(), dataset.to_string());
        runtime.spawn(inner.run(dataset));
    }
}

impl Inner {
    /// The release due, then each deferred one, until none is left.
    async fn run(self: Arc<Self>, dataset: String) {
        let mut slot = SlotGuard {
            inner: self.clone(),
            dataset: dataset.clone(),
            armed: true,
        };
        loop {
            if let Some(state) = self.state.upgrade() {
                let outcome = attempt(&state, &dataset).await;
                let shard = crate::engine::cluster::shard_id(&dataset, 0);
                state.engine.note_shard_policy_outcome(&shard, outcome);
            }
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.get_mut(&dataset) {
                Some(d) if *d => *d = false,
                _ => {
                    // Freed under the same lock that `due` takes, so that a
                    // release falling due now starts a task of its own.
                    slots.remove(&dataset);
                    slot.armed = false;
                    return;
                }
            }
        }
    }
}

/// Removes a dataset's entry of [`Inner::slots`] when its task ends other
/// than by returning (a panic): later due steps then start releases again.
struct SlotGuard {
    inner: Arc<Inner>,
    dataset: String,
    armed: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(&self.dataset);
    }
}

/// One policy release of sharded dataset `dataset`: `Ok(true)` released,
/// `Ok(false)` nothing to do (no policy any more; a deferred release with no
/// step since the last policy release), or the refusal to record.
async fn attempt(state: &Arc<AppState>, dataset: &str) -> EngineResult<bool> {
    let node = state
        .engine
        .cluster()
        .cloned()
        .ok_or_else(|| EngineError::conflict("sharded datasets exist only in cluster mode"))?;
    let layout = node
        .layout_of(dataset)
        .await?
        .ok_or_else(|| EngineError::Internal(format!("{dataset:?} has no shard layout")))?;
    let first = layout.shard_dataset(0);
    let Some(policy) = state.engine.with_book(&first, |b| b.policy.clone())? else {
        return Ok(false);
    };
    // A deferred release with no step since the last policy release has
    // nothing new to describe; a due one finds none at its step (unless a
    // former owner of the first shard released it while handing over).
    if state.engine.policy_released_at_now(&first).await? {
        return Ok(false);
    }
    let shards = Shards {
        // No caller: the node mark alone authorises the calls.
        authorization: None,
        state: state.clone(),
        node,
        layout,
        idempotency_key: None,
    };
    // Stored with the release, so that a retry after an unknown outcome
    // finds it rather than charging twice.
    let name = format!("release-policy-{}", change_id());
    let key = Some(IdempotencyKey {
        request: name.as_bytes().to_vec(),
        key: name,
        answer: Vec::new(),
    });
    let mut pause = Duration::from_millis(100);
    for tried in 1..=TRIES {
        // The coordinator is the first shard's owner: one that handed the
        // shard over stops here, so that two nodes never run one dataset's
        // policy releases side by side (the new owner releases at the next
        // due step).
        if !state.engine.serves(&first) {
            return Ok(false);
        }
        if tried > 1 {
            if let Ok(Some(done)) = stored_answer(&shards, &key).await {
                return Ok(done.status().is_success());
            }
        }
        let answer = match release_across(
            &shards,
            &policy.request,
            key.clone(),
            ReleaseTrigger::Policy,
        )
        .await
        {
            Ok(r) | Err(r) => r,
        };
        if answer.status().is_success() {
            return Ok(true);
        }
        let retryable = answer.status().is_server_error();
        let refusal = refusal_of(answer).await;
        if !retryable || tried == TRIES {
            return Err(refusal);
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    Ok(false)
}

/// The engine's error for a refused release's problem answer, so that the
/// first shard's book keeps it as an unsharded dataset's would (with the
/// data-independent reason viewers see).
async fn refusal_of(answer: Response) -> EngineError {
    let status = answer.status();
    let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let detail = body["detail"]
        .as_str()
        .map_or_else(|| format!("refused with {status}"), str::to_string);
    let budget = &body["budget"];
    if let Some(rho_requested) = budget["rho_requested"].as_f64() {
        return EngineError::OverBudget {
            detail,
            refusal: BudgetRefusal {
                rho_spent: budget["rho_spent"].as_f64().unwrap_or(0.0),
                rho_requested,
                rho_budget: budget["rho_budget"].as_f64(),
            },
        };
    }
    if status.is_server_error() {
        EngineError::Unavailable(detail)
    } else {
        EngineError::Conflict {
            detail,
            field: None,
        }
    }
}

//! Releases and release budgets of a sharded dataset over HTTP (
//! `engine::cluster::shard_release` has the protocol, `docs/sharding.md`
//! "The change protocol" the argument).
//!
//! The node that receives `POST /v1/datasets/{d}/releases` or `PUT
//! /v1/datasets/{d}/release-budget` coordinates: it authorises (curator on
//! `d`), sends a prepare to every shard's owner in parallel
//! (`POST /v1/datasets/{shard}/shard-changes/{id}/prepare`, node to node,
//! node-marked with the cluster's key and carrying the caller's token: the
//! owner checks the mark and authorises the token for its shard), runs the mechanism
//! once on the merged statistics, commits one record per shard in one
//! PostgreSQL transaction, then asks every owner to decide
//! (`.../shard-changes/{id}/decide`), which each does from PostgreSQL, not
//! from the message. Shards found at different steps (a step in flight) are
//! released and prepared again, a few times, before a retryable `503
//! shards-apart`.

use super::auth::{Access, Claims};
use super::extract::{Auth, RawBody};
use super::idempotency::IdempotencyHeader;
use super::node_client::{is_marked_path, NodeAnswer, NODE_MARK, SHARD_CHANGES};
use super::problem::Problem;
use super::shard_routes::{json_response, Shards};
use super::state::AppState;
use crate::engine::cluster::shard_labels::dataset_label_names;
use crate::engine::cluster::shard_release::{
    check_interactive, check_sharded_request, new_change_id, release_of_shards, Apart, CrossCommit,
    Decision, Prepared, ShardChange, ShardRecordKind,
};
use crate::engine::cluster::{ClusterNode, MarkRefusal, ShardLayout};
use crate::engine::{EngineError, ReleaseOutcome};
use crate::ledger::IdempotencyKey;
use crate::release::{BudgetRequest, BudgetStatus, ReleaseRequest, ReleaseTrigger};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// How long an owner holds its shard's writes for a prepared change before
/// deciding it alone (abort, unless the commit landed).
const HOLD: Duration = Duration::from_secs(5);
/// Rounds of prepares while the shards are found at different steps.
pub(super) const ROUNDS: u32 = 20;
/// The largest body of a prepare or decide call (a change is a release
/// request, a policy or a budget: a few kB).
const PROTOCOL_BODY_LIMIT: usize = 1 << 20;
/// Path segment of the node-to-node calls.
const SEGMENT: &str = SHARD_CHANGES;

pub(super) fn problem(p: Problem) -> Response {
    p.into_response()
}

pub(super) fn engine_problem(e: EngineError) -> Response {
    Problem::from(e).into_response()
}

/// A fresh change id (its time and 80 random bits: a commit refuses a change
/// too old to commit, see `new_change_id`).
pub(super) fn change_id() -> String {
    new_change_id()
}

/// Whether `request` is a node-to-node call of this protocol to a shard.
pub(super) fn is_owner_call(request: &Request) -> bool {
    request.method() == Method::POST && is_marked_path(request.uri().path())
}

/// The refusal of a protocol call without a valid node mark.
fn mark_refused(method: &Method, path: &str, why: &str) -> Response {
    problem(Problem::new(
        StatusCode::FORBIDDEN,
        "node-mark",
        format!(
            "{method} {path} is a node-to-node call of the cross-shard change protocol, which \
             only the cluster's nodes can make (they sign it with the cluster's key), and is \
             refused: {why}. Send releases and release-budget changes to the sharded dataset \
             (docs/cluster.md, \"Node-to-node authentication\")"
        ),
    ))
}

/// The owner's side: prepare or decide change `id` on shard `shard`. The call
/// must carry a valid, fresh node mark (`node_client::sign_node_call`), and
/// its `Authorization`, when it has one (the coordinator's caller's), must
/// cover the shard as a curator; without one the mark alone is a node's own
/// call.
pub(super) async fn owner_call(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    shard: String,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let Some(mark) = parts
        .headers
        .get(NODE_MARK)
        .map(|v| v.to_str().unwrap_or("").to_string())
    else {
        return mark_refused(&parts.method, parts.uri.path(), "it carries no node mark");
    };
    // A caller's token is checked before the body is read, and the body is
    // bounded by what a change can be (a release request, a policy: a few kB).
    if parts.headers.contains_key(header::AUTHORIZATION) {
        let claims = match Auth::from_request_parts(&mut parts, &state).await {
            Ok(Auth(c)) => c,
            Err(p) => return problem(p),
        };
        if let Err(p) = claims.authorize(Access::Curate(&shard)) {
            return problem(p);
        }
    }
    let limit = state.limits.max_body_bytes.min(PROTOCOL_BODY_LIMIT);
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return problem(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "the request body is too large (or could not be read)",
        ));
    };
    match node
        .marks()
        .check(&mark, parts.method.as_str(), &target, &bytes)
    {
        Ok(_) => {}
        Err(MarkRefusal::Busy) => {
            return problem(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "node-mark",
                MarkRefusal::Busy.to_string(),
            ))
        }
        Err(why) => return mark_refused(&parts.method, parts.uri.path(), &why.to_string()),
    }
    let body = axum::body::Body::from(bytes);
    let path = parts.uri.path().to_string();
    let path_query = parts.uri.query().map(str::to_string);
    let segments: Vec<&str> = path.split('/').collect();
    let (id, action) = (segments[5].to_string(), segments[6]);
    match action {
        "prepare" => {
            let raw = match RawBody::from_request(Request::from_parts(parts, body), &state).await {
                Ok(r) => r,
                Err(p) => return problem(p),
            };
            let mut change: ShardChange = match raw.json() {
                Ok(c) => c,
                Err(p) => return problem(p),
            };
            // Validated again here: the owner must never compute on what the
            // coordinator refuses (`bins: 0`, a budget that is not a finite
            // rho >= 0), whichever node sent it.
            if let Err(e) = validate_change(&mut change) {
                return engine_problem(e);
            }
            let at = match step_asked(path_query.as_deref()) {
                Ok(at) => at,
                Err(p) => return problem(p),
            };
            let engine = state.engine.clone();
            let prepared = super::task::run_to_completion(async move {
                engine
                    .prepare_shard_change(&shard, &id, change, at, HOLD)
                    .await
            })
            .await;
            match prepared {
                Ok(p) => json_response(StatusCode::OK, &p),
                Err(p) => problem(p),
            }
        }
        "decide" => match state.engine.decide_shard_change(&shard, &id).await {
            Ok(d) => json_response(
                StatusCode::OK,
                &json!({"decision": if d == Decision::Committed { "committed" } else { "aborted" }}),
            ),
            Err(e) => engine_problem(e),
        },
        _ => problem(Problem::not_found("no such endpoint")),
    }
}

/// The step a prepare's release must describe: `?at=s`, or none.
fn step_asked(query: Option<&str>) -> Result<Option<u64>, Problem> {
    let Some(query) = query else { return Ok(None) };
    for pair in query.split('&') {
        if let Some(at) = pair.strip_prefix("at=") {
            return at.parse().map(Some).map_err(|_| {
                Problem::bad_request(format!("at must be a step number, not {at:?}"))
                    .with_field("at")
            });
        }
    }
    Ok(None)
}

/// What a coordinator checks of a change, checked again by each owner.
fn validate_change(change: &mut ShardChange) -> Result<(), EngineError> {
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

/// Answers a release or budget change of sharded dataset `layout.dataset`
/// (`cluster_routes::serve_sharded` sends them here), run to its end even if the caller goes (owners
/// hold their shards' writes until it is decided).
pub(super) async fn serve(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Response {
    let budget = request.method() == Method::PUT;
    serve_with(
        state,
        node,
        layout,
        request,
        move |shards, claims, key, raw| async move {
            if budget {
                set_budget(shards, claims, key, raw).await
            } else {
                release(shards, claims, key, raw).await
            }
        },
    )
    .await
}

/// What a coordinated change of a sharded dataset's needs before it is
/// answered by `change` (also `shard_labels.rs`'s): the caller's claims and
/// `Idempotency-Key`, the shards, the raw body; `change` runs to its end even
/// if the caller goes (owners hold their shards' writes until it is decided).
pub(super) async fn serve_with<F, Fut>(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
    change: F,
) -> Response
where
    F: FnOnce(Shards, Claims, IdempotencyHeader, RawBody) -> Fut,
    Fut: std::future::Future<Output = Result<Response, Response>> + Send + 'static,
{
    let (mut parts, body) = request.into_parts();
    let claims = match Auth::from_request_parts(&mut parts, &state).await {
        Ok(Auth(c)) => c,
        Err(p) => return problem(p),
    };
    let idempotency = match IdempotencyHeader::from_request_parts(&mut parts, &state).await {
        Ok(i) => i,
        Err(p) => return problem(p),
    };
    let shards = Shards {
        authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
        state: state.clone(),
        node,
        layout,
        // The change's own key is kept by the coordinator's commit (one key
        // for the dataset), never passed on to the shards' prepares.
        idempotency_key: None,
    };
    let raw = match RawBody::from_request(Request::from_parts(parts, body), &state).await {
        Ok(r) => r,
        Err(p) => return problem(p),
    };
    let task = tokio::spawn(change(shards, claims, idempotency, raw));
    match task.await {
        Ok(Ok(r) | Err(r)) => r,
        Err(_) => problem(Problem::internal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the change's task failed",
        )),
    }
}

/// Prepare `change` as `id` on every shard: each shard's [`Prepared`], or the
/// answer to give (after every shard was asked to decide, i.e. abort).
pub(super) async fn prepare_all(
    shards: &Shards,
    id: &str,
    change: &ShardChange,
    at: Option<u64>,
) -> Result<Vec<Prepared>, Response> {
    let body = serde_json::to_vec(change).unwrap_or_default();
    let query = at.map(|s| format!("?at={s}")).unwrap_or_default();
    let requests = (0..shards.layout.ranges.len())
        .map(|s| {
            (
                s,
                Method::POST,
                format!("/{SEGMENT}/{id}/prepare{query}"),
                Some(("application/json", body.clone())),
            )
        })
        .collect();
    let answers = shards.gather(requests).await;
    let mut prepared = Vec::with_capacity(answers.len());
    let mut failure: Option<Response> = None;
    for answer in answers {
        match answer {
            Ok(a) if a.ok() => match serde_json::from_slice::<Prepared>(&a.body) {
                Ok(p) => prepared.push(p),
                Err(e) => {
                    failure.get_or_insert(problem(Problem::internal(
                        StatusCode::BAD_GATEWAY,
                        format!("a shard's prepare answer was malformed: {e}"),
                    )));
                }
            },
            Ok(a) => {
                failure.get_or_insert(NodeAnswer::into_response(a));
            }
            Err(r) => {
                failure.get_or_insert(r);
            }
        }
    }
    match failure {
        None => Ok(prepared),
        Some(r) => {
            decide_all(shards, id).await;
            Err(r)
        }
    }
}

/// Ask every shard's owner to decide `id` now (each asks PostgreSQL). An
/// owner that does not hear it decides alone when its hold runs out.
pub(super) async fn decide_all(shards: &Shards, id: &str) {
    let requests = (0..shards.layout.ranges.len())
        .map(|s| (s, Method::POST, format!("/{SEGMENT}/{id}/decide"), None))
        .collect();
    for a in shards.gather(requests).await.into_iter().flatten() {
        if !a.ok() {
            tracing::warn!(change = id, status = %a.status, "a shard did not decide a change at once");
        }
    }
}

/// The answer a change with idempotency key `key` stored, if it was made.
pub(super) async fn stored_answer(
    shards: &Shards,
    key: &Option<IdempotencyKey>,
) -> Result<Option<Response>, Response> {
    let Some(k) = key else { return Ok(None) };
    let d = &shards.layout.dataset;
    let Some(done) = shards
        .state
        .engine
        .sharded_key(d, &k.key)
        .await
        .map_err(engine_problem)?
    else {
        return Ok(None);
    };
    if done.request != k.request {
        return Err(engine_problem(EngineError::KeyReused {
            key: k.key.clone(),
        }));
    }
    let value: serde_json::Value = serde_json::from_slice(&done.answer).map_err(|e| {
        problem(Problem::internal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the stored answer is unreadable: {e}"),
        ))
    })?;
    let status = if value.get("release").is_some() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(Some(json_response(status, &value)))
}

pub(super) fn apart(detail: String) -> Response {
    problem(Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shards-apart",
        detail,
    ))
}

/// Commit the shards' records of change `id` (the same payload on each) and
/// tell the owners; the answer to give, from `answer` when committed.
#[allow(clippy::too_many_arguments)]
pub(super) async fn commit(
    shards: &Shards,
    id: &str,
    kind: ShardRecordKind,
    payload: Vec<u8>,
    prepared: &[Prepared],
    key: Option<IdempotencyKey>,
    status: StatusCode,
    answer: serde_json::Value,
) -> Response {
    let payloads = vec![payload; prepared.len()];
    commit_each(shards, id, kind, payloads, prepared, key, status, answer).await
}

/// [`commit`] with each shard's own payload (`payloads[s]` for shard `s`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn commit_each(
    shards: &Shards,
    id: &str,
    kind: ShardRecordKind,
    payloads: Vec<Vec<u8>>,
    prepared: &[Prepared],
    key: Option<IdempotencyKey>,
    status: StatusCode,
    answer: serde_json::Value,
) -> Response {
    let targets = prepared
        .iter()
        .zip(payloads)
        .enumerate()
        .map(|(s, (p, payload))| (shards.layout.shard_dataset(s), p.epoch, payload))
        .collect();
    let d = shards.layout.dataset.clone();
    let answer_bytes = serde_json::to_vec(&answer).unwrap_or_default();
    let stored_key = key.clone().map(|k| {
        (
            d,
            IdempotencyKey {
                answer: answer_bytes,
                ..k
            },
        )
    });
    let committed = shards
        .state
        .engine
        .commit_each_across(id, kind, targets, stored_key)
        .await;
    decide_all(shards, id).await;
    match committed {
        Ok(CrossCommit::Committed(_)) => json_response(status, &answer),
        Ok(CrossCommit::KeyUsed) => match stored_answer(shards, &key).await {
            Ok(Some(r)) => r,
            Ok(None) => apart("the idempotency key was stored meanwhile: retry".into()),
            Err(r) => r,
        },
        Ok(CrossCommit::Fenced(detail)) => problem(Problem::not_owner(
            format!(
                "a shard's owner changed during the change, nothing was charged: retry ({detail})"
            ),
            None,
        )),
        Ok(CrossCommit::Decided) => apart(
            "a shard's owner stopped waiting for the change, nothing was charged: retry".into(),
        ),
        Err(e) => engine_problem(e),
    }
}

/// `POST /v1/datasets/{d}/releases` of a sharded dataset.
async fn release(
    shards: Shards,
    claims: Claims,
    idempotency: IdempotencyHeader,
    raw: RawBody,
) -> Result<Response, Response> {
    let d = shards.layout.dataset.clone();
    claims.authorize(Access::Curate(&d)).map_err(problem)?;
    let key = idempotency.key(raw.bytes()).map_err(problem)?;
    let mut request: ReleaseRequest = raw.json().map_err(problem)?;
    request
        .validate()
        .map_err(|e| engine_problem(EngineError::from(e)))?;
    check_interactive(&request).map_err(engine_problem)?;
    if let Some(done) = stored_answer(&shards, &key).await? {
        return Ok(done);
    }
    release_across(&shards, &request, key, ReleaseTrigger::Request).await
}

/// Make `request` (validated, [`check_sharded_request`]) one release of every
/// shard or of none, stored under `key` when given: prepare, merge, run the
/// mechanism once, commit, decide. A curator's release (`trigger` request)
/// and the policy's (`shard_policy.rs`) alike; the answer to give, or the
/// refusal.
pub(super) async fn release_across(
    shards: &Shards,
    request: &ReleaseRequest,
    key: Option<IdempotencyKey>,
    trigger: ReleaseTrigger,
) -> Result<Response, Response> {
    let change = ShardChange::Release(request.clone());
    let mut last = Vec::new();
    for round in 0..ROUNDS {
        let id = change_id();
        // After shards were found at different steps: the furthest any was
        // at, which the others reach when the step's parts arrive (views
        // cannot go back).
        let at = last.iter().max().copied();
        let prepared = prepare_all(shards, &id, &change, at).await?;
        // Groups need labels: the dataset's names, labels after creation
        // included, are known once the shards answered.
        // (Shards that disagree on them are refused by the merge below.)
        let creation = &shards.layout.label_names;
        let shard_names = prepared.iter().map(|p| p.labels.as_slice());
        if let Some(names) = dataset_label_names(creation, shard_names) {
            if let Err(e) = check_sharded_request(request, &names) {
                decide_all(shards, &id).await;
                return Err(engine_problem(e));
            }
        }
        // The mechanism off the async threads (the merged cells are one
        // `u32` per example).
        let computed = {
            let (request, prepared, creation) =
                (request.clone(), prepared.clone(), creation.clone());
            tokio::task::spawn_blocking(move || {
                release_of_shards(&request, &prepared, &creation, trigger)
            })
            .await
            .unwrap_or_else(|_| Err(Apart::Disagree("the mechanism's task failed".into())))
        };
        let release = match computed {
            Ok(r) => r,
            Err(Apart::Steps(steps)) => {
                decide_all(shards, &id).await;
                last = steps;
                tokio::time::sleep(Duration::from_millis(10 * u64::from(round + 1))).await;
                continue;
            }
            Err(Apart::Disagree(detail)) => {
                decide_all(shards, &id).await;
                return Err(apart(format!(
                    "the shards cannot make one release: {detail}"
                )));
            }
        };
        let before = prepared[0].budget;
        let budget = BudgetStatus {
            rho_spent: before.rho_spent + release.rho,
            releases: before.releases + 1,
            ..before
        };
        let payload = serde_json::to_vec(&release).unwrap_or_default();
        let outcome = ReleaseOutcome { release, budget };
        let answer = serde_json::to_value(&outcome).unwrap_or_default();
        return Ok(commit(
            shards,
            &id,
            ShardRecordKind::Release,
            payload,
            &prepared,
            key,
            StatusCode::CREATED,
            answer,
        )
        .await);
    }
    Err(apart(format!(
        "the shards were at different steps ({last:?}) at every try (steps in flight): retry"
    )))
}

/// `PUT /v1/datasets/{d}/release-budget` of a sharded dataset: the same
/// budget on every shard, in one transaction.
async fn set_budget(
    shards: Shards,
    claims: Claims,
    idempotency: IdempotencyHeader,
    raw: RawBody,
) -> Result<Response, Response> {
    let d = shards.layout.dataset.clone();
    claims.authorize(Access::Curate(&d)).map_err(problem)?;
    let key = idempotency.key(raw.bytes()).map_err(problem)?;
    let request: BudgetRequest = raw.json().map_err(problem)?;
    let rho = request
        .to_rho()
        .map_err(|e| engine_problem(EngineError::from(e)))?;
    if let Some(done) = stored_answer(&shards, &key).await? {
        return Ok(done);
    }
    let id = change_id();
    let prepared = prepare_all(&shards, &id, &ShardChange::Budget(rho), None).await?;
    let before = prepared[0].budget;
    if prepared.iter().any(|p| p.budget != before) {
        decide_all(&shards, &id).await;
        return Err(apart("the shards' release budgets differ".into()));
    }
    let budget = BudgetStatus {
        rho_budget: Some(rho),
        ..before
    };
    let payload = serde_json::to_vec(&json!({ "rho_budget": rho })).unwrap_or_default();
    let answer = serde_json::to_value(budget).unwrap_or_default();
    Ok(commit(
        &shards,
        &id,
        ShardRecordKind::BudgetChange,
        payload,
        &prepared,
        key,
        StatusCode::OK,
        answer,
    )
    .await)
}

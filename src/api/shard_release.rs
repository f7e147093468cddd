//! Releases and release budgets of a sharded dataset over HTTP: the
//! handlers. The node that receives `POST /v1/datasets/{d}/releases` or `PUT
//! /v1/datasets/{d}/release-budget` authorises the caller (curator on `d`),
//! reads the request and hands it to the engine's coordinator
//! (`engine::sharding`, the protocol in `docs/sharding.md` "The change
//! protocol"), which prepares it on every shard, commits it in one
//! transaction and has every owner decide; the answer is the coordinator's.
//! [`serve_with`] is what every coordinated change's handler shares
//! (`shard_policy.rs`, `shard_labels.rs`, `shard_archive.rs`).

use super::auth::{Access, Claims};
use super::errors::engine_response;
use super::extract::{Auth, RawBody};
use super::idempotency::IdempotencyHeader;
use super::problem::Problem;
use super::shard_routes::{json_response, Shards};
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::ShardLayout;
use crate::engine::sharding::{ChangeAnswer, Coordinator, Credential};
use crate::engine::EngineError;
use crate::release::{BudgetRequest, BudgetRequestExt, ReleaseRequest};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub(super) fn problem(p: Problem) -> Response {
    p.into_response()
}

/// The coordinator of `shards`' dataset, acting for the caller whose
/// `Authorization` `shards` carries (the owners authorise it again).
pub(super) fn coordinator(shards: &Shards) -> Result<Coordinator, EngineError> {
    let credential = shards
        .authorization
        .as_ref()
        .map(|a| Credential(a.as_bytes().to_vec()));
    shards
        .state
        .engine
        .coordinate(shards.layout.clone(), credential)
}

/// The coordinator's answer as this node's: `201` for what it created (a
/// release), else `200`; a refusal as the engine or the shard's owner gave it.
pub(super) fn answer(outcome: Result<ChangeAnswer, EngineError>) -> Response {
    match outcome {
        Ok(a) if a.created => json_response(StatusCode::CREATED, &a.body),
        Ok(a) => json_response(StatusCode::OK, &a.body),
        Err(e) => engine_response(e),
    }
}

/// Answers a release or budget change of sharded dataset `layout.dataset`
/// (`cluster_routes::serve_sharded` sends them here), run to its end even if
/// the caller goes (owners hold their shards' writes until it is decided).
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

/// What a coordinated change of a sharded dataset needs before it is
/// answered by `change` (a release or budget here; the policy's, labels' and
/// archive's in their files): the caller's claims and `Idempotency-Key`, the
/// shards, the raw body; `change` runs to its end even if the caller goes
/// (owners hold their shards' writes until it is decided).
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
    let request: ReleaseRequest = raw.json().map_err(problem)?;
    let coordinator = coordinator(&shards).map_err(engine_response)?;
    Ok(answer(coordinator.release(request, key).await))
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
        .map_err(|e| engine_response(EngineError::from(e)))?;
    let coordinator = coordinator(&shards).map_err(engine_response)?;
    Ok(answer(coordinator.set_budget(rho, key).await))
}

//! `PUT /v1/datasets/{d}/release-policy` of a sharded dataset over HTTP: the
//! handler. Any node authorises the caller and hands the policy to the
//! engine's coordinator (`engine::sharding`, the argument in
//! `docs/sharding.md` "Release policies"), which writes one `ReleasePolicy`
//! record to every shard's log or to none, so that every shard's book holds
//! the same policy; `GET` is answered by the first shard. The policy's
//! releases are the engine's too: the owner of the dataset's first shard
//! starts them when it sees a due step.

use super::auth::{Access, Claims};
use super::errors::engine_response;
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::release_routes::PolicyUpdate;
use super::shard_release::{answer, coordinator, serve_with};
use super::shard_routes::Shards;
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::ShardLayout;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

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
    let d = shards.layout.dataset.clone();
    claims
        .authorize(Access::Curate(&d))
        .map_err(IntoResponse::into_response)?;
    let key = idempotency
        .key(raw.bytes())
        .map_err(IntoResponse::into_response)?;
    let update: PolicyUpdate = raw.json().map_err(IntoResponse::into_response)?;
    let coordinator = coordinator(&shards).map_err(engine_response)?;
    Ok(answer(coordinator.set_policy(update.policy, key).await))
}

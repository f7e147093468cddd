//! `PUT /v1/datasets/{d}/labels` of a sharded dataset over HTTP: the
//! handler. Any node authorises the caller and hands the assignment to the
//! engine's coordinator (`engine::sharding`; `docs/sharding.md` "Labels after
//! creation and shuffled sampling" has the argument): prepared on every shard,
//! one record per shard carrying its examples' part of the assignment and the
//! dataset's label names after it, committed in one fenced transaction.

use super::auth::{Access, Claims};
use super::errors::engine_response;
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::shard_release::{answer, coordinator, problem, serve_with};
use super::shard_routes::Shards;
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::ShardLayout;
use crate::release::LabelAssignment;
use axum::extract::Request;
use axum::response::Response;
use std::sync::Arc;

/// Answers `PUT /v1/datasets/{d}/labels` of sharded dataset `layout.dataset`.
pub(super) async fn serve(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Response {
    serve_with(state, node, layout, request, set_labels).await
}

/// Assigns labels to a sharded dataset's examples, on every shard or none;
/// answers as an unsharded dataset does (the groups in order of first use).
async fn set_labels(
    shards: Shards,
    claims: Claims,
    idempotency: IdempotencyHeader,
    raw: RawBody,
) -> Result<Response, Response> {
    let d = shards.layout.dataset.clone();
    claims.authorize(Access::Curate(&d)).map_err(problem)?;
    let key = idempotency.key(raw.bytes()).map_err(problem)?;
    let assignment: LabelAssignment = raw.json().map_err(problem)?;
    let coordinator = coordinator(&shards).map_err(engine_response)?;
    Ok(answer(coordinator.set_labels(assignment, key).await))
}

//! Archiving a sharded dataset over HTTP (`docs/sharding.md` "Archiving
//! and refreshes"): the handler. The change is the engine coordinator's
//! (`engine::sharding`): every shard prepared at one step (its writes held),
//! then one `Archived` record per shard committed in one PostgreSQL
//! transaction, each fenced by its owner's epoch. Every shard is
//! archived after the same steps: a step whose parts are in flight is applied
//! by every shard before the archive or refused by every shard after it,
//! never applied by some and refused by others.
//!
//! A dataset one of whose shards is archived already (a shard archived by
//! hand, or by an earlier version's fan-out cut short) is completed shard by
//! shard as before: a shard's archive is idempotent.

use super::auth::{Access, Claims};
use super::errors::engine_response;
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::shard_release::{coordinator, problem, serve_with};
use super::shard_routes::{json_response, view, Shards};
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::ShardLayout;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use std::sync::Arc;

/// Answers `POST /v1/datasets/{d}/archive` of sharded dataset
/// `layout.dataset` with the merged view, run to its end even if the caller
/// goes (owners hold their shards' writes until the change is decided).
pub(super) async fn serve(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Response {
    serve_with(state, node, layout, request, archive).await
}

/// Archive every shard (module note), then answer the merged view.
async fn archive(
    shards: Shards,
    claims: Claims,
    idempotency: IdempotencyHeader,
    raw: RawBody,
) -> Result<Response, Response> {
    claims
        .authorize(Access::Curate(&shards.layout.dataset))
        .map_err(problem)?;
    // A malformed key is refused as anywhere; a retry needs none (archiving
    // an archived dataset changes nothing and answers the same view).
    idempotency.key(raw.bytes()).map_err(problem)?;
    if view(&shards).await?.archived {
        let requests = (0..shards.layout.ranges.len())
            .map(|s| (s, Method::POST, "/archive".to_string(), None))
            .collect();
        shards.send_all(requests).await?;
    } else {
        let coordinator = coordinator(&shards).map_err(engine_response)?;
        coordinator.archive().await.map_err(engine_response)?;
    }
    Ok(json_response(StatusCode::OK, &view(&shards).await?))
}

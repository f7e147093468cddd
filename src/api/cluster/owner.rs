//! The owner's side of the cross-shard change protocol over HTTP: another
//! node's coordinator asks this node, which owns shard `{shard}`, to prepare
//! or decide a change (`POST /v1/datasets/{shard}/shard-changes/{id}/
//! {prepare|decide}`). The call must carry a valid, fresh node mark, and its
//! `Authorization`, when it has one (the coordinator's caller's), must cover
//! the shard as a curator; without one the mark alone is a node's own call.
//! The calls are routes of the router like any other, whose [`NodeCall`]
//! extractor checks the mark; the engine does the rest
//! (`Engine::prepare_for_coordinator`, `Engine::decide_shard_change`).

use super::node_client::{is_marked_path, NODE_MARK, SHARD_CHANGES};
use crate::api::auth::Access;
use crate::api::extract::{ApiPath, Auth, RawBody};
use crate::api::problem::{ApiResult, Problem};
use crate::api::state::AppState;
use crate::engine::cluster::MarkRefusal;
use crate::engine::sharding::protocol::{validate_change, Decision, Prepared, ShardChange};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

/// The largest body of a prepare or decide call (a change is a release
/// request, a policy or a budget: a few kB).
const PROTOCOL_BODY_LIMIT: usize = 1 << 20;

/// Whether `request` is a node-to-node call of this protocol to a shard.
pub(crate) fn is_owner_call(request: &Request) -> bool {
    request.method() == Method::POST && is_marked_path(request.uri().path())
}

/// The refusal of a protocol call without a valid node mark.
fn mark_refused(method: &Method, path: &str, why: &str) -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        "node-mark",
        format!(
            "{method} {path} is a node-to-node call of the cross-shard change protocol, which \
             only the cluster's nodes can make (they sign it with the cluster's key), and is \
             refused: {why}. Send releases and release-budget changes to the sharded dataset \
             (docs/cluster.md, \"Node-to-node authentication\")"
        ),
    )
}

/// A call of the change protocol whose node mark (and caller's token, when
/// it has one) was checked: its body, read whole within
/// [`PROTOCOL_BODY_LIMIT`]. Refused when this node is not in cluster mode
/// (no such endpoint) or the mark is missing, stale, reused or forged.
pub struct NodeCall {
    body: RawBody,
}

impl FromRequest<Arc<AppState>> for NodeCall {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, Problem> {
        let Some(node) = state.engine.cluster().cloned() else {
            return Err(Problem::not_found("no such endpoint"));
        };
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
            return Err(mark_refused(
                &parts.method,
                parts.uri.path(),
                "it carries no node mark",
            ));
        };
        // A caller's token is checked before the body is read, and the body is
        // bounded by what a change can be (a release request, a policy: a few kB).
        if parts.headers.contains_key(header::AUTHORIZATION) {
            let Auth(claims) = Auth::from_request_parts(&mut parts, state).await?;
            let shard = parts.uri.path().split('/').nth(3).unwrap_or("");
            claims.authorize(Access::Curate(shard))?;
        }
        let limit = state.limits.max_body_bytes.min(PROTOCOL_BODY_LIMIT);
        let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
            return Err(Problem::new(
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
                return Err(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "node-mark",
                    MarkRefusal::Busy.to_string(),
                ))
            }
            Err(why) => {
                return Err(mark_refused(
                    &parts.method,
                    parts.uri.path(),
                    &why.to_string(),
                ))
            }
        }
        let request = Request::from_parts(parts, axum::body::Body::from(bytes));
        let body = RawBody::from_request(request, state).await?;
        Ok(NodeCall { body })
    }
}

/// Prepare change `id` on shard `shard`: the change checked again, prepared,
/// its writes held until decided.
async fn prepare(
    State(state): State<Arc<AppState>>,
    ApiPath((shard, id)): ApiPath<(String, String)>,
    query: axum::extract::RawQuery,
    call: NodeCall,
) -> ApiResult<Json<Prepared>> {
    let mut change: ShardChange = call.body.json()?;
    validate_change(&mut change)?;
    let at = step_asked(query.0.as_deref())?;
    let engine = state.engine.clone();
    let prepared = crate::api::task::run_to_completion(async move {
        engine
            .prepare_for_coordinator(&shard, &id, change, at)
            .await
    })
    .await?;
    Ok(Json(prepared))
}

/// Decide change `id` on shard `shard` now (from PostgreSQL, not from the
/// caller).
async fn decide(
    State(state): State<Arc<AppState>>,
    ApiPath((shard, id)): ApiPath<(String, String)>,
    _call: NodeCall,
) -> ApiResult<Json<serde_json::Value>> {
    let decision = state.engine.decide_shard_change(&shard, &id).await?;
    let word = if decision == Decision::Committed {
        "committed"
    } else {
        "aborted"
    };
    Ok(Json(json!({ "decision": word })))
}

/// The owners' side of the change protocol (node-to-node, not in the
/// OpenAPI document).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            &format!("/v1/datasets/{{shard}}/{SHARD_CHANGES}/{{id}}/prepare"),
            post(prepare),
        )
        .route(
            &format!("/v1/datasets/{{shard}}/{SHARD_CHANGES}/{{id}}/decide"),
            post(decide),
        )
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

//! The owner's side of the cross-shard change protocol over HTTP: another
//! node's coordinator asks this node, which owns shard `{shard}`, to prepare
//! or decide a change (`POST /v1/datasets/{shard}/shard-changes/{id}/
//! {prepare|decide}`). The call must carry a valid, fresh node mark, and its
//! `Authorization`, when it has one (the coordinator's caller's), must cover
//! the shard as a curator; without one the mark alone is a node's own call.
//! The engine does the rest (`Engine::prepare_for_coordinator`,
//! `Engine::decide_shard_change`).

use super::node_client::{is_marked_path, NODE_MARK};
use crate::api::auth::Access;
use crate::api::errors::engine_response;
use crate::api::extract::{Auth, RawBody};
use crate::api::problem::Problem;
use crate::api::state::AppState;
use crate::engine::cluster::{ClusterNode, MarkRefusal};
use crate::engine::sharding::owners::{validate_change, Decision, ShardChange};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;

/// The largest body of a prepare or decide call (a change is a release
/// request, a policy or a budget: a few kB).
const PROTOCOL_BODY_LIMIT: usize = 1 << 20;

fn problem(p: Problem) -> Response {
    p.into_response()
}

fn json_response(value: &impl serde::Serialize) -> Response {
    (StatusCode::OK, axum::Json(value)).into_response()
}

/// Whether `request` is a node-to-node call of this protocol to a shard.
pub(crate) fn is_owner_call(request: &Request) -> bool {
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

/// Prepare or decide change `id` on shard `shard` (module note).
pub(crate) async fn owner_call(
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
            if let Err(e) = validate_change(&mut change) {
                return engine_response(e);
            }
            let at = match step_asked(path_query.as_deref()) {
                Ok(at) => at,
                Err(p) => return problem(p),
            };
            let engine = state.engine.clone();
            let prepared = crate::api::task::run_to_completion(async move {
                engine
                    .prepare_for_coordinator(&shard, &id, change, at)
                    .await
            })
            .await;
            match prepared {
                Ok(p) => json_response(&p),
                Err(p) => problem(p),
            }
        }
        "decide" => match state.engine.decide_shard_change(&shard, &id).await {
            Ok(d) => json_response(
                &json!({"decision": if d == Decision::Committed { "committed" } else { "aborted" }}),
            ),
            Err(e) => engine_response(e),
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

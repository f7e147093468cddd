//! Cluster mode's routing middleware (`docs/cluster.md`): a request for a
//! dataset this node does not serve is forwarded to the owner (body streamed,
//! bounded timeout, `Authorization` passed through: the owner authorises it),
//! or refused with the retryable `503 not-owner` and `Retry-After`; a
//! creation is sent to the node placement chooses (most free memory), unless
//! it is sharded (its handler here coordinates it) or malformed (refused
//! here). A sharded dataset's requests are
//! answered by the handlers here (the engine reaches its shards), except a
//! read of its release book, routed as its first shard's. It only routes:
//! what a request does is its handler's.

use super::cluster::node_client::{client, FORWARDED};
use super::dataset_routes::CreateDataset;
use super::extract::Auth;
use super::problem::{OwnerRef, Problem};
use super::state::AppState;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

type S = State<Arc<AppState>>;

/// The dataset a request's path names (`/v1/datasets/{dataset}[/...]`).
fn dataset_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/datasets/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Where a request of a dataset goes.
enum Routed {
    /// Answered (by the handler here, by the owner, or refused).
    Answer(Response),
    /// A read of a sharded dataset's release book, rewritten to its first
    /// shard (whose book is the dataset's: every change is in every shard's
    /// log), to be routed as that shard's request: forwarded to its owner,
    /// or answered by the handler here (routing happened before this
    /// middleware, so the handler still sees the dataset's id, and the
    /// engine reads the first shard's book for it).
    FirstShard(Request, String),
}

/// A sharded dataset's request: its handler here answers it (the engine
/// knows the layout and reaches the shards), except a read of its release
/// book, which its first shard answers.
async fn serve_sharded(
    layout: Arc<crate::engine::sharding::ShardLayout>,
    request: Request,
    next: Next,
) -> Routed {
    let path = request.uri().path();
    let rest = path
        .strip_prefix("/v1/datasets/")
        .and_then(|p| p.strip_prefix(layout.dataset.as_str()))
        .unwrap_or("")
        .to_string();
    let book_read = request.method() == axum::http::Method::GET
        && (rest == "/releases"
            || rest.starts_with("/releases/")
            || rest == "/release-budget"
            || rest == "/release-policy");
    if !book_read {
        return Routed::Answer(next.run(request).await);
    }
    let shard = layout.shard_dataset(0);
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (mut parts, body) = request.into_parts();
    match format!("/v1/datasets/{shard}{rest}{query}").parse() {
        Ok(uri) => parts.uri = uri,
        Err(_) => {
            return Routed::Answer(
                Problem::bad_request("the request's path cannot be routed").into_response(),
            )
        }
    }
    Routed::FirstShard(Request::from_parts(parts, body), shard)
}

/// A change sent straight to one shard `{d}~{start}` that only its dataset
/// may make (`409 sharded-unsupported`): releases, labels or budgets on one
/// shard would charge or change it alone. Reads, step parts, refreshes and
/// archiving (what a node sends its shards) pass; a step part or refresh sent
/// to one shard by hand is accounted for that shard's examples as such; a
/// shard archived by hand makes the dataset read-only (its view says
/// archived), which archiving the dataset completes.
fn refuse_shard_change(id: &str, request: &Request) -> Option<Response> {
    let (dataset, _) = crate::engine::sharding::parse_shard_id(id)?;
    let path = request.uri().path();
    let post = *request.method() == axum::http::Method::POST;
    let passes = *request.method() == axum::http::Method::GET
        || (post
            && (path.ends_with("/steps")
                || path.ends_with("/archive")
                || path.ends_with("/refresh")));
    if passes {
        return None;
    }
    let error = crate::engine::EngineError::ShardedUnsupported(format!(
        "{} {path}: {id:?} is a shard of the sharded dataset {dataset:?}; changes other than \
         steps go to the dataset (change the sharded dataset instead; see docs/sharding.md)",
        request.method()
    ));
    Some(Problem::from(error).into_response())
}

/// Routing middleware (cluster mode only): a dataset's request goes to the
/// handler when this node serves the dataset, else to its owner; see the
/// module documentation.
pub async fn route_to_owner(State(state): S, request: Request, next: Next) -> Response {
    let Some(node) = state.engine.cluster().cloned() else {
        return next.run(request).await;
    };
    let mut request = request;
    if request.method() == axum::http::Method::POST
        && request.uri().path() == "/v1/datasets"
        && !request.headers().contains_key(FORWARDED)
    {
        // A sharded creation is coordinated by the node that receives it.
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, state.limits.max_body_bytes).await else {
            return too_large();
        };
        let creation = serde_json::from_slice::<CreateDataset>(&bytes).ok();
        // A name asked for moments ago and found absent exists from now on.
        if let Some(creation) = &creation {
            node.forget_absent(&creation.id);
        }
        // A sharded creation is coordinated by the node that receives it
        // (its handler), and a malformed one refused here; any other goes
        // where placement puts it.
        let placed = creation.is_some_and(|c| !c.is_sharded(state.limits.max_shard_examples));
        request = Request::from_parts(parts, Body::from(bytes));
        if let (true, Some(target)) = (placed, node.placement()) {
            let target = OwnerRef {
                node_id: target.node_id,
                advertise: target.advertise,
            };
            return place(&state, request, target, next).await;
        }
    }
    let Some(id) = dataset_of(request.uri().path()).map(str::to_string) else {
        return next.run(request).await;
    };
    match route_dataset(&state, &node, id, request, next.clone()).await {
        Routed::Answer(response) => response,
        // A shard is never sharded itself: routed once more at most.
        Routed::FirstShard(request, shard) => {
            match route_dataset(&state, &node, shard, request, next).await {
                Routed::Answer(response) => response,
                Routed::FirstShard(..) => Problem::internal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "a shard was found sharded",
                )
                .into_response(),
            }
        }
    }
}

/// Routes a request of dataset `id`: see [`route_to_owner`].
async fn route_dataset(
    state: &Arc<AppState>,
    node: &Arc<crate::engine::cluster::ClusterNode>,
    id: String,
    request: Request,
    next: Next,
) -> Routed {
    let mut request = request;
    if let Some(layout) = state.engine.known_layout(&id) {
        return serve_sharded(layout, request, next).await;
    }
    // The change protocol's calls are answered here (their handler checks
    // the node mark; the engine refuses a shard it does not own).
    if super::cluster::is_owner_call(&request) {
        return Routed::Answer(next.run(request).await);
    }
    if let Some(refusal) = refuse_shard_change(&id, &request) {
        return Routed::Answer(refusal);
    }
    if state.engine.serves(&id) {
        return Routed::Answer(next.run(request).await);
    }
    // Found to exist nowhere moments ago: no reads of PostgreSQL before the
    // handler authorises (the negative cache, `engine::cluster::unknown`), for
    // callers without valid credentials only. A caller who authenticates
    // always gets a fresh read, so a dataset just created through another
    // node is never answered 404 to its own trainer.
    if node.known_absent(&id) {
        let (mut parts, body) = request.into_parts();
        let authenticated = Auth::from_request_parts(&mut parts, state).await.is_ok();
        request = Request::from_parts(parts, body);
        if !authenticated {
            return Routed::Answer(absent(request, next, &id).await);
        }
    }
    let lease = match node.lease_lookup_cached(&id).await {
        Ok(lease) => lease,
        // Not knowing is not "no such dataset": retry once the store answers.
        Err(_) => {
            return Routed::Answer(
                Problem::not_owner(
                    format!("the lease of {id:?} could not be read from the store now: retry"),
                    None,
                )
                .into_response(),
            );
        }
    };
    let Some(lease) = lease else {
        // No lease: a sharded dataset (its shards have the leases), or none.
        match state.engine.layout_of(&id).await {
            Ok(Some(layout)) => return serve_sharded(layout, request, next).await,
            Ok(None) => node.remember_absent(&id),
            // Not knowing is not "no such dataset": retry once the store answers.
            Err(_) => {
                return Routed::Answer(
                    Problem::not_owner(
                        format!("the layout of {id:?} could not be read from the store now: retry"),
                        None,
                    )
                    .into_response(),
                );
            }
        }
        return Routed::Answer(absent(request, next, &id).await);
    };
    let owner = match (&lease.owner, &lease.advertise) {
        (Some(o), Some(a)) if lease.expires_in_ms > 0 && *o != node.config.node_id => {
            Some(OwnerRef {
                node_id: o.clone(),
                advertise: a.clone(),
            })
        }
        _ => None,
    };
    let refuse = |owner: Option<OwnerRef>, why: &str| {
        Problem::not_owner(
            format!("this node does not serve dataset {id:?} now ({why}): retry"),
            owner,
        )
        .into_response()
    };
    Routed::Answer(match owner {
        None => refuse(None, "its lease is moving"),
        Some(owner) if request.headers().contains_key(FORWARDED) => {
            refuse(Some(owner), "the request was already forwarded once")
        }
        Some(owner) => match forward(request, &owner, &node.config.node_id).await {
            Ok(response) => response,
            // Never connected: the owner cannot have seen the request, so
            // "not applied, retry" is the truth.
            Err(e) if e.is_connect() => {
                tracing::warn!(dataset = id, owner = owner.node_id, error = %e, "forwarding failed");
                refuse(Some(owner), "its owner could not be reached")
            }
            // Sent, but no (whole) answer: the owner may have applied it. The
            // not-owner promise would be false; say the outcome is unknown.
            Err(e) => {
                tracing::warn!(dataset = id, owner = owner.node_id, error = %e, "forwarded request unanswered");
                outcome_unknown(&format!(
                    "the request was forwarded to dataset {id:?}'s owner {}, which did not answer \
                     in time: it may or may not have been applied; retry with the same \
                     Idempotency-Key (steps are exactly-once by number)",
                    owner.node_id
                ))
            }
        },
    })
}

/// A request for dataset `id`, which has no lease and no layout: no such
/// dataset anywhere. The handler authorises first (a caller without a role
/// learns nothing), then its refusal becomes 404.
async fn absent(request: Request, next: Next, id: &str) -> Response {
    let response = next.run(request).await;
    if response.status() == StatusCode::SERVICE_UNAVAILABLE && is_not_owner(&response) {
        return Problem::not_found(format!("no dataset {id:?}")).into_response();
    }
    response
}

fn too_large() -> Response {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
        "the request body is too large (or could not be read)",
    )
    .into_response()
}

fn is_not_owner(response: &Response) -> bool {
    response.headers().get(header::RETRY_AFTER).is_some()
        && response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(super::problem::PROBLEM_JSON))
}

/// Headers that belong to one connection, not to the request.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "proxy-connection"
            | "trailer"
    )
}

/// Sends `request` to `owner` and streams its answer back.
async fn forward(request: Request, owner: &OwnerRef, me: &str) -> Result<Response, reqwest::Error> {
    let (parts, body) = request.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    send_to(owner, me, &parts, body).await
}

/// Sends a request (`parts` and `body`) to `owner`, marked as forwarded by
/// `me`, and streams its answer back.
async fn send_to(
    owner: &OwnerRef,
    me: &str,
    parts: &axum::http::request::Parts,
    body: reqwest::Body,
) -> Result<Response, reqwest::Error> {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let url = format!("{}{path}", owner.advertise.trim_end_matches('/'));
    let mut outgoing = client().request(parts.method.clone(), url).body(body);
    for (name, value) in parts.headers.iter() {
        if !hop_by_hop(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    outgoing = outgoing.header(FORWARDED, me);
    let answer = outgoing.send().await?;
    metrics::counter!("dpledger_cluster_forwarded_total").increment(1);
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    Ok(response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|_| {
            Problem::internal(StatusCode::BAD_GATEWAY, "the owner's answer was malformed")
                .into_response()
        }))
}

/// A creation (`POST /v1/datasets`) received here goes to the node placement
/// chose (most free memory), which creates the dataset on itself; when that
/// node cannot be reached, this node creates it (nothing was sent, so nothing
/// was applied there). The body is read first (it is bounded by the body
/// limit) so that it can still be answered here.
async fn place(state: &AppState, request: Request, target: OwnerRef, next: Next) -> Response {
    let me = state
        .engine
        .cluster()
        .map(|n| n.config.node_id.clone())
        .unwrap_or_default();
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, state.limits.max_body_bytes).await else {
        return too_large();
    };
    match send_to(&target, &me, &parts, reqwest::Body::from(bytes.clone())).await {
        Ok(response) => response,
        Err(e) if e.is_connect() => {
            tracing::warn!(node = target.node_id, error = %e,
                "placing a dataset on another node failed: creating it here");
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => {
            tracing::warn!(node = target.node_id, error = %e, "forwarded creation unanswered");
            outcome_unknown(&format!(
                "the creation was forwarded to node {} (placement), which did not answer in \
                 time: the dataset may or may not have been created there; retry with the same \
                 Idempotency-Key",
                target.node_id
            ))
        }
    }
}

fn outcome_unknown(detail: &str) -> Response {
    Problem::new(StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown", detail).into_response()
}

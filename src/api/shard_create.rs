//! A sharded creation (`POST /v1/datasets` with `"shards"`, or without it and
//! more examples than `--max-shard-examples`: ⌈examples / bound⌉ shards;
//! `docs/sharding.md` "Shards"), coordinated by the node that
//! receives it: authorise (admin), validate everything, record the layout
//! (the name's claim), then create each shard on the node
//! `ClusterNode::spread` gives it, in parallel. A retried creation with the
//! same content completes what is missing.

use super::auth::Access;
use super::cluster::node_client::call;
use super::dataset_routes::CreateDataset;
use super::extract::{Auth, RawBody};
use super::idempotency::IdempotencyHeader;
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::check_policy;
use crate::engine::sharding::labels::label_names;
use crate::engine::sharding::{shard_id, shards_for, Credential, ShardLayout};
use crate::ledger::DatasetConfigExt;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;

/// Coordinates a sharded creation (`POST /v1/datasets` with `"shards"`)
/// received by this node; see the module documentation.
pub async fn create(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    parts: Parts,
    body: axum::body::Bytes,
) -> Response {
    match create_inner(state, node, parts, body).await {
        Ok(response) => response,
        Err(problem) => problem.into_response(),
    }
}

async fn create_inner(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    mut parts: Parts,
    bytes: axum::body::Bytes,
) -> ApiResult<Response> {
    let Auth(claims) = Auth::from_request_parts(&mut parts, &state).await?;
    claims.authorize(Access::Admin)?;
    IdempotencyHeader::from_request_parts(&mut parts, &state)
        .await?
        .key(b"")?;
    let authorization = parts.headers.get(header::AUTHORIZATION).cloned();
    let raw = RawBody::from_request(
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        &state,
    )
    .await?;
    let mut body: CreateDataset = raw.json()?;
    if body.release_budget.is_some() {
        return Err(Problem::bad_request(
            "a sharded dataset's release budget is set after its creation (PUT \
             .../release-budget, charged to every shard alike): create it without one",
        )
        .with_field("release_budget"));
    }
    if !crate::engine::valid_dataset_id(&body.id) {
        return Err(Problem::bad_request(
            "id must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)",
        )
        .with_field("id"));
    }
    body.config = body.config.clone().with_creation_defaults()?;
    if body.config.label_budgets.is_some() {
        return Err(Problem::bad_request(
            "a sharded dataset has one individual budget for all its examples: budgets per \
             label are fixed by the labels at creation, which its shards do not share",
        )
        .with_field("label_budgets"));
    }
    let k = shards_for(&body.config, body.shards, state.limits.max_shard_examples)?;
    let n = body.config.examples;
    if body.labels.as_ref().is_some_and(|l| l.len() as u64 > n) {
        return Err(
            Problem::bad_request(format!("labels has more entries than the {n} examples"))
                .with_field("labels"),
        );
    }
    // Every shard checks its slice of the labels again; checking the whole
    // list before the layout is recorded keeps a bad label from taking the
    // name with shards that can never all be created.
    if let Some(labels) = &body.labels {
        let whole = crate::release::LabelAssignment {
            ids: (0..labels.len() as u64).collect(),
            labels: labels.clone(),
        };
        crate::release::Labels::default()
            .check(n, &whole)
            .map_err(crate::engine::EngineError::from)?;
    }
    // The policy (validated as the shards will see it) is part of the
    // layout, which every shard's creation must match: every shard's book
    // holds it from its first record.
    let mut spec = json!({"config": body.config, "labels": body.labels});
    if let Some(policy) = &mut body.release_policy {
        let names = label_names(&spec.to_string());
        check_policy(policy, &names)?;
        spec["release_policy"] = json!(policy);
    }
    let spec = serde_json::to_string(&spec)
        .map_err(|e| Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let layout = Arc::new(ShardLayout::new(body.id.clone(), n, k, spec));
    if !node.claim_layout(&layout).await? {
        return Err(Problem::conflict(format!(
            "dataset {:?} already exists",
            body.id
        )));
    }
    let targets = node.spread(layout.ranges.len());
    let mut tasks = Vec::new();
    for (s, range) in layout.ranges.iter().enumerate() {
        let config = layout.shard_config(s)?;
        // Its slice of the labels (none when the labels end before it).
        let labels = body.labels.as_ref().and_then(|l| {
            let len = l.len() as u64;
            let slice = &l[range.start.min(len) as usize..range.end.min(len) as usize];
            (!slice.is_empty()).then(|| slice.to_vec())
        });
        let mut shard_body = json!({"id": shard_id(&layout.dataset, range.start), "config": config, "labels": labels});
        if let Some(policy) = &body.release_policy {
            shard_body["release_policy"] = json!(policy);
        }
        let target = targets
            .get(s)
            .map_or(node.config.advertise.clone(), Clone::clone);
        let (me, own) = (node.config.node_id.clone(), node.config.advertise.clone());
        let auth = authorization.clone();
        tasks.push(tokio::spawn(async move {
            let bytes = shard_body.to_string().into_bytes();
            let send = |base: String, bytes: Vec<u8>| {
                let (me, auth) = (me.clone(), auth.clone());
                async move {
                    call(
                        &base,
                        &me,
                        Method::POST,
                        "/v1/datasets",
                        auth.as_ref(),
                        Some(("application/json", bytes)),
                    )
                    .await
                }
            };
            match send(target.clone(), bytes.clone()).await {
                // Never connected: nothing was sent; create it here instead.
                Err(e) if e.is_connect() && target != own => send(own, bytes).await,
                other => other,
            }
        }));
    }
    for (s, task) in tasks.into_iter().enumerate() {
        let answer = task.await.map_err(|_| {
            Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "a shard creation failed")
        })?;
        match answer {
            // 409: it exists already (a retried creation).
            Ok(a) if a.ok() || a.status == StatusCode::CONFLICT => {}
            Ok(a) => return Ok(a.into_response()),
            Err(_) => {
                return Err(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    format!(
                        "shard {} of {:?} may or may not have been created: retry the same \
                         creation, which completes what is missing",
                        s, layout.dataset
                    ),
                ))
            }
        }
    }
    let credential = authorization.map(|a| Credential(a.as_bytes().to_vec()));
    let view = state.engine.coordinate(layout, credential)?.view().await?;
    Ok((StatusCode::CREATED, axum::Json(view)).into_response())
}

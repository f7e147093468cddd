//! `PUT /v1/datasets/{d}/labels` of a sharded dataset (
//! `engine::cluster::shard_labels` has the rule, `docs/sharding.md` "Labels
//! after creation and shuffled sampling" the argument): the cross-shard change
//! protocol of `shard_release.rs` (prepare on every shard, one PostgreSQL
//! transaction with one record per shard fenced by its epoch, decide), where
//! each shard's record carries its examples' part of the assignment and the
//! dataset's label names after it.

use super::auth::{Access, Claims};
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::release_routes::LabelsView;
use super::shard_release::{
    apart, change_id, commit_each, decide_all, engine_problem, prepare_all, problem, serve_with,
    stored_answer,
};
use super::shard_routes::Shards;
use super::state::AppState;
use crate::engine::cluster::shard_labels::{dataset_label_names, split_labels};
use crate::engine::cluster::shard_release::{ShardChange, ShardRecordKind};
use crate::engine::cluster::{ClusterNode, ShardLayout};
use crate::engine::EngineError;
use crate::release::{LabelAssignment, Labels};
use axum::extract::Request;
use axum::http::StatusCode;
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
    if let Some(done) = stored_answer(&shards, &key).await? {
        return Ok(done);
    }
    let id = change_id();
    // Every shard's names (and its refusals: archived, not the owner) first,
    // as an unsharded dataset checks its state before the assignment.
    let prepared = prepare_all(&shards, &id, &ShardChange::Labels, None).await?;
    let shard_names = prepared.iter().map(|p| p.labels.as_slice());
    let refusal = match dataset_label_names(&shards.layout.label_names, shard_names) {
        None => Err(apart("the shards' label names differ".into())),
        Some(names) => match Labels::with_names(&names)
            .and_then(|l| l.check(shards.layout.examples, &assignment))
        {
            Ok(()) => Ok(names),
            Err(e) => Err(engine_problem(EngineError::from(e))),
        },
    };
    let names = match refusal {
        Ok(names) => names,
        Err(refusal) => {
            decide_all(&shards, &id).await;
            return Err(refusal);
        }
    };
    let (groups, records) = split_labels(&shards.layout.ranges, &assignment, &names);
    let payloads = records
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap_or_default())
        .collect();
    let answer = serde_json::to_value(LabelsView { groups }).unwrap_or_default();
    Ok(commit_each(
        &shards,
        &id,
        ShardRecordKind::Labels,
        payloads,
        &prepared,
        key,
        StatusCode::OK,
        answer,
    )
    .await)
}

//! Archiving a sharded dataset (`docs/sharding.md` "Archiving
//! and refreshes"): one change across its shards through the
//! protocol of releases (`shard_release.rs`): every shard prepared at one step
//! (its writes held), then one `Archived` record per shard committed in one
//! PostgreSQL transaction, each fenced by its owner's epoch. Every shard is
//! archived after the same steps: a step whose parts are in flight is applied
//! by every shard before the archive or refused by every shard after it,
//! never applied by some and refused by others.
//!
//! A dataset one of whose shards is archived already (a shard archived by
//! hand, or by an earlier version's fan-out cut short) is completed shard by
//! shard as before: a shard's archive is idempotent.

use super::auth::{Access, Claims};
use super::extract::RawBody;
use super::idempotency::IdempotencyHeader;
use super::shard_release::{
    apart, change_id, commit, decide_all, prepare_all, problem, serve_with, ROUNDS,
};
use super::shard_routes::{json_response, view, Shards};
use super::state::AppState;
use crate::engine::cluster::shard_release::{ShardChange, ShardRecordKind};
use crate::engine::cluster::{ClusterNode, ShardLayout};
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

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
        archive_across(&shards).await?;
    }
    Ok(json_response(StatusCode::OK, &view(&shards).await?))
}

/// Archive every shard of `shards`' dataset at one step, or none: `Ok` once
/// committed, else the answer to give (retryable when the shards stayed at
/// different steps or an owner moved).
async fn archive_across(shards: &Shards) -> Result<(), Response> {
    let mut at = None;
    let mut last = Vec::new();
    for round in 0..ROUNDS {
        let id = change_id();
        let prepared = prepare_all(shards, &id, &ShardChange::Archive, at).await?;
        let steps: Vec<u64> = prepared.iter().map(|p| p.step).collect();
        // Asked at step `at`, a shard at another step holds nothing (its
        // writes flow): only when every shard is at `at` does every shard
        // hold its writes for the commit, so that each applies its record.
        let all_held = at.is_none_or(|t| steps.iter().all(|&s| s == t));
        if !all_held || steps.iter().any(|&s| s != steps[0]) {
            // Steps in flight: ask again one step beyond the furthest shard,
            // so that every shard holds its writes as soon as it has applied
            // the step being reported (a trainer's next step then waits for
            // the archive, which refuses it on every shard); shards found
            // level but not held are asked again where they are.
            decide_all(shards, &id).await;
            let level = steps.iter().all(|&s| s == steps[0]);
            at = (!level).then(|| steps.iter().max().map_or(0, |m| m + 1));
            last = steps;
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round + 1))).await;
            continue;
        }
        let answer = json!({"archived": true, "step": steps[0]});
        let committed = commit(
            shards,
            &id,
            ShardRecordKind::Archived,
            Vec::new(),
            &prepared,
            None,
            StatusCode::OK,
            answer,
        )
        .await;
        return if committed.status().is_success() {
            Ok(())
        } else {
            Err(committed)
        };
    }
    Err(apart(format!(
        "the shards were at different steps ({last:?}) at every try (steps in flight): retry"
    )))
}

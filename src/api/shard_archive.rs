//! Archiving a sharded dataset (issue 26, `docs/cluster.md` "Automatic
//! sharding, archiving, refreshes"): one change across its shards through the
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

use super::shard_release::{apart, change_id, commit, decide_all, prepare_all, ROUNDS};
use super::shard_routes::Shards;
use crate::engine::cluster::shard_release::{RecordKind, ShardChange};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;
use std::time::Duration;

/// Archive every shard of `shards`' dataset at one step, or none: `Ok` once
/// committed, else the answer to give (retryable when the shards stayed at
/// different steps or an owner moved).
pub(super) async fn archive_across(shards: &Shards) -> Result<(), Response> {
    let mut at = None;
    let mut last = Vec::new();
    for round in 0..ROUNDS {
        let id = change_id();
        let prepared = prepare_all(shards, &id, &ShardChange::Archive, at).await?;
        let steps: Vec<u64> = prepared.iter().map(|p| p.step).collect();
        if steps.iter().any(|&s| s != steps[0]) {
            // A step in flight: ask again at the furthest step any shard is
            // at, which the others reach when the step's parts arrive.
            decide_all(shards, &id).await;
            at = steps.iter().max().copied();
            last = steps;
            tokio::time::sleep(Duration::from_millis(10 * u64::from(round + 1))).await;
            continue;
        }
        let answer = json!({"archived": true, "step": steps[0]});
        let committed = commit(
            shards,
            &id,
            RecordKind::Archived,
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

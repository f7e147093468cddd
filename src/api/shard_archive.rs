//! Archiving a sharded dataset (issue 26, `docs/cluster.md` "Sharded
//! datasets"): every shard is archived, in parallel, each by its owner. A
//! shard's archive is idempotent (an archived shard answers as archived), so
//! a failed or unanswered fan-out is completed by retrying the same request
//! through any node. The dataset counts as archived (read-only) as soon as
//! any shard is, since that shard then refuses its part of every step.

use super::dataset_routes::DatasetView;
use super::shard_routes::{view, Shards};
use axum::http::Method;
use axum::response::Response;

/// Archives every shard of `shards.layout`; answers the merged view, or the
/// first shard's failure (a retry completes what is missing).
pub(super) async fn archive(shards: &Shards) -> Result<DatasetView, Response> {
    let requests = (0..shards.layout.ranges.len())
        .map(|s| (s, Method::POST, "/archive".to_string(), None))
        .collect();
    shards.send_all(requests).await?;
    view(shards).await
}

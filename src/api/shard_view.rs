//! The shard map of a sharded dataset as `GET /v1/datasets/{dataset}` shows it.
//! A leaf: the dataset view embeds it, the shard routes fill it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One shard of a sharded dataset: a contiguous range of its example ids,
/// served by one node under its own lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ShardView {
    /// The shard's internal dataset (`{dataset}~{start}`); its example `i` is
    /// the dataset's example `start + i`.
    pub dataset: String,
    /// First example id of the range (inclusive).
    pub start: u64,
    /// End of the range (exclusive).
    pub end: u64,
    /// The node holding the shard's live lease (`null`: none now, it is moving).
    pub owner: Option<String>,
    /// The lease's epoch (bumped at every takeover).
    pub epoch: u64,
    /// Steps the shard has applied (equal on every shard between steps).
    pub steps: u64,
}

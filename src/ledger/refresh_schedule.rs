//! The predictable mode's public refresh schedule (spec §3.2), as a dataset's
//! configuration declares it: full passes every `E` steps and/or a
//! round-robin block of `m` ids per step, and which part of the block a shard
//! of a sharded dataset is due. The ledger's bookkeeping of what arrived is
//! `dataset/schedule.rs`.

use serde::{Deserialize, Serialize};

/// The public refresh schedule of the predictable mode (spec §3.2): which
/// examples' unclipped norms the trainer reports, computed at one model state,
/// before which steps. Fixed at creation, independent of the sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefreshSchedule {
    /// A full pass (every example) before steps `0, E, 2E, ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_every: Option<u64>,
    /// A round-robin block of `m` ids before every step `t`: ids
    /// `(t*m + j) mod n` for `j < m` (covered by a full pass when both are due).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u64>,
    /// Set by the cluster on the shards of a sharded dataset (never by a
    /// user): where this shard's ids sit in the dataset's id space. The
    /// round-robin block is defined over the dataset's ids, so each shard is
    /// due the part of the dataset's block that falls in its range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardSpan>,
}

/// A shard's ids within its dataset's: its id `i` is the dataset's
/// `start + i`, out of the dataset's `dataset_examples`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardSpan {
    /// The dataset id of the shard's id 0.
    pub start: u64,
    /// The dataset's number of examples (every shard's together).
    pub dataset_examples: u64,
}

impl RefreshSchedule {
    /// The round-robin block due before step `t` over this dataset's `n` ids:
    /// `(first, count)`, the ids `(first + j) mod n` for `j < count`; `None`
    /// without a block, or for a shard none of whose ids are in the
    /// dataset's block. A shard's part of the dataset's (cyclic) block is
    /// one cyclic range of its own ids: a block that wraps past the
    /// dataset's last id meets a shard in at most its tail and its head.
    pub fn block_before(&self, t: u64, n: u64) -> Option<(u64, u64)> {
        let m = self.block?;
        let (start, total) = self.shard.map_or((0, n), |s| (s.start, s.dataset_examples));
        if total == 0 || n == 0 {
            return None;
        }
        let first = ((t as u128 * m as u128) % total as u128) as u64;
        let count = m.min(total);
        // The dataset's block as up to two plain ranges, cut to this range.
        let end = start + n;
        let cut = |a: u64, b: u64| (a.max(start), b.min(end));
        let tail = cut(first, (first + count).min(total));
        let head = cut(0, (first + count).saturating_sub(total));
        let (tail, head) = (
            (tail.0 < tail.1).then_some(tail),
            (head.0 < head.1).then_some(head),
        );
        match (tail, head) {
            (None, None) => None,
            (Some((a, b)), None) | (None, Some((a, b))) => Some((a - start, b - a)),
            // The tail runs to the end of this range and the head starts at
            // its beginning: one range that wraps around this range's ids.
            (Some((a, b)), Some((c, d))) => Some((a - start, ((b - a) + (d - c)).min(n))),
        }
    }
}

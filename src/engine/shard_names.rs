//! The names of shards: a sharded dataset's shard whose ids start at `start`
//! is the dataset `{dataset}~{start}`. Its own module, below both cluster
//! membership (which maps a shard's lease to its dataset) and the sharding
//! subsystem, so that neither imports the other for a name.
//!
//! Shard names cannot collide with user datasets (`~` is not allowed in a
//! dataset id), and they carry their offset, so that authorisation can map a
//! shard's example to the dataset's without reading anything
//! ([`parse_shard_id`]).

use super::valid_dataset_id;

/// Separates a sharded dataset's name from a shard's first example id.
pub const SHARD_SEPARATOR: char = '~';

/// The name of the shard of `dataset` whose ids start at `start`.
pub fn shard_id(dataset: &str, start: u64) -> String {
    format!("{dataset}{SHARD_SEPARATOR}{start}")
}

/// `(dataset, start)` when `id` names a shard (`{dataset}~{start}`, the
/// dataset a valid id and `start` a canonical decimal); `None` otherwise.
pub fn parse_shard_id(id: &str) -> Option<(&str, u64)> {
    let (dataset, start) = id.split_once(SHARD_SEPARATOR)?;
    let value: u64 = start.parse().ok()?;
    (valid_dataset_id(dataset) && value.to_string() == start).then_some((dataset, value))
}

/// The dataset a request names once shards are mapped to their dataset, and
/// the offset of its example ids (`(id, 0)` for an unsharded dataset).
pub fn owning_dataset(id: &str) -> (&str, u64) {
    parse_shard_id(id).unwrap_or((id, 0))
}

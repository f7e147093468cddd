//! Sharded datasets (`docs/sharding.md` "Shards"): a
//! dataset created with `"shards": k` is `k` contiguous ranges of example ids,
//! each an ordinary dataset of the cluster (its own ledger, lease, epoch and
//! log) named `{dataset}~{start}`, whose example `i` is the dataset's example
//! `start + i`. The layout (examples, shards, the creation's specification)
//! is one row of `dpledger_shards`, written before any shard and never
//! changed, so every node can cache it for good. The shard names themselves
//! are `engine::shard_names`.

use crate::engine::cluster::ClusterNode;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::shard_names::{parse_shard_id, shard_id};
use crate::engine::Engine;
use crate::ledger::DatasetConfig;
use crate::store::cluster::{LayoutClaim, LayoutRow};
use std::ops::Range;
use std::sync::Arc;

/// Most shards of one dataset: each is a lease, a ledger and a request per
/// step, so thousands would cost more than they spread.
pub const MAX_SHARDS: u32 = 256;

/// `shards` contiguous ranges covering `0..examples`, as equal as integers
/// allow (shard `i` starts at `floor(i * examples / shards)`).
pub fn shard_ranges(examples: u64, shards: u32) -> Vec<Range<u64>> {
    let k = u128::from(shards.max(1));
    let start = |i: u128| (i * u128::from(examples) / k) as u64;
    (0..k).map(|i| start(i)..start(i + 1)).collect()
}

/// What a sharded creation asks for, beyond the configuration: checked before
/// anything is recorded.
pub fn check_shard_request(config: &DatasetConfig, shards: u32) -> EngineResult<()> {
    let bad = |detail: String| EngineError::BadRequest {
        detail,
        field: Some("shards"),
    };
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(bad(format!(
            "must be between 1 and {MAX_SHARDS}, got {shards}"
        )));
    }
    if u64::from(shards) > config.examples {
        return Err(bad(format!(
            "{shards} shards need at least as many examples, got {}",
            config.examples
        )));
    }
    check_no_shard_fields(config)
}

/// Refuses `sampling.epoch_steps` and `refresh.shard` on a dataset's creation
/// (sharded or not): only the shards of a sharded dataset carry them, set by
/// their layout ([`ShardLayout::shard_config`]).
pub fn check_no_shard_fields(config: &DatasetConfig) -> EngineResult<()> {
    if config.is_shuffled_shard() {
        return Err(EngineError::BadRequest {
            detail: "epoch_steps is set only on the shards of a sharded dataset; a dataset's \
                     epoch is ceil(examples / batch_size) steps"
                .into(),
            field: Some("sampling.epoch_steps"),
        });
    }
    if config.refresh.is_some_and(|r| r.shard.is_some()) {
        return Err(EngineError::BadRequest {
            detail: "refresh.shard is set only on the shards of a sharded dataset: leave it out"
                .into(),
            field: Some("refresh.shard"),
        });
    }
    Ok(())
}

/// Default bound on the examples of one ledger (`serve --max-shard-examples`):
/// 2·10⁷. At peak an example costs about 780 bytes (docs/ledger-memory.md: the
/// compact ledger's 139 bytes, a snapshot image's 115 held while it is
/// written, a release view's evaluated row of 64 orders × 8 bytes, and a
/// pass's 16 bytes of answers), so a shard of 2·10⁷ needs about 15.6 GB and a
/// 24 GB node keeps room for its process and a second, smaller ledger.
pub const DEFAULT_MAX_SHARD_EXAMPLES: u64 = 20_000_000;

/// How many shards a cluster creation gets: `requested` when given (each
/// shard then at most `bound` examples), else one per `bound` examples
/// (`⌈examples / bound⌉`, automatic sharding). Refused with the field to
/// change when no layout within the bound is possible.
pub fn shards_for(config: &DatasetConfig, requested: Option<u32>, bound: u64) -> EngineResult<u32> {
    let n = config.examples;
    let bound = bound.max(1);
    let needed = n.div_ceil(bound);
    match requested {
        Some(k) => {
            check_shard_request(config, k)?;
            if n.div_ceil(u64::from(k)) > bound {
                return Err(EngineError::BadRequest {
                    detail: format!(
                        "{k} shards of {n} examples hold up to {} each, more than this \
                         cluster's bound of {bound} examples per shard (--max-shard-examples): \
                         ask for at least {needed} shards, or leave shards out to get them",
                        n.div_ceil(u64::from(k))
                    ),
                    field: Some("shards"),
                });
            }
            Ok(k)
        }
        None => {
            let too_large = |why: String| EngineError::BadRequest {
                detail: format!(
                    "{n} examples are more than one ledger's bound of {bound} \
                     (--max-shard-examples) and {why}"
                ),
                field: Some("examples"),
            };
            if needed > u64::from(MAX_SHARDS) {
                return Err(too_large(format!(
                    "would need {needed} shards, more than {MAX_SHARDS}: raise the bound on \
                     nodes that have the memory (about 780 bytes per example)"
                )));
            }
            let k = needed as u32;
            check_shard_request(config, k)?;
            Ok(k)
        }
    }
}

/// A single server's creation (no cluster to shard over): refused with what
/// to do when `config.examples` is above the bound.
pub fn check_single_ledger(config: &DatasetConfig, bound: u64) -> EngineResult<()> {
    let n = config.examples;
    if n <= bound {
        return Ok(());
    }
    Err(EngineError::BadRequest {
        detail: format!(
            "{n} examples are more than one ledger's bound of {bound} on this server \
             (--max-shard-examples, DPLEDGER_MAX_SHARD_EXAMPLES; about 780 bytes per example \
             at peak): serve it from a cluster (dpledger serve --cluster), which splits it into \
             {} shards automatically, or raise the bound where this machine has the memory",
            n.div_ceil(bound.max(1))
        ),
        field: Some("examples"),
    })
}

/// A sharded dataset's layout: see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardLayout {
    /// The dataset.
    pub dataset: String,
    /// Its number of examples.
    pub examples: u64,
    /// The id range of each shard, in order.
    pub ranges: Vec<Range<u64>>,
    /// The creation's canonical specification (`{"config", "labels"}`, and
    /// `"release_policy"` when the creation set one).
    pub spec: String,
    /// The creation's label names in order of first use, parsed once from
    /// `spec` (layouts are cached for good). Labels set after the creation
    /// extend them in every shard's book (`shard_release::dataset_label_names`).
    pub label_names: Vec<String>,
}

impl ShardLayout {
    /// The layout of `dataset`: `examples` in `shards` ranges
    /// ([`shard_ranges`]), created with `spec` (the creation's canonical
    /// specification).
    pub fn new(dataset: String, examples: u64, shards: u32, spec: String) -> ShardLayout {
        ShardLayout {
            dataset,
            examples,
            ranges: shard_ranges(examples, shards),
            label_names: super::labels::label_names(&spec),
            spec,
        }
    }

    /// The layout a recorded row describes.
    fn of(row: &LayoutRow) -> ShardLayout {
        ShardLayout::new(
            row.dataset.clone(),
            row.examples,
            row.shards,
            row.spec.clone(),
        )
    }

    /// The row that records it (the store's, so that the engine alone names
    /// it: callers claim a [`ShardLayout`]).
    fn row(&self) -> LayoutRow {
        LayoutRow {
            dataset: self.dataset.clone(),
            examples: self.examples,
            shards: self.ranges.len() as u32,
            spec: self.spec.clone(),
        }
    }

    /// The shard holding example `id` (`None`: out of range).
    pub fn shard_of(&self, id: u64) -> Option<usize> {
        dpledger_api::shard_rule::shard_of(&self.ranges, id)
    }

    /// The name of shard `i`.
    pub fn shard_dataset(&self, i: usize) -> String {
        shard_id(&self.dataset, self.ranges[i].start)
    }

    /// The configuration of shard `i`: the dataset's with the shard's number
    /// of examples and, with shuffled sampling, the dataset's epoch length
    /// `ceil(n / b)` as `epoch_steps` (a shard's epochs span the dataset, so
    /// every shard accounts its steps' epochs as one unsharded ledger does);
    /// with a round-robin refresh block, the shard's place in the dataset's
    /// ids (`refresh.shard`: each shard is due its part of the dataset's block).
    pub fn shard_config(&self, i: usize) -> EngineResult<DatasetConfig> {
        let mut config = self.config()?;
        let steps = config.steps_per_epoch();
        if let crate::ledger::Sampling::Shuffle { epoch_steps, .. } = &mut config.sampling {
            *epoch_steps = steps;
        }
        let range = self
            .ranges
            .get(i)
            .ok_or_else(|| EngineError::Internal(format!("no shard {i}")))?;
        config.examples = range.end - range.start;
        if let Some(schedule) = config.refresh.as_mut().filter(|s| s.block.is_some()) {
            schedule.shard = Some(crate::ledger::ShardSpan {
                start: range.start,
                dataset_examples: self.examples,
            });
        }
        Ok(config)
    }

    /// The dataset's configuration (the shards' but for `examples`).
    pub fn config(&self) -> EngineResult<DatasetConfig> {
        let spec: serde_json::Value = serde_json::from_str(&self.spec)
            .map_err(|e| EngineError::Internal(format!("a shard layout is unreadable: {e}")))?;
        serde_json::from_value(spec["config"].clone())
            .map_err(|e| EngineError::Internal(format!("a shard layout is unreadable: {e}")))
    }

    /// The release policy the creation set (as JSON), if any.
    fn policy(&self) -> EngineResult<Option<serde_json::Value>> {
        let spec: serde_json::Value = serde_json::from_str(&self.spec)
            .map_err(|e| EngineError::Internal(format!("a shard layout is unreadable: {e}")))?;
        Ok(spec.get("release_policy").filter(|p| !p.is_null()).cloned())
    }
}

impl Engine {
    /// The layout of `dataset` when it is sharded (cached for good once read:
    /// layouts never change); `None` outside cluster mode.
    pub async fn layout_of(&self, dataset: &str) -> EngineResult<Option<Arc<ShardLayout>>> {
        if let Some(found) = self.sharding.layouts.get(dataset) {
            return Ok(Some(found.clone()));
        }
        let Some(node) = self.cluster() else {
            return Ok(None);
        };
        let row = node.db.layout(dataset).await.map_err(EngineError::store)?;
        Ok(row.map(|row| {
            let layout = Arc::new(ShardLayout::of(&row));
            self.sharding
                .layouts
                .insert(dataset.to_string(), layout.clone());
            layout
        }))
    }

    /// The layout of `dataset` if this node has read it (no database round
    /// trip: routing checks it on every request).
    pub fn known_layout(&self, dataset: &str) -> Option<Arc<ShardLayout>> {
        self.sharding.layouts.get(dataset).map(|l| l.clone())
    }
}

impl ClusterNode {
    /// Records a sharded dataset's layout before its shards are created:
    /// `false` when the name is taken (by an unsharded dataset, or by a
    /// different layout; the same layout again is a retry and succeeds).
    pub async fn claim_layout(&self, layout: &ShardLayout) -> EngineResult<bool> {
        if self.is_draining() || !self.leases_valid() {
            return Err(crate::engine::cluster::not_owner(&layout.dataset));
        }
        let row = layout.row();
        self.forget_absent(&row.dataset);
        let claim = self
            .db
            .claim_layout(&row)
            .await
            .map_err(EngineError::store)?;
        self.forget_absent(&row.dataset);
        Ok(claim == LayoutClaim::Recorded)
    }
}

impl Engine {
    /// Checks the creation of shard `id` of a sharded dataset: its layout is
    /// recorded, `id` starts one of its ranges, `config` is the layout's
    /// configuration with that range's number of examples, and `policy` the
    /// layout's release policy (every shard's book holds the same one).
    pub(crate) async fn check_shard_creation(
        &self,
        id: &str,
        config: &DatasetConfig,
        policy: Option<&crate::release::ReleasePolicy>,
    ) -> EngineResult<()> {
        let bad = |detail: String| EngineError::BadRequest {
            detail,
            field: Some("id"),
        };
        let Some((dataset, start)) = parse_shard_id(id) else {
            return Err(bad(
                "id must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)".into(),
            ));
        };
        let Some(layout) = self.layout_of(dataset).await? else {
            return Err(bad(format!("{dataset:?} is not a sharded dataset")));
        };
        let Some(s) = layout.ranges.iter().position(|r| r.start == start) else {
            return Err(bad(format!("no shard of {dataset:?} starts at {start}")));
        };
        let expected = layout.shard_config(s)?;
        if *config != expected {
            return Err(EngineError::conflict(format!(
                "shard {id:?} must have the configuration of {dataset:?} with {} examples",
                expected.examples
            )));
        }
        if layout.policy()? != policy.map(serde_json::to_value).transpose().ok().flatten() {
            return Err(EngineError::conflict(format!(
                "shard {id:?} must have the release policy of {dataset:?}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::shard_names::owning_dataset;

    #[test]
    fn ranges_cover_every_id_once_and_locate_it() {
        for (n, k) in [
            (10u64, 4u32),
            (7, 7),
            (1_000_003, 4),
            (5, 1),
            (u32::MAX as u64, 256),
        ] {
            let ranges = shard_ranges(n, k);
            assert_eq!(ranges.len(), k as usize);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, n);
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].end > w[0].start, "{n} {k}: empty shard");
            }
            let layout = ShardLayout {
                dataset: "d".into(),
                examples: n,
                ranges: ranges.clone(),
                spec: "{}".into(),
                label_names: Vec::new(),
            };
            for (i, r) in ranges.iter().enumerate() {
                assert_eq!(layout.shard_of(r.start), Some(i));
                assert_eq!(layout.shard_of(r.end - 1), Some(i));
            }
            assert_eq!(layout.shard_of(n), None);
        }
    }

    #[test]
    fn shards_follow_the_bound() {
        let config = |n: u64| DatasetConfig::poisson(n, 1.0, 1.0, 0.1, 1e-5);
        assert_eq!(shards_for(&config(60), None, 25).unwrap(), 3);
        assert_eq!(shards_for(&config(75), None, 25).unwrap(), 3);
        assert_eq!(shards_for(&config(76), None, 25).unwrap(), 4);
        assert_eq!(shards_for(&config(60), Some(4), 25).unwrap(), 4);
        let field = |r: EngineResult<u32>| match r {
            Err(EngineError::BadRequest { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(shards_for(&config(60), Some(2), 25)), Some("shards"));
        assert_eq!(
            field(shards_for(&config(25 * 256 + 1), None, 25)),
            Some("examples")
        );
        assert!(shards_for(&config(25 * 256), None, 25).is_ok());
        assert!(check_single_ledger(&config(25), 25).is_ok());
        assert!(check_single_ledger(&config(26), 25).is_err());
        // The default fits a 24 GB node at about 780 bytes per example.
        const { assert!(DEFAULT_MAX_SHARD_EXAMPLES * 780 < 16_000_000_000) };
    }

    #[test]
    fn shard_names_parse_back_and_nothing_else_does() {
        assert_eq!(
            parse_shard_id(&shard_id("run.1", 250)),
            Some(("run.1", 250))
        );
        assert_eq!(owning_dataset("d~7"), ("d", 7));
        assert_eq!(owning_dataset("d"), ("d", 0));
        for bad in ["d", "d~", "d~07", "d~-1", "d~1~2", "~3", "d~x", "../x~1"] {
            assert_eq!(parse_shard_id(bad), None, "{bad}");
        }
    }
}

//! A sharded dataset's requests split by id range into its shards' requests,
//! and the shards' answers merged back. Pure functions: the scatter sends the
//! parts; nothing here talks to anyone.
//!
//! A step (or refresh) is cut by the split shared with the Rust client
//! ([`dpledger_api::split_step`], which splits before sending), so that both
//! cut a report into identical parts and merge the answers identically; this
//! module adds the server's checks and errors, and the splits of id ranges
//! and statuses that only the server makes.

use super::layout::ShardLayout;
use crate::engine::error::{EngineError, EngineResult};
use crate::ledger::{check_norms, LedgerStatus, StepReport};
use std::ops::Range;

pub use dpledger_api::split_step::SplitStep;

fn bad(field: &'static str, detail: String) -> EngineError {
    EngineError::BadRequest {
        detail,
        field: Some(field),
    }
}

/// Splits `report` by the layout's ranges; refuses what cannot be split (ids
/// and norms of different lengths, an id outside the dataset) and what every
/// shard would refuse for its own part (a norm that is not finite or is
/// negative, an id twice), before any shard sees the step: otherwise one
/// shard's refusal could follow the others' acceptance, and the step would be
/// applied in part. What depends on a shard's state is its ledger's to judge.
pub fn split_step(layout: &ShardLayout, report: &StepReport) -> EngineResult<SplitStep> {
    check_norms(&report.norms).map_err(|e| bad("norms", e.reason))?;
    dpledger_api::split_step::split_step(&layout.ranges, report)
        .map_err(|e| bad(e.field(), e.to_string()))
}

/// The parts of ids `start..end` of the dataset held by each shard that has
/// any: `(shard, its own ids)`.
pub fn split_range(layout: &ShardLayout, range: Range<u64>) -> Vec<(usize, Range<u64>)> {
    layout
        .ranges
        .iter()
        .enumerate()
        .filter_map(|(s, r)| {
            let (lo, hi) = (range.start.max(r.start), range.end.min(r.end));
            (lo < hi).then(|| (s, lo - r.start..hi - r.start))
        })
        .collect()
}

/// The dataset's ledger summary from its shards' (in shard order): counts
/// and memory summed; `steps` the fewest any shard applied (a step counts
/// once every shard has it); a pending part-step if any shard has one.
pub fn merge_status(shards: &[LedgerStatus]) -> Option<LedgerStatus> {
    let first = shards.first()?.clone();
    Some(LedgerStatus {
        examples: shards.iter().map(|s| s.examples).sum(),
        steps: shards.iter().map(|s| s.steps).min().unwrap_or(0),
        pending: shards.iter().find_map(|s| s.pending.clone()),
        guarantee: shards.iter().all(|s| s.guarantee),
        retired: shards.iter().map(|s| s.retired).sum(),
        over_budget: shards.iter().map(|s| s.over_budget).sum(),
        releases: shards.iter().map(|s| s.releases).min().unwrap_or(0),
        segments: shards.iter().map(|s| s.segments).max().unwrap_or(0),
        memory_bytes: shards.iter().map(|s| s.memory_bytes).sum(),
        ..first
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sharding::shard_ranges;
    use crate::ledger::StepOutcome;

    fn layout(n: u64, k: u32) -> ShardLayout {
        ShardLayout {
            dataset: "d".into(),
            examples: n,
            ranges: shard_ranges(n, k),
            spec: "{}".into(),
            label_names: Vec::new(),
        }
    }

    #[test]
    fn what_cannot_be_split_is_refused() {
        let l = layout(10, 2);
        assert!(split_step(&l, &StepReport::new(0, vec![10], vec![1.0])).is_err());
        assert!(split_step(&l, &StepReport::new(0, vec![1], vec![])).is_err());
        // What every shard would refuse is refused before any shard sees it, so
        // no shard applies a step another refuses (ids in different shards).
        for (ids, norms, field) in [
            (vec![1, 9], vec![0.5, -1.0], "norms"),
            (vec![1, 9], vec![f64::NAN, 0.5], "norms"),
            (vec![1, 9], vec![0.5, f64::INFINITY], "norms"),
            (vec![9, 1, 9], vec![0.5, 0.5, 0.5], "ids"),
        ] {
            match split_step(&l, &StepReport::new(0, ids.clone(), norms)) {
                Err(EngineError::BadRequest { field: Some(f), .. }) => {
                    assert_eq!(f, field, "{ids:?}")
                }
                other => panic!("{ids:?}: {other:?}"),
            }
        }
        let split = split_step(&l, &StepReport::new(0, vec![1], vec![1.0])).unwrap();
        let wrong = StepOutcome {
            step: 0,
            duplicate: false,
            part: None,
            complete: true,
            thresholds: vec![],
            retired: vec![],
            refresh_due: None,
        };
        let refused = split.merge(&l.ranges, &[wrong.clone(), wrong]).unwrap_err();
        assert!(matches!(
            EngineError::from(refused),
            EngineError::Internal(_)
        ));
    }

    #[test]
    fn ranges_split_across_shards() {
        let l = layout(10, 3);
        assert_eq!(split_range(&l, 2..8), vec![(0, 2..3), (1, 0..3), (2, 0..2)]);
        assert_eq!(split_range(&l, 4..5), vec![(1, 1..2)]);
        assert!(split_range(&l, 5..5).is_empty());
    }
}

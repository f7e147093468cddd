//! A sharded dataset's requests split by id range into its shards' requests,
//! and the shards' answers merged back. Pure functions: the HTTP
//! layer sends the parts; nothing here talks to anyone.
//!
//! A step of the dataset is the same step of every shard: shard `s` gets the
//! ids of its range (as its own ids, `id - start`, in the report's order)
//! with their norms, the step's number, hyperparameters and part, and an
//! empty batch when none of the ids is its own. Splitting is deterministic,
//! so a retried report splits into identical parts, which the shards' ledgers
//! recognise as retries (exactly once per part).

use super::layout::ShardLayout;
use crate::engine::error::{EngineError, EngineResult};
use crate::ledger::{
    check_norms, LedgerStatus, RefreshDue, RefreshOutcome, StepOutcome, StepReport,
};
use std::ops::Range;

// The split rule itself, shared with the Rust client (which splits before
// sending): one crate, so both cut a report into identical parts.
use dpledger_api::shard_rule as rule;

/// A step report split into one report per shard.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitStep {
    /// Shard `s`'s report (possibly with an empty batch).
    pub parts: Vec<StepReport>,
    /// For each shard, the positions in the original report of its ids.
    positions: Vec<Vec<usize>>,
    /// The original report's part.
    part: Option<crate::ledger::Part>,
}

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
    let split = rule::split_ids(&layout.ranges, &report.ids, &report.norms)
        .map_err(|e| bad(e.field(), e.to_string()))?;
    let parts = split
        .ids
        .into_iter()
        .zip(split.norms)
        .map(|(ids, norms)| StepReport {
            ids,
            norms,
            ..report_header(report)
        })
        .collect();
    Ok(SplitStep {
        parts,
        positions: split.positions,
        part: report.part,
    })
}

/// The header of a step report (everything but its batch).
fn report_header(report: &StepReport) -> StepReport {
    StepReport {
        step: report.step,
        ids: Vec::new(),
        norms: Vec::new(),
        noise_multiplier: report.noise_multiplier,
        sampling_rate: report.sampling_rate,
        part: report.part,
    }
}

impl SplitStep {
    /// The dataset's answer from its shards' answers (in shard order): each
    /// id's threshold from its shard, in the report's order; the retirements
    /// of every shard as the dataset's ids (sorted, as the ranges are);
    /// complete when every shard applied the step; a duplicate only when
    /// every shard's part was one (nothing changed anywhere).
    pub fn merge(
        &self,
        layout: &ShardLayout,
        answers: &[StepOutcome],
    ) -> EngineResult<StepOutcome> {
        if answers.len() != self.parts.len() {
            return Err(EngineError::Internal(format!(
                "{} shard answers for {} shards",
                answers.len(),
                self.parts.len()
            )));
        }
        if let Some(s) = (0..answers.len()).find(|&s| answers[s].step != self.parts[s].step) {
            return Err(EngineError::Internal(format!(
                "shard {s} answered step {} to a part of step {}",
                answers[s].step, self.parts[s].step
            )));
        }
        let per_shard: Vec<&[f64]> = answers.iter().map(|a| &a.thresholds[..]).collect();
        let thresholds = rule::place(&self.positions, &per_shard).ok_or_else(|| {
            EngineError::Internal("a shard answered a threshold per id of another part".into())
        })?;
        let own: Vec<&[u64]> = answers.iter().map(|a| &a.retired[..]).collect();
        let retired = rule::dataset_ids(&layout.ranges, &own);
        Ok(StepOutcome {
            step: self.parts.first().map_or(0, |p| p.step),
            duplicate: answers.iter().all(|a| a.duplicate),
            part: self.part,
            complete: answers.iter().all(|a| a.complete),
            thresholds,
            retired,
            refresh_due: RefreshDue::merge(
                &layout.ranges,
                answers.iter().map(|a| a.refresh_due.as_ref()).enumerate(),
            ),
        })
    }
}

impl SplitStep {
    /// A shard's refusal `detail` of its part, with the shard's own ids and
    /// positions put back as the dataset's and the report's
    /// ([`rule::dataset_detail`]).
    pub fn dataset_detail(&self, layout: &ShardLayout, s: usize, detail: &str) -> String {
        let start = layout.ranges.get(s).map_or(0, |r| r.start);
        let positions = self.positions.get(s).map_or(&[][..], |p| &p[..]);
        rule::dataset_detail(start, positions, detail)
    }

    /// The dataset's answer to a refresh split like a step (every shard gets
    /// its part, an empty one included, so that every shard's log has the
    /// same checkpoints, as it has the same steps) from its shards' answers
    /// (in shard order), merged by the split rule as a step's are: each id's
    /// new threshold from its shard, in the request's order; every retirement
    /// as the dataset's id; the step it takes effect at, the earliest any shard
    /// said (equal between steps).
    pub fn merge_refresh(
        &self,
        layout: &ShardLayout,
        answers: &[RefreshOutcome],
    ) -> EngineResult<RefreshOutcome> {
        let per_shard: Vec<&[f64]> = answers.iter().map(|a| &a.thresholds[..]).collect();
        let thresholds = rule::place(&self.positions, &per_shard).ok_or_else(|| {
            EngineError::Internal(format!(
                "{} refresh answers for {} shards, or a threshold per id of another part",
                answers.len(),
                self.positions.len()
            ))
        })?;
        let own: Vec<&[u64]> = answers.iter().map(|a| &a.retired[..]).collect();
        let mut retired = rule::dataset_ids(&layout.ranges, &own);
        retired.sort_unstable();
        let effective_step = answers.iter().map(|a| a.effective_step).min().unwrap_or(0);
        Ok(RefreshOutcome {
            effective_step,
            thresholds,
            retired,
            refresh_due: RefreshDue::merge(
                &layout.ranges,
                answers.iter().map(|a| a.refresh_due.as_ref()).enumerate(),
            ),
        })
    }
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
    fn a_shards_refusal_names_the_datasets_ids_and_positions() {
        let layout = layout(10, 2); // 0..5, 5..10
        let report = StepReport::new(3, vec![7, 1, 9, 5], vec![1.0; 4]);
        let split = split_step(&layout, &report).unwrap();
        assert_eq!(
            split.dataset_detail(&layout, 1, "id 4 (ids[1]) is pending"),
            "id 9 (ids[2]) is pending"
        );
    }

    #[test]
    fn a_step_splits_into_every_shard_in_order_and_merges_back() {
        let l = layout(10, 3); // 0..3, 3..6, 6..10
        let report = StepReport {
            sampling_rate: Some(0.25),
            ..StepReport::new(4, vec![9, 0, 4, 7], vec![0.5, 1.0, 2.0, 3.0])
        };
        let split = split_step(&l, &report).unwrap();
        assert_eq!(split.parts.len(), 3);
        assert_eq!(split.parts[0].ids, vec![0]);
        assert_eq!(split.parts[1].ids, vec![1]);
        assert_eq!(split.parts[2].ids, vec![3, 1]);
        assert_eq!(split.parts[2].norms, vec![0.5, 3.0]);
        assert!(split
            .parts
            .iter()
            .all(|p| p.step == 4 && p.sampling_rate == Some(0.25)));
        // Deterministic: a retry splits into the same parts (same content hash).
        assert_eq!(split_step(&l, &report).unwrap(), split);
        let answer = |th: Vec<f64>, retired: Vec<u64>, duplicate| StepOutcome {
            step: 4,
            duplicate,
            part: None,
            complete: true,
            thresholds: th,
            retired,
            refresh_due: None,
        };
        let merged = split
            .merge(
                &l,
                &[
                    answer(vec![1.0], vec![], true),
                    answer(vec![2.0], vec![1], false),
                    answer(vec![9.0, 7.0], vec![0, 3], true),
                ],
            )
            .unwrap();
        assert_eq!(merged.thresholds, vec![9.0, 1.0, 2.0, 7.0]);
        assert_eq!(merged.retired, vec![4, 6, 9]);
        assert!(!merged.duplicate && merged.complete);
        // An empty batch is an empty part for every shard.
        let empty = split_step(&l, &StepReport::new(5, vec![], vec![])).unwrap();
        assert!(empty.parts.iter().all(|p| p.ids.is_empty() && p.step == 5));
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
        assert!(split.merge(&l, &[wrong.clone(), wrong]).is_err());
    }

    #[test]
    fn ranges_split_across_shards() {
        let l = layout(10, 3);
        assert_eq!(split_range(&l, 2..8), vec![(0, 2..3), (1, 0..3), (2, 0..2)]);
        assert_eq!(split_range(&l, 4..5), vec![(1, 1..2)]);
        assert!(split_range(&l, 5..5).is_empty());
    }
}

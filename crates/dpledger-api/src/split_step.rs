//! A sharded dataset's step report cut into its shards' reports by the
//! [`shard_rule`](crate::shard_rule), and the shards' answers merged back into
//! the answer one ledger would have given: written once for the server's
//! node-side split and the Rust client's split before sending, so that both
//! send identical parts and merge identically.
//!
//! Shard `s` gets the ids of its range (as its own ids, in the report's
//! order) with their norms, the step's number, hyperparameters and part, and
//! an empty batch when none of the ids is its own. Splitting is
//! deterministic, so a retried report splits into identical parts, which the
//! shards' ledgers recognise as retries (exactly once per part). Norms are
//! the caller's to check first (the server's ledger rule, or the client's
//! copy of it): a norm every shard would refuse must be refused before any
//! shard sees the step.

use crate::shard_rule::{self as rule, SplitRefusal};
use crate::step::{RefreshDue, RefreshOutcome, StepOutcome, StepReport};
use std::fmt;
use std::ops::Range;

/// A step report split into one report per shard, and where each id came
/// from.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitStep {
    /// Shard `s`'s report (possibly with an empty batch).
    pub parts: Vec<StepReport>,
    /// For each shard, the positions in the original report of its ids.
    positions: Vec<Vec<usize>>,
}

/// Shards' answers that do not fit the parts they answer: a shard answered
/// another step, or a threshold count other than its ids', or the count of
/// answers is not the count of shards. Never the caller's fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MismatchedAnswers(String);

impl fmt::Display for MismatchedAnswers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MismatchedAnswers {}

/// Splits `report` by the shards' id `ranges` (in id order); refuses ids and
/// norms of different lengths, an id twice and an id outside the dataset.
pub fn split_step(ranges: &[Range<u64>], report: &StepReport) -> Result<SplitStep, SplitRefusal> {
    let split = rule::split_ids(ranges, &report.ids, &report.norms)?;
    let parts = split
        .ids
        .into_iter()
        .zip(split.norms)
        .map(|(ids, norms)| StepReport {
            step: report.step,
            ids,
            norms,
            noise_multiplier: report.noise_multiplier,
            sampling_rate: report.sampling_rate,
            part: report.part,
        })
        .collect();
    Ok(SplitStep {
        parts,
        positions: split.positions,
    })
}

impl SplitStep {
    /// The dataset's answer from its shards' answers (in shard order): each
    /// id's threshold from its shard, in the report's order; the retirements
    /// of every shard as the dataset's ids (sorted, as the ranges are);
    /// complete when every shard applied the step; a duplicate only when
    /// every shard's part was one (nothing changed anywhere).
    pub fn merge(
        &self,
        ranges: &[Range<u64>],
        answers: &[StepOutcome],
    ) -> Result<StepOutcome, MismatchedAnswers> {
        if answers.len() != self.parts.len() {
            return Err(MismatchedAnswers(format!(
                "{} shard answers for {} shards",
                answers.len(),
                self.parts.len()
            )));
        }
        if let Some(s) = (0..answers.len()).find(|&s| answers[s].step != self.parts[s].step) {
            return Err(MismatchedAnswers(format!(
                "shard {s} answered step {} to a part of step {}",
                answers[s].step, self.parts[s].step
            )));
        }
        let per_shard: Vec<&[f64]> = answers.iter().map(|a| &a.thresholds[..]).collect();
        let thresholds = rule::place(&self.positions, &per_shard).ok_or_else(|| {
            MismatchedAnswers("a shard answered a threshold per id of another part".into())
        })?;
        let own: Vec<&[u64]> = answers.iter().map(|a| &a.retired[..]).collect();
        Ok(StepOutcome {
            step: self.parts.first().map_or(0, |p| p.step),
            duplicate: answers.iter().all(|a| a.duplicate),
            part: self.parts.first().and_then(|p| p.part),
            complete: answers.iter().all(|a| a.complete),
            thresholds,
            retired: rule::dataset_ids(ranges, &own),
            refresh_due: RefreshDue::merge(
                ranges,
                answers.iter().map(|a| a.refresh_due.as_ref()).enumerate(),
            ),
        })
    }

    /// The dataset's answer to a refresh split like a step (every shard gets
    /// its part, an empty one included, so that every shard's log has the
    /// same checkpoints, as it has the same steps) from its shards' answers
    /// (in shard order): each id's new threshold from its shard, in the
    /// request's order; every retirement as the dataset's id; the step it
    /// takes effect at, the earliest any shard said (equal between steps).
    pub fn merge_refresh(
        &self,
        ranges: &[Range<u64>],
        answers: &[RefreshOutcome],
    ) -> Result<RefreshOutcome, MismatchedAnswers> {
        let per_shard: Vec<&[f64]> = answers.iter().map(|a| &a.thresholds[..]).collect();
        let thresholds = rule::place(&self.positions, &per_shard).ok_or_else(|| {
            MismatchedAnswers(format!(
                "{} refresh answers for {} shards, or a threshold per id of another part",
                answers.len(),
                self.positions.len()
            ))
        })?;
        let own: Vec<&[u64]> = answers.iter().map(|a| &a.retired[..]).collect();
        let mut retired = rule::dataset_ids(ranges, &own);
        retired.sort_unstable();
        Ok(RefreshOutcome {
            effective_step: answers.iter().map(|a| a.effective_step).min().unwrap_or(0),
            thresholds,
            retired,
            refresh_due: RefreshDue::merge(
                ranges,
                answers.iter().map(|a| a.refresh_due.as_ref()).enumerate(),
            ),
        })
    }

    /// Shard `s`'s refusal `detail` of its part, with the shard's own ids
    /// and positions put back as the dataset's and the report's
    /// ([`rule::dataset_detail`]).
    pub fn dataset_detail(&self, ranges: &[Range<u64>], s: usize, detail: &str) -> String {
        let start = ranges.get(s).map_or(0, |r| r.start);
        let positions = self.positions.get(s).map_or(&[][..], |p| &p[..]);
        rule::dataset_detail(start, positions, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0..3, 3..6, 6..10.
    fn ranges() -> Vec<Range<u64>> {
        vec![0..3, 3..6, 6..10]
    }

    fn answer(thresholds: Vec<f64>, retired: Vec<u64>, duplicate: bool) -> StepOutcome {
        StepOutcome {
            step: 4,
            duplicate,
            part: None,
            complete: true,
            thresholds,
            retired,
            refresh_due: None,
        }
    }

    #[test]
    fn a_step_splits_into_every_shard_in_order_and_merges_back() {
        let report = StepReport {
            sampling_rate: Some(0.25),
            ..StepReport::new(4, vec![9, 0, 4, 7], vec![0.5, 1.0, 2.0, 3.0])
        };
        let split = split_step(&ranges(), &report).unwrap();
        assert_eq!(split.parts.len(), 3);
        assert_eq!(split.parts[0].ids, vec![0]);
        assert_eq!(split.parts[1].ids, vec![1]);
        assert_eq!(split.parts[2].ids, vec![3, 1]);
        assert_eq!(split.parts[2].norms, vec![0.5, 3.0]);
        assert!(split
            .parts
            .iter()
            .all(|p| p.step == 4 && p.sampling_rate == Some(0.25)));
        // Deterministic: a retry splits into the same parts.
        assert_eq!(split_step(&ranges(), &report).unwrap(), split);
        let merged = split
            .merge(
                &ranges(),
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
        let empty = split_step(&ranges(), &StepReport::new(5, vec![], vec![])).unwrap();
        assert!(empty.parts.iter().all(|p| p.ids.is_empty() && p.step == 5));
    }

    #[test]
    fn answers_that_do_not_fit_their_parts_are_refused() {
        let split = split_step(&ranges(), &StepReport::new(4, vec![1], vec![1.0])).unwrap();
        let none = || answer(vec![], vec![], false);
        // Too few answers; a threshold for an id the shard was not sent.
        assert!(split.merge(&ranges(), &[none(), none()]).is_err());
        let extra = answer(vec![1.0, 2.0], vec![], false);
        assert!(split.merge(&ranges(), &[extra, none(), none()]).is_err());
        // An answer of another step.
        let other = StepOutcome {
            step: 5,
            ..answer(vec![1.0], vec![], false)
        };
        assert!(split.merge(&ranges(), &[other, none(), none()]).is_err());
        let fits = answer(vec![1.0], vec![], false);
        assert!(split.merge(&ranges(), &[fits, none(), none()]).is_ok());
    }

    #[test]
    fn a_refresh_merges_back_with_the_earliest_step() {
        let split = split_step(&ranges(), &StepReport::new(0, vec![7, 2], vec![1.0, 1.0])).unwrap();
        let refreshed = |step, thresholds, retired| RefreshOutcome {
            effective_step: step,
            thresholds,
            retired,
            refresh_due: None,
        };
        let merged = split
            .merge_refresh(
                &ranges(),
                &[
                    refreshed(3, vec![0.5], vec![2]),
                    refreshed(3, vec![], vec![]),
                    refreshed(2, vec![0.25], vec![1]),
                ],
            )
            .unwrap();
        assert_eq!(merged.thresholds, vec![0.25, 0.5]);
        assert_eq!(merged.retired, vec![2, 7]);
        assert_eq!(merged.effective_step, 2);
    }

    #[test]
    fn a_shards_refusal_names_the_datasets_ids_and_positions() {
        let report = StepReport::new(3, vec![7, 1, 9, 5], vec![1.0; 4]);
        let split = split_step(&[0..5, 5..10], &report).unwrap();
        assert_eq!(
            split.dataset_detail(&[0..5, 5..10], 1, "id 4 (ids[1]) is pending"),
            "id 9 (ids[2]) is pending"
        );
    }
}

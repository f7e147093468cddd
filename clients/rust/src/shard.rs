//! Client-side splitting of a sharded dataset's steps (the server's
//! `docs/sharding.md`, "Client-side splitting").
//!
//! In a cluster a dataset created with `"shards": k` is `k` contiguous id
//! ranges, each an ordinary dataset `{d}~{start}` with its own owner. Any node
//! accepts a whole step report for `d` and splits it, but that costs a hop per
//! step. So the client splits: it reads the layout once (immutable: the shard
//! map of `GET /v1/datasets/{d}`), cuts each report by range with the
//! server's own rule ([`crate::shard_rule`]: same parts, same step number, same
//! `part`, the shard's own ids, an empty part for a shard with none), sends the
//! parts in parallel, each to its shard's owner by the cluster map (as any
//! dataset's request, with the same retries and `not-owner` handling), and
//! merges the answers into the unsharded answer's shape.
//!
//! Exactly once per part: each part is a step report of its shard, retried
//! with the same bytes, and the shard's ledger answers a retry of an applied
//! part as a duplicate with its original answer, whichever path (this client,
//! or a node's split of a whole report) delivered it first.
//!
//! Whether a dataset is sharded: any dataset view the client reads (a
//! training session reads one when it opens) says so and is remembered;
//! otherwise the cluster map, read anyway for routing, lists a sharded
//! dataset's shards (`{d}~{start}`), and only then is the view read, once. A
//! dataset the map does not list (created after the map was read) is reported
//! whole, and a node splits it if need be: one hop more, same answer.

use crate::error::{Error, Problem, Result};
use crate::types::{DatasetView, StepOutcome, StepReport};
use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::Poll;

/// The problem type of a step applied by some shards and refused by another.
pub const PARTIALLY_APPLIED: &str = "urn:dpledger:problem:partially-applied";

/// A sharded dataset's layout: its shards' names and ranges, in id order.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardLayout {
    /// `{dataset}~{start}` of each shard.
    pub names: Vec<String>,
    /// The id range of each shard.
    pub ranges: Vec<Range<u64>>,
}

impl ShardLayout {
    /// The layout of a dataset view; `None` for an unsharded dataset.
    pub fn of(view: &DatasetView) -> Option<ShardLayout> {
        let shards = view.shards.as_ref().filter(|s| !s.is_empty())?;
        Some(ShardLayout {
            names: shards.iter().map(|s| s.dataset.clone()).collect(),
            ranges: shards.iter().map(|s| s.start..s.end).collect(),
        })
    }
}

/// A report split into one report per shard (`parts`), with where each id
/// came from: the server's own split ([`dpledger_api::split_step`]).
pub use dpledger_api::split_step::SplitStep as SplitReport;

/// Splits `report` by `layout`; refuses (before anything is sent, so that no
/// shard applies a step another refuses) ids and norms of different lengths,
/// a norm that is not finite or negative (the ledger's rule), an id twice and
/// an id outside the dataset.
pub fn split(layout: &ShardLayout, report: &StepReport) -> Result<SplitReport> {
    dpledger_api::step::check_norms(&report.norms)
        .map_err(|e| Error::InvalidRequest(format!("step {}: {}", report.step, e.reason)))?;
    dpledger_api::split_step::split_step(&layout.ranges, report)
        .map_err(|e| Error::InvalidRequest(format!("step {}: {}: {e}", report.step, e.field())))
}

/// The answer for the whole report from each part's result: the merged
/// outcome; else the first failure that may be retried as a whole (a
/// transport error or a 5xx: the parts that were applied answer a retry as
/// duplicates); else, when some part was applied and another refused, a
/// `409` of type [`PARTIALLY_APPLIED`] naming them; else the first refusal.
pub(crate) fn combine(
    layout: &ShardLayout,
    split: &SplitReport,
    results: Vec<Result<StepOutcome>>,
) -> Result<StepOutcome> {
    if results.iter().all(|r| r.is_ok()) {
        // Merged as a node merges them; answers that do not fit the parts
        // are a malformed answer.
        let answers: Vec<StepOutcome> = results.into_iter().flatten().collect();
        return split
            .merge(&layout.ranges, &answers)
            .map_err(|e| Error::Decode {
                endpoint: "POST /v1/datasets/{shard}/steps".into(),
                status: 200,
                message: format!("the shards' answers do not match the parts of the step: {e}"),
            });
    }
    let retryable = |r: &Result<StepOutcome>| match r {
        Ok(_) => false,
        Err(Error::Api { problem, .. }) => problem.status >= 500,
        Err(_) => true,
    };
    let applied: Vec<&str> = results
        .iter()
        .zip(&layout.names)
        .filter(|(r, _)| r.is_ok())
        .map(|(_, n)| n.as_str())
        .collect();
    let first = results
        .iter()
        .position(retryable)
        .or_else(|| results.iter().position(|r| r.is_err()))
        .expect("a failed part");
    let refused = &layout.names[first];
    let error = results
        .into_iter()
        .nth(first)
        .and_then(|r| r.err())
        .expect("a failed part");
    match error {
        Error::Api { problem, attempts } if problem.status < 500 && !applied.is_empty() => {
            Err(Error::Api {
                problem: Problem {
                    kind: PARTIALLY_APPLIED.into(),
                    title: "Conflict".into(),
                    status: 409,
                    detail: format!(
                        "the step was applied in part: shard {refused:?} (the dataset's ids \
                         {} to {}) refused its part ({}: {}; ids and positions as the \
                         dataset's and the report's) while {} applied theirs; a retry of the \
                         same report is answered as a duplicate by those",
                        layout.ranges[first].start,
                        layout.ranges[first].end.saturating_sub(1),
                        problem.status,
                        split.dataset_detail(&layout.ranges, first, &problem.detail),
                        applied.join(", ")
                    ),
                    field: problem.field,
                    budget: None,
                    owner: None,
                },
                attempts,
            })
        }
        other => Err(other),
    }
}

/// Layouts read so far: dataset id -> `Some(layout)` (sharded) or `None`
/// (unsharded). Layouts never change, so an entry is kept for good; shared by
/// the clones of a client.
#[derive(Debug, Default)]
pub(crate) struct Layouts {
    known: RwLock<HashMap<String, Option<Arc<ShardLayout>>>>,
}

impl Layouts {
    /// What is known of `dataset` (`None`: not read yet).
    pub(crate) fn get(&self, dataset: &str) -> Option<Option<Arc<ShardLayout>>> {
        self.known.read().ok()?.get(dataset).cloned()
    }

    /// Remember `dataset`'s layout (`None`: unsharded).
    pub(crate) fn set(
        &self,
        dataset: &str,
        layout: Option<ShardLayout>,
    ) -> Option<Arc<ShardLayout>> {
        let layout = layout.map(Arc::new);
        if let Ok(mut known) = self.known.write() {
            known.insert(dataset.to_string(), layout.clone());
        }
        layout
    }
}

/// Runs `futures` concurrently on the calling task; their outputs in order.
/// (The parts' requests are I/O: one task polling them all sends them in
/// parallel, without spawning and without a dependency for `join_all`.)
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ShardLayout {
        ShardLayout {
            names: vec!["d~0".into(), "d~3".into(), "d~6".into()],
            ranges: vec![0..3, 3..6, 6..10],
        }
    }

    fn outcome(thresholds: Vec<f64>, retired: Vec<u64>, duplicate: bool) -> StepOutcome {
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

    /// The client cuts a report exactly as a node does (the same parts, so
    /// a part sent by either is one content to its shard), and an answer that
    /// does not fit its part is a malformed answer, not a result.
    #[test]
    fn a_report_splits_as_a_node_splits_it() {
        let l = layout();
        let report = StepReport::new(4, vec![9, 0, 4, 7], vec![0.5, 1.0, 2.0, 3.0]);
        let s = split(&l, &report).unwrap();
        let node = dpledger_api::split_step::split_step(&l.ranges, &report).unwrap();
        assert_eq!(s, node);
        assert_eq!(s.parts[2].ids, vec![3, 1]);
        let wrong = StepOutcome {
            step: 3,
            ..outcome(vec![1.0], vec![], false)
        };
        let answers = vec![Ok(wrong.clone()), Ok(wrong.clone()), Ok(wrong)];
        assert!(matches!(
            combine(&l, &s, answers),
            Err(Error::Decode { .. })
        ));
    }

    #[test]
    fn what_a_shard_would_refuse_is_refused_before_sending() {
        let l = layout();
        for (ids, norms) in [
            (vec![1, 9], vec![0.5, -1.0]),
            (vec![1, 9], vec![f64::NAN, 0.5]),
            (vec![1, 10], vec![0.5, 0.5]),
            (vec![1, 1], vec![0.5, 0.5]),
            (vec![1], vec![]),
        ] {
            assert!(matches!(
                split(&l, &StepReport::new(0, ids, norms)),
                Err(Error::InvalidRequest(_))
            ));
        }
    }

    #[test]
    fn a_refusal_after_another_part_applied_is_partially_applied() {
        let l = layout();
        let report = StepReport::new(4, vec![1, 4], vec![0.5, 0.5]);
        let s = split(&l, &report).unwrap();
        let refusal = |status| {
            Err(Error::Api {
                problem: Problem {
                    kind: "urn:dpledger:problem:conflict".into(),
                    title: "x".into(),
                    status,
                    detail: "id 1 (ids[0]) is pending".into(),
                    field: None,
                    budget: None,
                    owner: None,
                },
                attempts: 1,
            })
        };
        let ok = || Ok(outcome(vec![1.0], vec![], false));
        let e = combine(&l, &s, vec![ok(), refusal(409), ok()]).unwrap_err();
        assert_eq!(e.problem().unwrap().kind, PARTIALLY_APPLIED);
        // The shard's own id 1 and position 0 as the dataset's id 4 at position 1.
        let detail = &e.problem().unwrap().detail;
        assert!(
            detail.contains("\"d~3\" (the dataset's ids 3 to 5)"),
            "{detail}"
        );
        assert!(detail.contains("id 4 (ids[1]) is pending"), "{detail}");
        // A retryable failure comes first: a retry of the whole completes it.
        let e = combine(&l, &s, vec![ok(), refusal(409), refusal(503)]).unwrap_err();
        assert_eq!(e.status(), Some(503));
        // Nothing applied: the refusal itself.
        let all = vec![refusal(400), refusal(400), refusal(400)];
        assert_eq!(combine(&l, &s, all).unwrap_err().status(), Some(400));
    }
}

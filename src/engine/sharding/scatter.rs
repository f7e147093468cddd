//! A dataset's steps, refreshes and reads whatever its layout: the ledger's
//! own answer when this node holds the dataset, else, for a sharded dataset,
//! its shards' answers merged (`docs/sharding.md`, "Shards"). A request is
//! split by id range into its shards' parts (`split.rs`), each part runs on
//! its shard's owner in parallel (this engine for the shards it owns, a
//! [`Peers`] call for the rest, carrying the caller's
//! credential, which the owner authorises again), and the answers are merged
//! as one ledger would have answered.
//!
//! When a part fails, the answer is the first failure: a retryable one (an
//! owner out of reach, a 5xx) before any other. A step some of whose shards
//! applied their part while another refused it is neither whole nor absent:
//! it is answered [`EngineError::PartiallyApplied`], naming both.

use super::coordinator::{Coordinator, Target};
use super::{merge_status, split_range, split_step, Credential, Peers, RefreshPart, ShardCall};
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::queries::{ExampleQuery, IdRange, PrivacyQuery};
use crate::engine::Engine;
use crate::ledger::{
    IdempotencyKey, RefreshDue, RefreshOutcome, StepOutcome, StepReport, WorstCaseBounds,
};
use dpledger_api::views::{DatasetView, PrivacyView, ShardView, Thresholds};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What one shard's part of a request gives.
type PartFuture<T> = Pin<Box<dyn Future<Output = EngineResult<T>> + Send + 'static>>;

/// One shard's part of a request: how this engine answers it for a shard it
/// owns, and how a peer is asked for it.
trait ShardPart: Send + 'static {
    /// The shard's answer.
    type Answer: Send + 'static;
    /// Answered by this engine for `shard`, which it owns.
    fn here(self, engine: Engine, shard: String) -> PartFuture<Self::Answer>;
    /// Asked of the owner on another node.
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<Self::Answer>;
}

impl ShardPart for StepReport {
    type Answer = StepOutcome;
    fn here(self, engine: Engine, shard: String) -> PartFuture<StepOutcome> {
        Box::pin(async move { engine.report_step(&shard, self).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<StepOutcome> {
        peers.step(call, self)
    }
}

impl ShardPart for RefreshPart {
    type Answer = RefreshOutcome;
    fn here(self, engine: Engine, shard: String) -> PartFuture<RefreshOutcome> {
        Box::pin(async move {
            // Bound to the part exactly as the shard binds one sent over HTTP,
            // so that a retry is recognised wherever the shard is then owned.
            let path = format!("/v1/datasets/{shard}/refresh");
            let key = self
                .key
                .as_ref()
                .map(|k| IdempotencyKey::for_request(k, "POST", &path, &self.body()));
            engine.refresh(&shard, self.ids, self.norms, key).await
        })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<RefreshOutcome> {
        peers.refresh(call, self)
    }
}

/// A shard's view.
struct ViewPart;

impl ShardPart for ViewPart {
    type Answer = DatasetView;
    fn here(self, engine: Engine, shard: String) -> PartFuture<DatasetView> {
        Box::pin(async move { engine.ledger_view(&shard).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<DatasetView> {
        peers.view(call)
    }
}

impl ShardPart for IdRange {
    type Answer = Thresholds;
    fn here(self, engine: Engine, shard: String) -> PartFuture<Thresholds> {
        // The dataset's range was bounded already; a part is never longer.
        Box::pin(async move { engine.ledger_thresholds(&shard, self, u64::MAX).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<Thresholds> {
        peers.thresholds(call, self)
    }
}

/// An example's privacy, by its shard's own id.
struct PrivacyPart(u64, ExampleQuery);

impl ShardPart for PrivacyPart {
    type Answer = PrivacyView;
    fn here(self, engine: Engine, shard: String) -> PartFuture<PrivacyView> {
        Box::pin(async move { engine.ledger_example_privacy(&shard, self.0, self.1).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<PrivacyView> {
        peers.example_privacy(call, self.0, self.1)
    }
}

impl ShardPart for PrivacyQuery {
    type Answer = WorstCaseBounds;
    fn here(self, engine: Engine, shard: String) -> PartFuture<WorstCaseBounds> {
        Box::pin(async move { engine.ledger_worst_case(&shard, self).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<WorstCaseBounds> {
        peers.worst_case(call, self)
    }
}

/// One shard archived alone.
struct ArchivePart;

impl ShardPart for ArchivePart {
    type Answer = ();
    fn here(self, engine: Engine, shard: String) -> PartFuture<()> {
        Box::pin(async move { engine.archive(&shard, None).await })
    }
    fn there(self, peers: Arc<dyn Peers>, call: ShardCall) -> PartFuture<()> {
        peers.archive(call)
    }
}

/// The worse of two shards' worst cases: the larger epsilon, then the more
/// steps (on a tie, `b`). Between steps every shard has the same worst case; a
/// shard ahead (mid-step) or one whose counter a hand-sent part moved has the
/// larger, and the dataset's worst case is its worst shard's.
fn worse_of(a: WorstCaseBounds, b: WorstCaseBounds) -> WorstCaseBounds {
    match a.epsilon.total_cmp(&b.epsilon).then(a.steps.cmp(&b.steps)) {
        std::cmp::Ordering::Greater => a,
        _ => b,
    }
}

/// The answer to give instead of the shards' when one failed: a retryable
/// one first, else the first refusal.
fn first_failure<T>(answers: &[EngineResult<T>]) -> Option<usize> {
    let retryable = answers
        .iter()
        .position(|a| matches!(a, Err(e) if e.is_retryable()));
    retryable.or_else(|| answers.iter().position(Result::is_err))
}

/// "no shard answered" (a layout has at least one shard: a fault).
fn none_answered() -> EngineError {
    EngineError::Internal("no shard answered".into())
}

impl Coordinator {
    /// Shard `s`'s part, wherever the shard is owned.
    async fn one<P: ShardPart>(self, s: usize, part: P) -> EngineResult<P::Answer> {
        let shard = self.layout.shard_dataset(s);
        match self.target(&shard).await? {
            Target::Here => part.here(self.engine.clone(), shard).await,
            Target::There(owner) => {
                let call = ShardCall {
                    owner,
                    shard,
                    credential: self.credential.clone(),
                };
                part.there(self.peers.clone(), call).await
            }
        }
    }

    /// Every part in parallel: one answer each, in the parts' order.
    async fn gather<P: ShardPart>(&self, parts: Vec<(usize, P)>) -> Vec<EngineResult<P::Answer>> {
        let tasks: Vec<_> = parts
            .into_iter()
            .map(|(s, part)| tokio::spawn(self.clone().one(s, part)))
            .collect();
        let mut answers = Vec::with_capacity(tasks.len());
        for task in tasks {
            answers.push(match task.await {
                Ok(answer) => answer,
                Err(_) => Err(EngineError::Internal("a shard request failed".into())),
            });
        }
        answers
    }

    /// Every part's answer, or the first failure (see the module note).
    async fn all<P: ShardPart>(&self, parts: Vec<(usize, P)>) -> EngineResult<Vec<P::Answer>> {
        let mut answers = self.gather(parts).await;
        match first_failure(&answers) {
            Some(i) => Err(answers.swap_remove(i).err().unwrap_or_else(none_answered)),
            None => answers.into_iter().collect(),
        }
    }

    /// A step: each shard applies its part (an empty one included, so that
    /// every shard has every step), and the answers are merged as one
    /// ledger's.
    pub async fn step(&self, report: StepReport) -> EngineResult<StepOutcome> {
        let split = split_step(&self.layout, &report)?;
        let parts = split.parts.iter().cloned().enumerate().collect();
        let mut answers = self.gather(parts).await;
        let Some(i) = first_failure(&answers) else {
            let outcomes = answers.into_iter().collect::<EngineResult<Vec<_>>>()?;
            return Ok(split.merge(&self.layout.ranges, &outcomes)?);
        };
        let applied: Vec<String> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_ok())
            .map(|(s, _)| self.layout.shard_dataset(s))
            .collect();
        let refused = answers.swap_remove(i).err().unwrap_or_else(none_answered);
        if refused.is_retryable() || applied.is_empty() {
            return Err(refused);
        }
        let detail = split.dataset_detail(&self.layout.ranges, i, &refused.to_string());
        let range = &self.layout.ranges[i];
        Err(EngineError::PartiallyApplied(format!(
            "the step was applied in part: shard {:?} (the dataset's ids {} to {}) refused its \
             part ({detail}; ids and positions as the dataset's and the report's) while {} \
             applied theirs; a retry of the same report is answered as a duplicate by those, \
             so correct what the shard refused and send that shard's part, or see \
             docs/sharding.md",
            self.layout.shard_dataset(i),
            range.start,
            range.end - 1,
            applied.join(", ")
        )))
    }

    /// A refresh, split like a step: every shard refreshes its own ids (none,
    /// for some: the checkpoint is then in every shard's log, as in one
    /// ledger's), under the caller's key, so that a retry is recognised
    /// shard by shard.
    pub async fn refresh(
        &self,
        ids: Vec<u64>,
        norms: Vec<f64>,
        key: Option<String>,
    ) -> EngineResult<RefreshOutcome> {
        let split = split_step(&self.layout, &StepReport::new(0, ids, norms))?;
        let parts = split
            .parts
            .iter()
            .enumerate()
            .map(|(s, part)| {
                let part = RefreshPart {
                    ids: part.ids.clone(),
                    norms: part.norms.clone(),
                    key: key.clone(),
                };
                (s, part)
            })
            .collect();
        let answers = self.all(parts).await?;
        Ok(split.merge_refresh(&self.layout.ranges, &answers)?)
    }

    /// The dataset's view: its shards' statuses merged, the worst case of
    /// its worst shard, and the shard map with each shard's lease.
    pub async fn view(&self) -> EngineResult<DatasetView> {
        let layout = &self.layout;
        let parts = (0..layout.ranges.len()).map(|s| (s, ViewPart)).collect();
        let views = self.all(parts).await?;
        let worst = views
            .iter()
            .map(|v| v.worst_case.clone())
            .reduce(worse_of)
            .ok_or_else(none_answered)?;
        let statuses: Vec<_> = views.iter().map(|v| v.status.clone()).collect();
        let leases = self.node.view().await?.1;
        let map = statuses
            .iter()
            .enumerate()
            .map(|(s, status)| {
                let name = layout.shard_dataset(s);
                let lease = leases.iter().find(|l| l.dataset == name);
                ShardView {
                    start: layout.ranges[s].start,
                    end: layout.ranges[s].end,
                    owner: lease
                        .filter(|l| l.expires_in_ms > 0)
                        .and_then(|l| l.owner.clone()),
                    epoch: lease.map_or(0, |l| l.epoch),
                    steps: status.steps,
                    dataset: name,
                }
            })
            .collect();
        Ok(DatasetView {
            id: layout.dataset.clone(),
            archived: views.iter().any(|v| v.archived),
            config: layout.config()?,
            status: merge_status(&statuses).ok_or_else(none_answered)?,
            worst_case: worst,
            shards: Some(map),
        })
    }

    /// The thresholds of the dataset's ids `range`, from the shards holding
    /// them, with what is due on those shards as one.
    pub async fn thresholds(&self, range: IdRange, max_range: u64) -> EngineResult<Thresholds> {
        let layout = &self.layout;
        let ids = range.resolve(layout.examples, max_range)?;
        let mut pieces = split_range(layout, ids.clone());
        if pieces.is_empty() {
            // An empty range still says which step is next.
            pieces.push((0, 0..0));
        }
        let parts = pieces
            .iter()
            .map(|(s, r)| {
                let part = IdRange {
                    start: Some(r.start),
                    end: Some(r.end),
                };
                (*s, part)
            })
            .collect();
        let answers = self.all(parts).await?;
        let mut merged = Thresholds {
            start: ids.start,
            next_step: u64::MAX,
            thresholds: Vec::with_capacity((ids.end - ids.start) as usize),
            retired: Vec::new(),
            refresh_due: None,
        };
        let mut due = Vec::new();
        for ((s, _), part) in pieces.iter().zip(answers) {
            due.push((*s, part.refresh_due));
            let offset = layout.ranges[*s].start;
            merged.next_step = merged.next_step.min(part.next_step);
            merged.thresholds.extend(part.thresholds);
            merged
                .retired
                .extend(part.retired.into_iter().map(|r| r + offset));
        }
        merged.refresh_due =
            RefreshDue::merge(&layout.ranges, due.iter().map(|(s, d)| (*s, d.as_ref())));
        Ok(merged)
    }

    /// Example `example`'s privacy, from its shard, by the dataset's id.
    pub async fn example_privacy(
        &self,
        example: u64,
        query: ExampleQuery,
    ) -> EngineResult<PrivacyView> {
        let layout = &self.layout;
        let Some(s) = layout.shard_of(example) else {
            // As an unsharded ledger refuses it.
            return Err(EngineError::BadRequest {
                detail: format!(
                    "invalid id: {example} is out of range: the dataset has {} examples",
                    layout.examples
                ),
                field: Some("id"),
            });
        };
        let local = example - layout.ranges[s].start;
        let answers = self.all(vec![(s, PrivacyPart(local, query))]).await?;
        let mut view = answers.into_iter().next().ok_or_else(none_answered)?;
        // The shard answers with its own id; the caller asked for the dataset's.
        view.example.id = example;
        Ok(view)
    }

    /// The dataset's worst case: data-independent, so equal on every shard
    /// between steps; otherwise the worst of them (never below the truth).
    pub async fn worst_case(&self, query: PrivacyQuery) -> EngineResult<WorstCaseBounds> {
        let parts = (0..self.layout.ranges.len()).map(|s| (s, query)).collect();
        let bounds = self.all(parts).await?;
        bounds
            .into_iter()
            .reduce(worse_of)
            .ok_or_else(none_answered)
    }

    /// Archive the dataset, then answer its view: every shard at one step
    /// through the change protocol; a dataset one of whose shards is archived
    /// already (by hand, or by an earlier archive cut short) is completed
    /// shard by shard (a shard's archive is idempotent).
    pub async fn archive_dataset(&self) -> EngineResult<DatasetView> {
        if self.view().await?.archived {
            let parts = (0..self.layout.ranges.len())
                .map(|s| (s, ArchivePart))
                .collect();
            self.all(parts).await?;
        } else {
            self.archive().await?;
        }
        self.view().await
    }
}

impl Engine {
    /// The coordinator of dataset `id` for a caller who presented
    /// `credential`, when `id` is a sharded dataset (cluster mode); `None`
    /// when it is one ledger (held here or not: the ledger's own functions
    /// answer, or refuse, it).
    pub async fn sharded(
        &self,
        id: &str,
        credential: Option<Credential>,
    ) -> EngineResult<Option<Coordinator>> {
        if self.cluster().is_none() || self.serves(id) {
            return Ok(None);
        }
        let layout = self.layout_of(id).await?;
        layout.map(|l| self.coordinate(l, credential)).transpose()
    }

    /// Dataset `id`'s view, for a caller who presented `credential`.
    pub async fn view_as(
        &self,
        id: &str,
        credential: Option<Credential>,
    ) -> EngineResult<DatasetView> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.view().await,
            None => self.ledger_view(id).await,
        }
    }

    /// A step of dataset `id`.
    pub async fn step_as(
        &self,
        id: &str,
        report: StepReport,
        credential: Option<Credential>,
    ) -> EngineResult<StepOutcome> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.step(report).await,
            None => self.report_step(id, report).await,
        }
    }

    /// A refresh of dataset `id` under `key` (bound to the request as
    /// received; a sharded dataset's shards bind its text to their parts).
    pub async fn refresh_as(
        &self,
        id: &str,
        ids: Vec<u64>,
        norms: Vec<f64>,
        key: Option<IdempotencyKey>,
        credential: Option<Credential>,
    ) -> EngineResult<RefreshOutcome> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.refresh(ids, norms, key.map(|k| k.key)).await,
            None => self.refresh(id, ids, norms, key).await,
        }
    }

    /// Thresholds of ids `range` of dataset `id` (at most `max_range`).
    pub async fn thresholds_as(
        &self,
        id: &str,
        range: IdRange,
        max_range: u64,
        credential: Option<Credential>,
    ) -> EngineResult<Thresholds> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.thresholds(range, max_range).await,
            None => self.ledger_thresholds(id, range, max_range).await,
        }
    }

    /// Example `example`'s privacy in dataset `id`.
    pub async fn example_privacy_as(
        &self,
        id: &str,
        example: u64,
        query: ExampleQuery,
        credential: Option<Credential>,
    ) -> EngineResult<PrivacyView> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.example_privacy(example, query).await,
            None => self.ledger_example_privacy(id, example, query).await,
        }
    }

    /// Dataset `id`'s worst case.
    pub async fn worst_case_as(
        &self,
        id: &str,
        query: PrivacyQuery,
        credential: Option<Credential>,
    ) -> EngineResult<WorstCaseBounds> {
        match self.sharded(id, credential).await? {
            Some(shards) => shards.worst_case(query).await,
            None => self.ledger_worst_case(id, query).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retryable_failure_is_answered_before_a_refusal() {
        let answers: Vec<EngineResult<()>> = vec![
            Ok(()),
            Err(EngineError::conflict("refused")),
            Err(EngineError::Unavailable("moving".into())),
        ];
        assert_eq!(first_failure(&answers), Some(2));
        assert_eq!(first_failure(&answers[..2]), Some(1));
        assert_eq!(first_failure(&answers[..1]), None);
    }
}

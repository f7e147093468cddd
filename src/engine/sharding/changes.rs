//! The changes of a sharded dataset, each one change across its shards
//! through the coordinator (`coordinator.rs`): a release (the mechanism run
//! once on the shards' merged statistics, each shard leaving out of its input
//! its examples near their budget), a release budget, a release
//! policy, labels after creation (each shard's own record) and archiving
//! (every shard at one step). Each checks what an unsharded dataset checks,
//! in the same order, so that a sharded dataset refuses what an unsharded one
//! does with the same words.

use super::coordinator::{ChangeAnswer, Coordinator, ROUNDS};
use super::labels::{dataset_label_names, split_labels};
use super::merge::{check_interactive, check_sharded_request, release_of_shards, Apart};
use super::protocol::{new_change_id, ShardChange, ShardRecordKind};
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::releases::check_leaves_someone_in;
use crate::engine::ReleaseOutcome;
use crate::ledger::IdempotencyKey;
use crate::release::{
    BudgetStatus, LabelAssignment, Labels, LeftOut, ReleasePolicy, ReleaseRecord, ReleaseRequest,
    ReleaseTrigger,
};
use serde_json::json;
use std::time::Duration;

/// What a sharded dataset's policy must be, besides valid: its request must
/// have sufficient statistics to merge ([`check_sharded_request`]).
pub fn check_policy(policy: &mut ReleasePolicy, names: &[String]) -> EngineResult<()> {
    policy.validate()?;
    check_sharded_request(&policy.request, names)
}

/// The refusal of shards found apart at every round of a change.
fn steps_apart(last: &[u64]) -> EngineError {
    EngineError::ShardsApart(format!(
        "the shards were at different steps ({last:?}) at every try (steps in flight): retry"
    ))
}

impl Coordinator {
    /// A curator's release (`POST /v1/datasets/{d}/releases` of a sharded
    /// dataset): checked, answered from `key`'s stored answer when it was
    /// made, else made on every shard or on none.
    pub async fn release(
        &self,
        mut request: ReleaseRequest,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ChangeAnswer> {
        request.validate()?;
        check_interactive(&request)?;
        if let Some(done) = self.stored_answer(&key).await? {
            return Ok(done);
        }
        self.release_across(&request, key, ReleaseTrigger::Request)
            .await
    }

    /// Make `request` (validated, [`check_sharded_request`]) one release of
    /// every shard or of none, stored under `key` when given: prepare, merge,
    /// run the mechanism once, commit, decide. A curator's release (`trigger`
    /// request) and the policy's alike. Shards found at different steps (a
    /// step in flight) are released and prepared again at the furthest one,
    /// a few rounds, before a retryable refusal.
    pub(super) async fn release_across(
        &self,
        request: &ReleaseRequest,
        key: Option<IdempotencyKey>,
        trigger: ReleaseTrigger,
    ) -> EngineResult<ChangeAnswer> {
        let change = ShardChange::Release(request.clone());
        let mut last = Vec::new();
        for round in 0..ROUNDS {
            let id = new_change_id();
            // After shards were found at different steps: the furthest any
            // was at, which the others reach when the step's parts arrive
            // (views cannot go back).
            let at = last.iter().max().copied();
            let prepared = self.prepare_all(&id, &change, at).await?;
            // Groups need labels: the dataset's names, labels after creation
            // included, are known once the shards answered (shards that
            // disagree on them are refused by the merge below).
            let creation = &self.layout.label_names;
            let shard_names = prepared.iter().map(|p| p.labels.as_slice());
            if let Some(names) = dataset_label_names(creation, shard_names) {
                if let Err(e) = check_sharded_request(request, &names) {
                    self.decide_all(&id).await;
                    return Err(e);
                }
            }
            // The mechanism off the async threads (the merged cells are one
            // `u32` per example).
            let computed = {
                let (request, prepared, creation) =
                    (request.clone(), prepared.clone(), creation.clone());
                tokio::task::spawn_blocking(move || {
                    release_of_shards(&request, &prepared, &creation, trigger)
                })
                .await
                .unwrap_or_else(|_| Err(Apart::Disagree("the mechanism's task failed".into())))
            };
            let release = match computed {
                Ok(r) => r,
                Err(Apart::Steps(steps)) => {
                    self.decide_all(&id).await;
                    last = steps;
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(round + 1))).await;
                    continue;
                }
                Err(Apart::Disagree(detail)) => {
                    self.decide_all(&id).await;
                    return Err(EngineError::ShardsApart(format!(
                        "the shards cannot make one release: {detail}"
                    )));
                }
            };
            // Each shard left out of its input the examples the release would
            // take past their budget (spec §6); one that leaves out every
            // example of the dataset tells nothing.
            let left_out: Vec<LeftOut> = prepared
                .iter()
                .map(|p| {
                    p.release
                        .as_ref()
                        .map(|r| r.left_out.clone())
                        .unwrap_or_default()
                })
                .collect();
            let count = left_out.iter().map(LeftOut::count).sum();
            if let Err(refusal) = check_leaves_someone_in(self.layout.examples, count) {
                self.decide_all(&id).await;
                return Err(refusal);
            }
            let before = prepared[0].budget;
            let budget = BudgetStatus {
                rho_spent: before.rho_spent + release.rho,
                releases: before.releases + 1,
                ..before
            };
            // One record per shard: the release, and the shard's own
            // examples it left out (replay charges exactly the others).
            let payloads = left_out
                .into_iter()
                .map(|left_out| {
                    let record = ReleaseRecord {
                        release: release.clone(),
                        left_out,
                    };
                    serde_json::to_vec(&record).unwrap_or_default()
                })
                .collect();
            let outcome = ReleaseOutcome { release, budget };
            let answer = ChangeAnswer {
                created: true,
                body: serde_json::to_value(&outcome).unwrap_or_default(),
            };
            let kind = ShardRecordKind::Release;
            return self
                .commit(&id, kind, payloads, &prepared, key, answer)
                .await;
        }
        Err(steps_apart(&last))
    }

    /// A release budget of `rho` (checked: finite, >= 0), the same on every
    /// shard, in one transaction; answered from `key` when it was made.
    pub async fn set_budget(
        &self,
        rho: f64,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ChangeAnswer> {
        if let Some(done) = self.stored_answer(&key).await? {
            return Ok(done);
        }
        let id = new_change_id();
        let prepared = self
            .prepare_all(&id, &ShardChange::Budget(rho), None)
            .await?;
        let before = prepared[0].budget;
        if prepared.iter().any(|p| p.budget != before) {
            self.decide_all(&id).await;
            return Err(EngineError::ShardsApart(
                "the shards' release budgets differ".into(),
            ));
        }
        let budget = BudgetStatus {
            rho_budget: Some(rho),
            ..before
        };
        let payload = serde_json::to_vec(&json!({ "rho_budget": rho })).unwrap_or_default();
        let answer = ChangeAnswer {
            created: false,
            body: serde_json::to_value(budget).unwrap_or_default(),
        };
        let kind = ShardRecordKind::BudgetChange;
        self.commit_same(&id, kind, payload, &prepared, key, answer)
            .await
    }

    /// A release policy (or none), the same on every shard, in one
    /// transaction; answered from `key` when it was made. Its answer is the
    /// policy view (`{"policy", "policy_error": null}`).
    pub async fn set_policy(
        &self,
        mut policy: Option<ReleasePolicy>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ChangeAnswer> {
        if let Some(p) = &mut policy {
            p.validate()?;
            check_interactive(&p.request)?;
        }
        if let Some(done) = self.stored_answer(&key).await? {
            return Ok(done);
        }
        let id = new_change_id();
        let change = ShardChange::Policy(policy.clone());
        let prepared = self.prepare_all(&id, &change, None).await?;
        // Groups need labels: the dataset's names (labels after creation
        // included) are known once the shards answered.
        if let Some(p) = &policy {
            let shard_names = prepared.iter().map(|p| p.labels.as_slice());
            let names = dataset_label_names(&self.layout.label_names, shard_names);
            let checked = names.map_or_else(
                || {
                    Err(EngineError::conflict(
                        "the shards' label names differ: retry",
                    ))
                },
                |names| check_sharded_request(&p.request, &names),
            );
            if let Err(e) = checked {
                self.decide_all(&id).await;
                return Err(e);
            }
        }
        let payload = serde_json::to_vec(&json!({ "policy": policy })).unwrap_or_default();
        let answer = ChangeAnswer {
            created: false,
            body: json!({ "policy": policy, "policy_error": null }),
        };
        let kind = ShardRecordKind::ReleasePolicy;
        self.commit_same(&id, kind, payload, &prepared, key, answer)
            .await
    }

    /// Labels assigned to the dataset's examples, on every shard or none,
    /// each shard's record its examples' part; answered as an unsharded
    /// dataset answers (`{"groups"}`, in order of first use).
    pub async fn set_labels(
        &self,
        assignment: LabelAssignment,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ChangeAnswer> {
        if let Some(done) = self.stored_answer(&key).await? {
            return Ok(done);
        }
        let id = new_change_id();
        // Every shard's names (and its refusals: archived, not the owner)
        // first, as an unsharded dataset checks its state before the
        // assignment.
        let prepared = self.prepare_all(&id, &ShardChange::Labels, None).await?;
        let layout = &self.layout;
        let shard_names = prepared.iter().map(|p| p.labels.as_slice());
        let checked = match dataset_label_names(&layout.label_names, shard_names) {
            None => Err(EngineError::ShardsApart(
                "the shards' label names differ".into(),
            )),
            Some(names) => Labels::with_names(&names)
                .and_then(|l| l.check(layout.examples, &assignment))
                .map(|()| names)
                .map_err(EngineError::from),
        };
        let names = match checked {
            Ok(names) => names,
            Err(refusal) => {
                self.decide_all(&id).await;
                return Err(refusal);
            }
        };
        let (groups, records) = split_labels(&layout.ranges, &assignment, &names);
        let payloads = records
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap_or_default())
            .collect();
        let answer = ChangeAnswer {
            created: false,
            body: json!({ "groups": groups }),
        };
        let kind = ShardRecordKind::Labels;
        self.commit(&id, kind, payloads, &prepared, key, answer)
            .await
    }

    /// Archive every shard at one step, or none: every shard prepared at one
    /// step (its writes held), then one `Archived` record per shard, so that
    /// a step whose parts are in flight is applied by every shard before the
    /// archive or refused by every shard after it. Retryable when the shards
    /// stayed at different steps or an owner moved.
    pub async fn archive(&self) -> EngineResult<()> {
        let mut at = None;
        let mut last = Vec::new();
        for round in 0..ROUNDS {
            let id = new_change_id();
            let prepared = self.prepare_all(&id, &ShardChange::Archive, at).await?;
            let steps: Vec<u64> = prepared.iter().map(|p| p.step).collect();
            // Asked at step `at`, a shard at another step holds nothing (its
            // writes flow): only when every shard is at `at` does every
            // shard hold its writes for the commit, so that each applies its
            // record.
            let all_held = at.is_none_or(|t| steps.iter().all(|&s| s == t));
            if !all_held || steps.iter().any(|&s| s != steps[0]) {
                // Steps in flight: ask again one step beyond the furthest
                // shard, so that every shard holds its writes as soon as it
                // has applied the step being reported (a trainer's next step
                // then waits for the archive, which refuses it on every
                // shard); shards found level but not held are asked again
                // where they are.
                self.decide_all(&id).await;
                let level = steps.iter().all(|&s| s == steps[0]);
                at = (!level).then(|| steps.iter().max().map_or(0, |m| m + 1));
                last = steps;
                tokio::time::sleep(Duration::from_millis(10 * u64::from(round + 1))).await;
                continue;
            }
            let answer = ChangeAnswer {
                created: false,
                body: json!({"archived": true, "step": steps[0]}),
            };
            let kind = ShardRecordKind::Archived;
            self.commit_same(&id, kind, Vec::new(), &prepared, None, answer)
                .await?;
            return Ok(());
        }
        Err(steps_apart(&last))
    }
}

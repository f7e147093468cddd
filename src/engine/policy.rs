//! Automatic (policy) releases, computed off the write lock (issue 16, item 4).
//!
//! A policy releases its request after every `every_steps` completed steps. The
//! step that makes one due opens the release's view of the ledger while it
//! still holds the write lock (so the release describes exactly that step, as
//! before), then answers the trainer at once; the `O(n)` pass and the commit run
//! on a background task exactly like a curator's release (`release_view.rs`),
//! so neither that trainer nor any other waits for the dashboards.
//!
//! Order and back-pressure: the step that makes the *next* release due first
//! waits (before it takes the write lock) until the previous policy release is
//! published or refused. So at most one policy release is in flight per
//! dataset, they never pile up when releases are slower than steps, and once a
//! due step is answered every earlier policy release is visible. A refusal
//! found when the view is opened (budget spent, no labels, examples that would
//! retire) is recorded before the step answers; one found at commit is
//! recorded when the task ends. Either way the step itself is accepted.
//!
//! If a curator's release holds the release turn when a policy release falls
//! due, the policy release waits for the turn on its task and opens its view
//! then: it describes the step the ledger has reached by that time (the
//! release records which). At a clean shutdown the server waits for policy
//! releases in flight ([`Engine::finish_policy_releases`]); one cut off by a
//! crash was never recorded and is not made up.

use super::book::PolicyRefusal;
use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::release_view::open_view;
use super::{Engine, ReleaseOutcome};
use crate::ledger::{Ledger, StepReport};
use crate::release::{ReleaseRequest, ReleaseTrigger};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;

/// The policy's slot, held from the due step until its release is recorded.
pub(super) type PolicySlot = OwnedMutexGuard<()>;

impl Engine {
    /// Before a step report takes the write lock: if completing it makes a policy
    /// release due, wait for the previous policy release and take the slot.
    /// Waiting here (not under the lock) lets that release commit meanwhile.
    pub(super) async fn policy_slot(ds: &Dataset, report: &StepReport) -> Option<PolicySlot> {
        let every = ds.book_read().policy.as_ref()?.every_steps;
        if every == 0 || (report.step + 1) % every != 0 {
            return None;
        }
        Some(ds.policy_in_flight.clone().lock_owned().await)
    }

    /// After a completed step, with the write lock held: start the policy's
    /// release if one is due. Never fails the step.
    pub(super) fn policy_release(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
        slot: Option<PolicySlot>,
    ) {
        let Some(policy) = ds.book_read().policy.clone() else {
            return;
        };
        if policy.every_steps == 0 || ledger.next_step() % policy.every_steps != 0 {
            return;
        }
        // The policy changed after the slot was checked: take it if it is free.
        let Some(slot) = slot.or_else(|| ds.policy_in_flight.clone().try_lock_owned().ok()) else {
            record_outcome(
                ds,
                Err(EngineError::conflict(
                    "the previous policy release was still being computed when this one fell due",
                )),
            );
            return;
        };
        let mut request = policy.request;
        if let Err(e) = request.validate() {
            record_outcome(ds, Err(e.into()));
            return;
        }
        let engine = self.clone();
        let ds = ds.clone();
        match ds.release_turn.clone().try_lock_owned() {
            Ok(turn) => match open_view(&ds, ledger, &request) {
                Err(e) => record_outcome(&ds, Err(e)),
                Ok(view) => {
                    tokio::spawn(async move {
                        let result = engine
                            .compute_and_commit(view, request, ReleaseTrigger::Policy)
                            .await;
                        record_outcome(&ds, result);
                        drop((turn, slot));
                    });
                }
            },
            Err(_) => {
                tokio::spawn(async move {
                    let turn = ds.release_turn.clone().lock_owned().await;
                    let result = engine.policy_release_later(&ds, request).await;
                    record_outcome(&ds, result);
                    drop((turn, slot));
                });
            }
        }
    }

    /// A policy release that found a curator's release in progress: open the
    /// view now that the turn is free, then compute and commit.
    async fn policy_release_later(
        &self,
        ds: &Arc<Dataset>,
        request: ReleaseRequest,
    ) -> EngineResult<ReleaseOutcome> {
        let view = {
            let mut ledger = ds.ledger.write().await;
            self.locked_checks(ds, &mut ledger).await?;
            open_view(ds, &mut ledger, &request)?
        };
        self.compute_and_commit(view, request, ReleaseTrigger::Policy)
            .await
    }

    /// Wait (at most `limit`) until no policy release is in flight, so that a
    /// clean shutdown records those that were due. Returns how many datasets
    /// still had one after the limit.
    pub async fn finish_policy_releases(&self, limit: Duration) -> usize {
        let datasets: Vec<Arc<Dataset>> = self.datasets.iter().map(|e| e.clone()).collect();
        let deadline = tokio::time::Instant::now() + limit;
        let mut unfinished = 0;
        for ds in datasets {
            let slot = tokio::time::timeout_at(deadline, ds.policy_in_flight.lock()).await;
            if slot.is_err() {
                tracing::warn!(
                    dataset = ds.id,
                    "policy release still in flight at shutdown"
                );
                unfinished += 1;
            }
        }
        unfinished
    }
}

/// Keep the outcome of a policy release for the dataset's status: a refusal
/// (budget spent, say) is shown to curators in full and to viewers and owners
/// as its public reason; a published release clears it.
fn record_outcome(ds: &Dataset, result: EngineResult<ReleaseOutcome>) {
    let mut book = ds.book_write();
    match result {
        Ok(_) => book.policy_error = None,
        Err(e) => {
            let detail = e.to_string();
            tracing::warn!(dataset = ds.id, detail = detail, "policy release refused");
            metrics::counter!("dpledger_policy_releases_refused_total").increment(1);
            book.policy_error = Some(PolicyRefusal {
                reason: e.public_reason(),
                detail,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DatasetSetup;
    use crate::ledger::DatasetConfig;
    use crate::release::ReleasePolicy;

    /// The steps of the dataset's releases, oldest first.
    fn released(ds: &Dataset) -> Vec<u64> {
        ds.book_read().history.iter().map(|r| r.step).collect()
    }

    async fn wait_for(ds: &Dataset, count: usize) {
        for _ in 0..2000 {
            if released(ds).len() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no release after 10 s: {:?}", released(ds));
    }

    /// A policy release that falls due while a curator's release holds the
    /// turn waits for it on its task: the step answers, later steps are
    /// applied meanwhile, and the release then describes the step the ledger
    /// reached (and says so); the next due step waits for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_release_waits_for_a_curators_turn_without_holding_steps() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("db").display());
        let engine = Engine::recover(crate::store::open(&url).unwrap()).unwrap();
        let policy = ReleasePolicy {
            every_steps: 2,
            request: serde_json::from_str(r#"{"mean": {"rho": 0.0001}}"#).unwrap(),
        };
        let setup = DatasetSetup {
            release_budget: Some(1.0),
            labels: None,
            release_policy: Some(policy),
        };
        let config = DatasetConfig::poisson(10, 0.5, 1.0, 1.0, 1e-5);
        let ds = engine.create_dataset("d", config, setup).await.unwrap();
        let step = |t: u64| StepReport::new(t, vec![0, 1], vec![0.5, 2.0]);
        engine.report_step("d", step(0)).await.unwrap();
        let turn = ds.release_turn.clone().lock_owned().await;
        // Step 1 makes the release due; it answers while the turn is held.
        engine.report_step("d", step(1)).await.unwrap();
        engine.report_step("d", step(2)).await.unwrap();
        assert!(released(&ds).is_empty());
        drop(turn);
        wait_for(&ds, 1).await;
        assert_eq!(released(&ds), vec![3]);
        // The next due step (3) finds the turn free: its release is at step 4.
        engine.report_step("d", step(3)).await.unwrap();
        wait_for(&ds, 2).await;
        assert_eq!(released(&ds), vec![3, 4]);
        assert!(ds.book_read().policy_error.is_none());
        assert_eq!(
            engine.finish_policy_releases(Duration::from_secs(1)).await,
            0
        );
    }
}

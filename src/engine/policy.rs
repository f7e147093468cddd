//! Automatic (policy) releases, computed off the write lock.
//!
//! A policy releases its request after every `every_steps` completed steps. The
//! step that makes one due opens the release's view of the ledger while it
//! still holds the write lock (so the release describes exactly that step, as
//! before), then answers the trainer at once; the `O(n)` pass and the commit run
//! on a background task exactly like a curator's release (`release_view.rs`),
//! so neither that trainer nor any other waits for the dashboards.
//!
//! Order and back-pressure: a step never waits for a release. At most one
//! policy release is computed at a time per dataset; one that falls due while
//! the previous is still computing is *deferred*: a task waits for the previous
//! one and then opens its view at the step the ledger has reached by then (its
//! record says which). Further releases falling due meanwhile coalesce into
//! that deferred one (counted in `dpledger_policy_releases_coalesced_total`),
//! so when releases are slower than steps they never pile up: the dashboard
//! gets the newest state as often as releases can be computed. A refusal found
//! when the view is opened (budget spent, no labels, examples that would
//! retire) is recorded before the step answers; one found later is recorded
//! when the task ends. Either way the step itself is accepted.
//!
//! If a curator's release holds the release turn when a policy release falls
//! due, the policy release waits for the turn on its task and opens its view
//! then: it describes the step the ledger has reached by that time (the
//! release records which). At a clean shutdown the server waits for policy
//! releases in flight ([`Engine::finish_policy_releases`]); one cut off by a
//! crash was never recorded and is not made up.

use super::book::PolicyRefusal;
use super::dataset::Dataset;
use super::error::EngineResult;
use super::release_view::open_view;
use super::{Engine, ReleaseOutcome};
use crate::ledger::Ledger;
use crate::release::{ReleaseRequest, ReleaseTrigger};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;

/// The policy's slot, held from the due step until its release is recorded.
type PolicySlot = OwnedMutexGuard<()>;

impl Engine {
    /// After a completed step, with the write lock held: start the policy's
    /// release if one is due, or defer it behind the one in flight (module
    /// note). Never fails or delays the step.
    pub(super) fn policy_release(&self, ds: &Arc<Dataset>, ledger: &mut Ledger) {
        // A shard's policy is its dataset's: run across shards by one
        // coordinator (`sharding/policy.rs`), never by a shard alone.
        if self.shard_policy_step(ds, ledger) {
            return;
        }
        let Some(policy) = ds.book_read().policy.clone() else {
            return;
        };
        if policy.every_steps == 0 || ledger.next_step() % policy.every_steps != 0 {
            return;
        }
        let request = match validated(policy.request) {
            Ok(request) => request,
            Err(e) => return record_outcome(ds, Err(e)),
        };
        match ds.policy_in_flight.clone().try_lock_owned() {
            Ok(slot) => self.start_policy_release(ds, ledger, request, slot),
            Err(_) => self.defer_policy_release(ds),
        }
    }

    /// The slot is free: open the view now (under this step's lock) when the
    /// turn is free too, else on a task once a curator's release is done.
    fn start_policy_release(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
        request: ReleaseRequest,
        slot: PolicySlot,
    ) {
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
                        record_outcome(&ds, result.map(Some));
                        drop((turn, slot));
                    });
                }
            },
            Err(_) => {
                tokio::spawn(async move {
                    let turn = ds.release_turn.clone().lock_owned().await;
                    let result = engine.policy_release_later(&ds, request, false).await;
                    record_outcome(&ds, result);
                    drop((turn, slot));
                });
            }
        }
    }

    /// The previous policy release is still being computed: wait for it on a
    /// task, then release the ledger as it is then with the policy as it is
    /// then (none if it was removed meanwhile). One deferred release at a time;
    /// releases falling due while it waits coalesce into it.
    fn defer_policy_release(&self, ds: &Arc<Dataset>) {
        if ds.policy_deferred.swap(true, Ordering::AcqRel) {
            metrics::counter!("dpledger_policy_releases_coalesced_total").increment(1);
            return;
        }
        let engine = self.clone();
        let ds = ds.clone();
        tokio::spawn(async move {
            let slot = ds.policy_in_flight.clone().lock_owned().await;
            ds.policy_deferred.store(false, Ordering::Release);
            let Some(policy) = ds.book_read().policy.clone() else {
                return;
            };
            let result = match validated(policy.request) {
                Err(e) => Err(e),
                Ok(request) => {
                    let turn = ds.release_turn.clone().lock_owned().await;
                    let result = engine.policy_release_later(&ds, request, true).await;
                    drop(turn);
                    result
                }
            };
            record_outcome(&ds, result);
            drop(slot);
        });
    }

    /// A policy release that waited (for a curator's release, or deferred
    /// behind the previous policy release): open the view now that the turn is
    /// free, then compute and commit. A deferred one is skipped (`None`) when
    /// the newest release is a policy release of the ledger as it is now: no
    /// step came since, so it would spend budget on the same numbers.
    async fn policy_release_later(
        &self,
        ds: &Arc<Dataset>,
        request: ReleaseRequest,
        deferred: bool,
    ) -> EngineResult<Option<ReleaseOutcome>> {
        let view = {
            let mut ledger = ds.ledger.write().await;
            self.locked_checks(ds, &mut ledger).await?;
            let newest = ds.book_read().history.last().map(|r| (r.step, r.trigger));
            if deferred && newest == Some((ledger.next_step(), ReleaseTrigger::Policy)) {
                return Ok(None);
            }
            open_view(ds, &mut ledger, &request)?
        };
        self.compute_and_commit(view, request, ReleaseTrigger::Policy)
            .await
            .map(Some)
    }

    /// Keep the outcome of a sharded dataset's policy release (made across
    /// its shards by the api layer's coordinator) in the book of `shard`, its
    /// first shard, served here, as an unsharded dataset keeps its own: a
    /// refusal for the dataset's status, cleared by a published release
    /// (`Ok(true)`; `Ok(false)`: skipped, nothing changes). Nothing is kept
    /// when this node no longer serves the shard (logged instead).
    pub fn note_shard_policy_outcome(&self, shard: &str, result: EngineResult<bool>) {
        match self.datasets.get(shard).map(|d| d.clone()) {
            Some(ds) => record(&ds, result),
            None => {
                if let Err(e) = result {
                    tracing::warn!(dataset = shard, error = %e, "sharded policy release refused");
                    metrics::counter!("dpledger_policy_releases_refused_total").increment(1);
                }
            }
        }
    }

    /// Wait (at most `limit`) until no policy release is in flight, so that a
    /// clean shutdown records those that were due. Returns how many datasets
    /// still had one after the limit.
    pub async fn finish_policy_releases(&self, limit: Duration) -> usize {
        let datasets: Vec<Arc<Dataset>> = self.datasets.iter().map(|e| e.clone()).collect();
        let deadline = tokio::time::Instant::now() + limit;
        let mut unfinished = 0;
        for ds in datasets {
            // A deferred release takes the slot after the one in flight.
            let finished = tokio::time::timeout_at(deadline, async {
                loop {
                    let slot = ds.policy_in_flight.lock().await;
                    if !ds.policy_deferred.load(Ordering::Acquire) {
                        return;
                    }
                    drop(slot);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            if finished.is_err() {
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

/// The policy's request, checked as a curator's would be.
fn validated(mut request: ReleaseRequest) -> EngineResult<ReleaseRequest> {
    request.validate()?;
    Ok(request)
}

/// Keep the outcome of a policy release for the dataset's status: a refusal
/// (budget spent, say) is shown to curators in full and to viewers and owners
/// as its public reason; a published release clears it.
fn record_outcome(ds: &Dataset, result: EngineResult<Option<ReleaseOutcome>>) {
    record(ds, result.map(|o| o.is_some()))
}

/// [`record_outcome`] of a release made (`true`), skipped or refused.
fn record(ds: &Dataset, result: EngineResult<bool>) {
    let mut book = ds.book_write();
    match result {
        Ok(false) => {}
        Ok(true) => book.policy_error = None,
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
    use crate::ledger::{DatasetConfig, StepReport};
    use crate::release::ReleasePolicy;

    /// The steps of the dataset's releases, oldest first.
    fn released(ds: &Dataset) -> Vec<u64> {
        ds.book_read().history.iter().map(|r| r.step).collect()
    }

    /// An engine on a store in `dir` with dataset `d` (10 examples, a budget)
    /// whose policy releases a mean every `every` steps.
    async fn with_policy(dir: &std::path::Path, every: u64) -> (Engine, Arc<Dataset>) {
        let url = format!("sqlite:{}", dir.join("db").display());
        let engine = Engine::recover(crate::store::open(&url).unwrap()).unwrap();
        let policy = ReleasePolicy {
            every_steps: every,
            request: serde_json::from_str(r#"{"mean": {"rho": 0.0001}}"#).unwrap(),
        };
        let setup = DatasetSetup {
            release_budget: Some(1.0),
            labels: None,
            release_policy: Some(policy),
        };
        let config = DatasetConfig {
            thresholds: Some(crate::ledger::ThresholdMode::Sampled),
            ..DatasetConfig::poisson(10, 0.5, 1.0, 1.0, 1e-5)
        };
        let ds = engine
            .create_dataset("d", config, setup, None)
            .await
            .unwrap();
        (engine, ds)
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
    /// reached (and says so); the next due step, with nothing in flight, is
    /// released at its own step.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_release_waits_for_a_curators_turn_without_holding_steps() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, ds) = with_policy(dir.path(), 2).await;
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

    /// Releases slower than steps: while the first policy release cannot
    /// proceed (a curator holds the turn), every step answers at once; the
    /// release due at the second step is deferred, those due later coalesce
    /// into it, and once the turn is free the first release and the deferred
    /// one describe the ledger as it is then. With no step in between, the
    /// deferred one is skipped (it would repeat the same numbers); a step
    /// later, the next due release is made as usual.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn due_releases_behind_a_slow_one_are_deferred_and_coalesced() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, ds) = with_policy(dir.path(), 1).await;
        let step = |t: u64| StepReport::new(t, vec![0, 1], vec![0.5, 2.0]);
        let turn = ds.release_turn.clone().lock_owned().await;
        for t in 0..6 {
            tokio::time::timeout(Duration::from_secs(5), engine.report_step("d", step(t)))
                .await
                .expect("a step waited for a release")
                .unwrap();
        }
        assert!(ds.policy_deferred.load(Ordering::Acquire));
        assert!(released(&ds).is_empty());
        drop(turn);
        wait_for(&ds, 1).await;
        assert_eq!(
            engine.finish_policy_releases(Duration::from_secs(10)).await,
            0
        );
        assert_eq!(
            released(&ds),
            vec![6],
            "the deferred release repeated step 6"
        );
        assert!(!ds.policy_deferred.load(Ordering::Acquire));
        engine.report_step("d", step(6)).await.unwrap();
        wait_for(&ds, 2).await;
        assert_eq!(released(&ds), vec![6, 7]);
        assert!(ds.book_read().policy_error.is_none());
    }
}

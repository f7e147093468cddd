//! A shard's prepare of a sharded release, computed from a view while the
//! shard's steps keep flowing (`docs/sharding.md`, "The change
//! protocol", *Statistics from a view*). Called by the holder of a
//! prepared change (`owners.rs`), which holds the release turn:
//!
//! 1. **Open** (write lock, `O(#orders)`): when the coordinator names a step
//!    `at`, wait (at most [`TARGET_WAIT`], without the lock between looks)
//!    until the shard has applied every step before it; then the checks and a
//!    view of the ledger at the step, exactly as an unsharded release opens one
//!    (`release_view.rs`). A shard already past `at`, or still short of it
//!    when the wait runs out, opens nothing and answers its step without
//!    statistics: the coordinator asks again at another step.
//! 2. **Pass** (no write lock): the worst case `B` at the view's step and
//!    every example's epsilon there (`Engine::view_pass`: chunks under the
//!    read lock between steps), then the statistics. At normal priority, not
//!    at the unsharded release's idle priority: the other shards' owners may
//!    already hold their writes for this change (step 3) while this pass
//!    runs, so starving it would stall their steps.
//! 3. **Lock** (write lock, kept until the change is decided): close the view
//!    and check again against the ledger as it is now, where the charge will
//!    land (the owner's epoch unchanged, no multi-part step incomplete, the
//!    budget, no example it does not leave out retired by the charge); the
//!    answer says the view's step, which the release record names, and the
//!    shard's examples the release leaves out of its input (spec §6), which
//!    the shard's record keeps.

use super::owners::Ready;
use super::protocol::{Prepared, PreparedRelease};
use crate::engine::dataset::Dataset;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::releases::{check_budget, check_charge};
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::release::{LeftOut, ReleaseRequest, ReleaseSummary};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::RwLockWriteGuard;

/// How long a prepare waits for its shard to reach the step the coordinator
/// named (the other shards are there: the step's part is on its way).
pub(super) const TARGET_WAIT: Duration = Duration::from_secs(1);

/// How long a prepare waits for a multi-part step in progress to complete.
pub(super) const PENDING_WAIT: Duration = Duration::from_secs(2);

/// How often a prepare looks again at a shard it waits for.
const LOOK_AGAIN: Duration = Duration::from_millis(2);

impl Engine {
    /// The write lock of `ds` once no multi-part step is incomplete (or
    /// [`PENDING_WAIT`] after `since`) and, with `at`, the shard has applied
    /// the steps before `at` (or [`TARGET_WAIT`] after `since`); the dataset's
    /// own checks made.
    pub(super) async fn lock_when_ready<'a>(
        &self,
        ds: &'a Arc<Dataset>,
        at: Option<u64>,
        since: Instant,
    ) -> EngineResult<RwLockWriteGuard<'a, Ledger>> {
        loop {
            let mut ledger = ds.ledger.write().await;
            self.locked_checks(ds, &mut ledger).await?;
            let behind = at.is_some_and(|t| ledger.next_step() < t);
            let pending = ledger.check_release().is_err();
            let waited = since.elapsed();
            if (behind && waited < TARGET_WAIT) || (pending && waited < PENDING_WAIT) {
                drop(ledger);
                tokio::time::sleep(LOOK_AGAIN).await;
                continue;
            }
            return Ok(ledger);
        }
    }

    /// Prepare a release of shard `ds` at step `at` (the shard's current step
    /// when `None`) from a view (module note). The caller holds the shard's
    /// release turn.
    pub(super) async fn prepare_release<'a>(
        &self,
        ds: &'a Arc<Dataset>,
        request: &ReleaseRequest,
        at: Option<u64>,
    ) -> EngineResult<Ready<'a>> {
        // 1. Open.
        let (mut view, epoch) = {
            let mut ledger = self.lock_when_ready(ds, at, Instant::now()).await?;
            let epoch = ds.epoch.load(Ordering::Acquire);
            let step = ledger.next_step();
            if at.is_some_and(|t| t != step) {
                let (budget, labels) = {
                    let book = ds.book_read();
                    (book.budget, book.labels.names().to_vec())
                };
                return Ok(Ready::Passed(Prepared {
                    epoch,
                    step,
                    budget,
                    release: None,
                    labels,
                }));
            }
            (self.open_shard_view(ds, &mut ledger, request)?, epoch)
        };
        // 2. Pass (steps flow meanwhile).
        let (bound, epsilons) = self.view_pass(&mut view, false).await?;
        let labels = view.take_labels().unwrap_or_default();
        let summary = {
            let request = request.clone();
            tokio::task::spawn_blocking(move || {
                ReleaseSummary::of(&request, &epsilons, bound, &labels)
            })
            .await
            .map_err(|_| EngineError::Internal("a release's statistics stopped".into()))?
        };
        // 3. Lock, and check again where the charge will land.
        let mut ledger = self.lock_when_ready(ds, None, Instant::now()).await?;
        if !view.close_locked(&mut ledger) || ds.epoch.load(Ordering::Acquire) != epoch {
            return Err(EngineError::Unavailable(format!(
                "shard {:?} was reloaded while its release statistics were computed: retry",
                ds.id
            )));
        }
        let rho = request.rho();
        // The label names as the view saw them: a labels change needs the
        // release turn, which this prepare holds from the view to its decision.
        let (budget, names) = {
            let book = ds.book_read();
            check_budget(ds, &book, rho)?;
            (book.budget, book.labels.names().to_vec())
        };
        check_charge(&ledger, rho, view.left_out())?;
        let prepared = Prepared {
            epoch,
            step: view.step(),
            budget,
            release: Some(PreparedRelease {
                delta: view.delta(),
                bound,
                summary,
                left_out: LeftOut::from_ids(view.left_out()),
            }),
            labels: names,
        };
        Ok(Ready::Held(ledger, prepared))
    }
}

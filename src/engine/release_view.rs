//! A release computed while steps keep flowing: a curator's,
//! and the policy's (`policy.rs`), which opens its view inside the due step.
//!
//! A release's work is an `O(n × #orders)` pass over every example's RDP (0.2 s
//! per million examples) plus the statistics. Holding the dataset's write lock
//! for all of it made every step wait behind dashboards. Instead:
//!
//! 1. **Open** (write lock, `O(#orders)`): the checks (budget, labels, pending
//!    parts, retirements), then a view of the ledger at the current step
//!    ([`Ledger::open_view`]) and what the worst case needs (its RDP and the
//!    PLD events at that step), and the labels for a by-group release.
//! 2. **Compute** (no write lock): the PLD worst case `B` (cached, FFTs), then,
//!    on a thread at idle priority (`background.rs`), every example's epsilon
//!    from the view in chunks of [`CHUNK`] examples, each under the read lock
//!    for about a quarter of a millisecond and taken only between steps, and
//!    the DP statistics. Steps come first: a release of a busy dataset takes
//!    longer, and a step waits at most about one chunk for it. When steps
//!    leave no gap for a while, a chunk is read by a normal-priority thread
//!    that queues for the lock (`EpsilonPass::read_chunk`): the idle-priority
//!    thread itself never waits in the lock's queue.
//! 3. **Commit** (write lock): close the view, check the budget and the charge
//!    again against the ledger as it is now (a step or another release may have
//!    come in between), then persist and charge as one record, exactly as a
//!    release under the lock. The record names the step its values describe.
//!
//! So the release describes the ledger at one step (a consistent view), and its
//! charge is in the log once, after everything the log held before it: the
//! charge is uniform over examples and composition does not depend on order, so
//! steps in between change nothing about what it costs.

use super::background::background;
use super::bounds::blocking;
use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::releases::{
    check_bound, check_budget, check_charge, check_labels, check_leaves_someone_in, now_secs,
    released_answer,
};
use super::{Engine, ReleaseOutcome};
use crate::accounting::pld::PldEvent;
use crate::accounting::Conversion;
use crate::ledger::bounds::{capped_value, combine_worst_case, PldWorstCase};
use crate::ledger::{IdempotencyKey, Ledger, ViewToken, WorstCase};
use crate::release::{compute, rdp_of_rho, Labels, Release, ReleaseRequest, ReleaseTrigger};
use std::sync::Arc;
use std::time::Duration;

/// Examples per read-locked chunk of the epsilon pass. An example costs about
/// a microsecond at 64 orders (its RDP row and the conversion's logarithms), so
/// a step waits at most about a quarter of a millisecond for the release.
pub const CHUNK: usize = 256;

/// How long the epsilon pass tries the read lock between steps before it
/// queues for it (see `EpsilonPass::read_lock`).
const LOCK_PATIENCE: Duration = Duration::from_millis(20);

/// How long a commit waits for an incomplete multi-part step to complete
/// before refusing the release (the charge cannot land in the middle of one).
const PENDING_WAIT: Duration = Duration::from_secs(10);

/// An open view and what the release fixed when it opened it. Dropping it
/// without committing closes the view (on a task, as that needs the lock).
pub(super) struct OpenView {
    ds: Arc<Dataset>,
    token: ViewToken,
    delta: f64,
    /// The RDP worst case at the view's step.
    rdp_worst: WorstCase,
    /// `(steps, releases)` at the view's step, and the PLD worst case then:
    /// taken from the cache when it had it (a later query may evict it before
    /// the release computes), else the events to compute it from.
    pld_at: (u64, u64),
    pld_cached: Option<Result<PldWorstCase, String>>,
    pld_events: Option<Vec<PldEvent>>,
    /// A by-group release's labels, as at the view's step.
    labels: Option<Labels>,
    examples: usize,
    /// The examples the release leaves out of its input (sorted ids, spec §6):
    /// their terms are 0 and the release costs them nothing.
    left_out: Vec<u32>,
    open: bool,
    /// A curator's idempotency key, stored with the release at commit.
    key: Option<IdempotencyKey>,
}

impl Drop for OpenView {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let token = self.token;
        if let Ok(mut ledger) = self.ds.ledger.try_write() {
            ledger.close_view(token);
            return;
        }
        let ds = self.ds.clone();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                ds.ledger.write().await.close_view(token);
            });
        }
    }
}

impl Engine {
    /// Publish a release requested by a curator, computed from a view of the
    /// ledger so that steps keep flowing meanwhile (module note).
    /// A retry with the same idempotency `key` is answered with the release
    /// that key made, and charged nothing more.
    pub async fn release(
        &self,
        id: &str,
        mut request: ReleaseRequest,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ReleaseOutcome> {
        request.validate()?;
        let ds = self.dataset(id)?;
        // One release at a time per dataset (one view per ledger).
        let _turn = ds.release_turn.lock().await;
        let mut view = {
            let mut ledger = ds.ledger.write().await;
            if let Some(done) = self.replayed(&ds, &mut ledger, key.as_ref()).await? {
                return released_answer(&ds, &done);
            }
            self.locked_checks(&ds, &mut ledger).await?;
            open_view(&ds, &mut ledger, &request)?
        };
        view.key = key;
        self.compute_and_commit(view, request, ReleaseTrigger::Request)
            .await
    }

    /// Steps 2 and 3 for a view opened by [`open_view`]: compute without the
    /// write lock, then commit. The caller holds the dataset's release turn;
    /// the view is closed before this returns, whatever the outcome, so the
    /// next release in turn finds none open.
    pub(super) async fn compute_and_commit(
        &self,
        mut view: OpenView,
        request: ReleaseRequest,
        trigger: ReleaseTrigger,
    ) -> EngineResult<ReleaseOutcome> {
        let outcome = self
            .compute_and_commit_in(&mut view, request, trigger)
            .await;
        if view.open {
            view.open = false;
            view.ds.ledger.write().await.close_view(view.token);
        }
        outcome
    }

    async fn compute_and_commit_in(
        &self,
        view: &mut OpenView,
        request: ReleaseRequest,
        trigger: ReleaseTrigger,
    ) -> EngineResult<ReleaseOutcome> {
        let (bound, epsilons) = self.view_pass(view, true).await?;
        let labels = view.labels.take().unwrap_or_default();
        let values = {
            let request = request.clone();
            let step = view.token.step();
            background(move || {
                let mut rng = crate::release::rng::release_rng(step);
                Ok(compute(&mut rng, &request, &epsilons, bound, &labels))
            })
            .await?
        };
        let release = Release {
            id: 0, // numbered at commit
            step: view.token.step(),
            released_at: 0,
            trigger,
            delta: view.delta,
            bound,
            rho: request.rho(),
            request,
            values,
        };
        self.commit_release(view, release).await
    }

    /// Step 2's pass, without the write lock: the worst case `B` at the view's
    /// step and every example's epsilon there, bounded by the PLD worst case,
    /// with 0 for the examples the release leaves out (their terms).
    /// Also the statistics pass of a shard's prepare
    /// (`sharding::prepare`).
    ///
    /// `idle`: on a thread at idle priority, so that the node's steps come
    /// first (an unsharded release); else on tokio's blocking pool at normal
    /// priority (a shard's prepare, which other shards' owners wait for while
    /// they hold their writes).
    pub(super) async fn view_pass(
        &self,
        view: &mut OpenView,
        idle: bool,
    ) -> EngineResult<(f64, Vec<f64>)> {
        let ds = view.ds.clone();
        let pld = match view.pld_cached.take() {
            Some(cached) => cached,
            None => {
                let pld_events = view.pld_events.take();
                blocking(|| ds.pld_worst_case_of(view.pld_at, || pld_events, view.delta))
            }
        };
        let worst = combine_worst_case(view.rdp_worst.clone(), pld);
        let bound = worst.epsilon;
        check_bound(view.token.step(), bound, view.delta)?;
        let pld_epsilon = worst.pld.map(|p| p.epsilon);
        let pass = EpsilonPass {
            ds: ds.clone(),
            runtime: tokio::runtime::Handle::current(),
            queued: Default::default(),
            token: view.token,
            examples: view.examples,
            pld_epsilon,
        };
        let mut epsilons = if idle {
            background(move || pass.run()).await?
        } else {
            tokio::task::spawn_blocking(move || pass.run())
                .await
                .map_err(|_| EngineError::Internal("a release's pass stopped".into()))??
        };
        for &i in &view.left_out {
            epsilons[i as usize] = 0.0;
        }
        Ok((bound, epsilons))
    }

    /// Step 3: close the view, check again against the ledger as it is now,
    /// then persist and charge (write lock).
    async fn commit_release(
        &self,
        view: &mut OpenView,
        mut release: Release,
    ) -> EngineResult<ReleaseOutcome> {
        let ds = view.ds.clone();
        let waited_since = std::time::Instant::now();
        let mut ledger = loop {
            let mut ledger = ds.ledger.write().await;
            if view.open {
                view.open = false;
                if !ledger.close_view(view.token) {
                    return Err(reloaded());
                }
            }
            self.locked_checks(&ds, &mut ledger).await?;
            match ledger.check_release() {
                Err(_) if waited_since.elapsed() < PENDING_WAIT => {
                    drop(ledger);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => break ledger,
            }
        };
        {
            let book = ds.book_read();
            check_budget(&ds, &book, release.rho)?;
            release.id = book.budget.releases + 1;
        }
        check_charge(&ledger, release.rho, &view.left_out)?;
        release.released_at = now_secs();
        let key = view.key.take();
        let left_out = std::mem::take(&mut view.left_out);
        self.publish(&ds, &mut ledger, release, &left_out, key)
            .await
    }
}

impl OpenView {
    /// The step the view shows (the release describes it).
    pub(super) fn step(&self) -> u64 {
        self.token.step()
    }

    /// The delta of the view's epsilons.
    pub(super) fn delta(&self) -> f64 {
        self.delta
    }

    /// The examples the release leaves out of its input (sorted ids).
    pub(super) fn left_out(&self) -> &[u32] {
        &self.left_out
    }

    /// A by-group release's labels, as at the view's step (taken once).
    pub(super) fn take_labels(&mut self) -> Option<Labels> {
        self.labels.take()
    }

    /// Close the view under the write lock of its dataset's `ledger`, which
    /// the caller holds; `false` when it was lost (the dataset was reloaded).
    pub(super) fn close_locked(&mut self, ledger: &mut Ledger) -> bool {
        let was_open = std::mem::replace(&mut self.open, false);
        was_open && ledger.close_view(self.token)
    }
}

/// Step 1: the checks, then the view, with the write lock held (the caller
/// made [`Engine::locked_checks`]) and the release turn taken; `O(#orders)`.
pub(super) fn open_view(
    ds: &Arc<Dataset>,
    ledger: &mut Ledger,
    request: &ReleaseRequest,
) -> EngineResult<OpenView> {
    open_view_with(ds, ledger, request, ViewScope::Dataset)
}

/// What a view's ledger holds: a whole dataset, or one shard of a sharded
/// dataset (whose coordinator checks what only the whole dataset can say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ViewScope {
    /// The dataset: a by-group release needs labels, and one that would leave
    /// every example out is refused.
    Dataset,
    /// One shard: it may hold none of the labelled examples (its part is then
    /// its unlabelled group), and it may leave all of its examples out while
    /// other shards keep theirs.
    Shard,
}

impl Engine {
    /// [`open_view`] for a shard's part of a sharded release
    /// (`sharding::prepare`), where a by-group release is not refused
    /// for want of labels (a shard of a labelled dataset may hold none of the
    /// labelled examples: its part is then its unlabelled group) nor for
    /// leaving all of the shard's examples out: the coordinator checks the
    /// dataset's labels and whether the release leaves anyone in.
    pub(super) fn open_shard_view(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
        request: &ReleaseRequest,
    ) -> EngineResult<OpenView> {
        open_view_with(ds, ledger, request, ViewScope::Shard)
    }
}

/// [`open_view`] of a dataset or of a shard (`scope`): the checks, then the
/// examples the release would push past their budget, which it leaves out of
/// its input (spec §6), then the view.
fn open_view_with(
    ds: &Arc<Dataset>,
    ledger: &mut Ledger,
    request: &ReleaseRequest,
    scope: ViewScope,
) -> EngineResult<OpenView> {
    let rho = request.rho();
    let labels = {
        let book = ds.book_read();
        check_budget(ds, &book, rho)?;
        if scope == ViewScope::Dataset {
            check_labels(ds, &book, request.by_group)?;
        }
        request.by_group.then(|| book.labels.clone())
    };
    // Everyone else fits by the same rule on this same state, so only the
    // incomplete-step check of `check_charge` remains (its `O(n)` count
    // would be 0); the commit checks again after later steps.
    ledger.check_release()?;
    let left_out = ledger.release_left_out(&rdp_of_rho(ledger.orders(), rho));
    if scope == ViewScope::Dataset {
        check_leaves_someone_in(ledger.examples(), left_out.len() as u64)?;
    }
    let delta = request.delta.unwrap_or(ledger.config().delta);
    let rdp_worst = ledger.worst_case(delta, Conversion::default())?;
    let pld_at = (ledger.next_step(), ledger.releases());
    let pld_cached = ds.pld_cached(pld_at, delta);
    let pld_events = match pld_cached {
        Some(_) => None,
        None => ledger.pld_events(),
    };
    let token = ledger.open_view(delta, Conversion::default())?;
    Ok(OpenView {
        ds: ds.clone(),
        token,
        delta,
        rdp_worst,
        pld_at,
        pld_cached,
        pld_events,
        labels,
        examples: ledger.examples() as usize,
        left_out,
        open: true,
        key: None,
    })
}

/// The epsilon pass of a release: every example's epsilon from the view, in
/// order, in chunks of [`CHUNK`] under the read lock, bounded by the PLD
/// worst case.
struct EpsilonPass {
    ds: Arc<Dataset>,
    /// The server's runtime, whose blocking pool reads a chunk when there is
    /// no gap between steps (`read_chunk`).
    runtime: tokio::runtime::Handle,
    /// Chunks read that way (also counted in
    /// `dpledger_release_chunks_queued_total`).
    queued: std::sync::atomic::AtomicUsize,
    token: ViewToken,
    examples: usize,
    pld_epsilon: Option<f64>,
}

impl EpsilonPass {
    /// Append the view's epsilons of the chunk starting at `start`. The read
    /// lock is taken between steps: this idle-priority thread only *tries* it
    /// (a reader queued at idle priority would hold up every step queued behind
    /// it until the scheduler runs this thread again, which under full load may
    /// take long). After [`LOCK_PATIENCE`] of failed tries (steps so close
    /// together that there is no gap: the release must still progress) the
    /// chunk is read by a thread of tokio's blocking pool, at normal priority,
    /// which queues for the lock like any request and releases it promptly.
    fn read_chunk(&self, start: usize, out: &mut Vec<f64>) -> EngineResult<()> {
        let range = start..start + CHUNK;
        let started = std::time::Instant::now();
        while started.elapsed() <= LOCK_PATIENCE {
            if let Ok(ledger) = self.ds.ledger.try_read() {
                return ledger
                    .view_epsilons(self.token, range, out)
                    .map_err(|_| reloaded());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        self.queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("dpledger_release_chunks_queued_total").increment(1);
        let (ds, token) = (self.ds.clone(), self.token);
        let chunk = self.runtime.spawn_blocking(move || {
            let mut chunk = Vec::with_capacity(CHUNK);
            let ledger = ds.ledger.blocking_read();
            ledger
                .view_epsilons(token, range, &mut chunk)
                .map(|()| chunk)
        });
        let chunk = self
            .runtime
            .block_on(chunk)
            .map_err(|e| EngineError::Internal(format!("a release's read stopped: {e}")))?
            .map_err(|_| reloaded())?;
        out.extend_from_slice(&chunk);
        Ok(())
    }

    fn run(&self) -> EngineResult<Vec<f64>> {
        let mut epsilons = Vec::with_capacity(self.examples);
        for start in (0..self.examples).step_by(CHUNK) {
            self.read_chunk(start, &mut epsilons)?;
        }
        for e in &mut epsilons {
            *e = capped_value(*e, self.pld_epsilon);
        }
        Ok(epsilons)
    }
}

/// The view was lost: the dataset was reloaded from the log meanwhile.
fn reloaded() -> EngineError {
    EngineError::Unavailable(
        "the dataset was reloaded from the log while the release was computed: retry".to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DatasetSetup;
    use crate::ledger::{DatasetConfig, StepReport};

    /// When steps leave no gap (here: a writer holds the lock for 200 ms), the
    /// pass hands its chunk to a normal-priority thread that queues for the
    /// lock, and still reads the view exactly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pass_without_a_gap_between_steps_queues_on_a_normal_thread() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("db").display());
        let engine = Engine::recover(crate::store::open(&url).unwrap()).unwrap();
        let config = DatasetConfig::poisson(1000, 0.1, 1.0, 1.0, 1e-5);
        let ds = engine
            .create_dataset("d", config, DatasetSetup::default(), None)
            .await
            .unwrap();
        let report = StepReport::new(0, vec![0, 1, 2], vec![0.5, 2.0, 0.1]);
        engine.report_step("d", report).await.unwrap();
        let (token, want) = {
            let mut ledger = ds.ledger.write().await;
            let token = ledger.open_view(1e-5, Conversion::default()).unwrap();
            (
                token,
                ledger.all_epsilons(1e-5, Conversion::default()).unwrap(),
            )
        };
        let pass = EpsilonPass {
            ds: ds.clone(),
            runtime: tokio::runtime::Handle::current(),
            queued: Default::default(),
            token,
            examples: 1000,
            pld_epsilon: None,
        };
        let writer = ds.ledger.write().await;
        let started = std::time::Instant::now();
        let pass = std::thread::spawn(move || {
            let got = pass.run();
            (got, pass.queued.into_inner())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(writer);
        let (got, queued) = tokio::task::spawn_blocking(move || pass.join().unwrap())
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(got.unwrap(), want);
        assert_eq!(queued, 1, "the first chunk queued on a normal thread");
    }
}

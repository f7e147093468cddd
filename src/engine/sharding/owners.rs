//! Releases and release budgets of a sharded dataset (`docs/sharding.md`,
//! "Releases"): one change charged to
//! every shard or to none.
//!
//! 1. **Prepare** (each shard's owner, [`Engine::prepare_shard_change`]): a task
//!    takes the shard's release turn; a release's sufficient statistics
//!    ([`ReleaseSummary`](crate::release::ReleaseSummary)) are computed from a view of the ledger at one step
//!    (the coordinator's `at`) while steps flow (`prepare.rs`); then it
//!    takes the ledger's write lock (the shard's steps and other writes wait),
//!    checks the change against the shard as it is (budget, pending parts,
//!    retirements) and answers with its epoch, the view's step, its budget and
//!    the statistics. It then holds the lock until the change is decided, at
//!    most `wait`.
//! 2. **Commit** (the coordinating node, `engine::sharding`, through
//!    `Engine::commit_each_across`, `commit.rs`): the mechanism runs once on the merged
//!    statistics (`sharding::release_of_shards`), then one PostgreSQL transaction inserts the
//!    decision `commit` and one record per shard, each fenced by the epoch its
//!    owner prepared under.
//! 3. **Decide** (each owner, [`Engine::decide_shard_change`], when the
//!    coordinator asks or its wait runs out): the owner asks PostgreSQL for the
//!    decision, writing `abort` unless one exists
//!    ([`ClusterDb::decide`](crate::store::cluster::ClusterDb::decide)), so
//!    exactly one of commit and abort is ever recorded. On `commit` it applies
//!    its own log's records after the last it had (read from PostgreSQL, not
//!    from the coordinator's message), then lets its writes go.
//!
//! A takeover replays the log, where a committed change's record is like any
//! other; an uncommitted one is not there and never will be (the decision is
//! `abort` or the fence refused it).

use super::protocol::{Decision, Prepared, ShardChange};
use crate::engine::book::{apply_release, apply_setting, export_gauges, parse_release};
use crate::engine::cluster::ClusterNode;
use crate::engine::dataset::Dataset;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::store::{RecordKind, StoredRecord};
use dashmap::DashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::sync::RwLockWriteGuard;

/// What a shard's prepare gives its holder.
pub(super) enum Ready<'a> {
    /// Prepared: the write lock, kept until the change is decided, and the
    /// answer.
    Held(RwLockWriteGuard<'a, Ledger>, Prepared),
    /// Not prepared at the step asked (the shard is past it, or did not reach
    /// it in time): its step, no statistics, nothing held.
    Passed(Prepared),
}

/// Prepared changes this node's shards hold, by shard and change id: how to hand the
/// holder the coordinator's request for the decision.
pub(crate) type Held = DashMap<String, oneshot::Sender<oneshot::Sender<Decision>>>;

/// How long a prepare waits for its shard's release turn.
const TURN_WAIT: Duration = Duration::from_secs(1);

/// What a held change's wait for its decision grows by per example of the
/// shard: 1 s per 10^6 examples, five times a statistics pass's cost.
const HOLD_PER_EXAMPLE: Duration = Duration::from_micros(1);

/// The key of a held change: one node may own several shards of a dataset.
fn held_key(shard: &str, id: &str) -> String {
    format!("{shard}/{id}")
}

impl Engine {
    pub(super) fn node(&self) -> EngineResult<Arc<ClusterNode>> {
        self.cluster()
            .cloned()
            .ok_or_else(|| EngineError::conflict("sharded datasets exist only in cluster mode"))
    }

    /// Prepare change `id` on shard `shard` (served here) and hold its writes
    /// until the change is decided, at most `wait` (module note, step 1). A
    /// release describes step `at` (the shard's current step when `None`); a
    /// shard that cannot describe it answers its step without statistics and
    /// holds nothing.
    pub async fn prepare_shard_change(
        &self,
        shard: &str,
        id: &str,
        change: ShardChange,
        at: Option<u64>,
        wait: Duration,
    ) -> EngineResult<Prepared> {
        let node = self.node()?;
        if super::parse_shard_id(shard).is_none() {
            return Err(EngineError::conflict(format!("{shard:?} is not a shard")));
        }
        let ds = self.dataset(shard)?;
        let (decide_tx, decide_rx) = oneshot::channel();
        match self.sharding.held.entry(held_key(shard, id)) {
            dashmap::mapref::entry::Entry::Occupied(_) => {
                return Err(EngineError::conflict(format!(
                    "change {id:?} is already prepared here"
                )))
            }
            dashmap::mapref::entry::Entry::Vacant(v) => {
                v.insert(decide_tx);
            }
        }
        let (ready_tx, ready_rx) = oneshot::channel();
        let engine = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            engine
                .hold(node, ds, id, (change, at), ready_tx, decide_rx, wait)
                .await;
        });
        ready_rx
            .await
            .map_err(|_| EngineError::Internal("a prepare stopped".into()))?
    }

    /// The holder of a prepared change (module note, steps 1 and 3).
    #[allow(clippy::too_many_arguments)]
    async fn hold(
        &self,
        node: Arc<ClusterNode>,
        ds: Arc<Dataset>,
        id: String,
        (change, at): (ShardChange, Option<u64>),
        ready: oneshot::Sender<EngineResult<Prepared>>,
        decide: oneshot::Receiver<oneshot::Sender<Decision>>,
        wait: Duration,
    ) {
        let key = held_key(&ds.id, &id);
        // Two changes preparing the same shards in different orders would
        // each wait for the other's hold: the second gives up at once.
        let turn = tokio::time::timeout(TURN_WAIT, ds.release_turn.clone().lock_owned()).await;
        let Ok(_turn) = turn else {
            self.sharding.held.remove(&key);
            let _ = ready.send(Err(EngineError::Unavailable(format!(
                "another release or budget change of {:?} is in progress: retry",
                ds.id
            ))));
            return;
        };
        let prepared = match &change {
            ShardChange::Release(request) => self.prepare_release(&ds, request, at).await,
            _ => self.prepare_setting(&ds, &change, at).await,
        };
        let mut ledger = match prepared {
            Ok(Ready::Held(ledger, p)) => {
                // A coordinator gone meanwhile changes nothing: the decision
                // is still asked of PostgreSQL below.
                let _ = ready.send(Ok(p));
                ledger
            }
            Ok(Ready::Passed(p)) => {
                self.sharding.held.remove(&key);
                let _ = ready.send(Ok(p));
                return;
            }
            Err(e) => {
                self.sharding.held.remove(&key);
                let _ = ready.send(Err(e));
                return;
            }
        };
        // The coordinator waits for the slowest shard's statistics pass
        // (about 0.2 s per 10^6 examples, shards of one dataset are near
        // equal in size), then commits: the hold grows with the shard so that
        // large shards do not abort every release while others still read.
        let wait = wait + HOLD_PER_EXAMPLE.mul_f64(ledger.config().examples as f64);
        let asker = tokio::time::timeout(wait, decide)
            .await
            .ok()
            .and_then(Result::ok);
        self.sharding.held.remove(&key);
        let mut backoff = Duration::from_millis(50);
        let decision = loop {
            match node.changes.decide(&id).await {
                Ok(d) => break Decision::from(d),
                Err(e) => {
                    // Undecided: the writes stay held (a commit may still land)
                    // unless the shard left this node, whose successor replays
                    // the log.
                    if !self.serves(&ds.id) {
                        // Still under the write lock: whatever the outcome, no
                        // step may run on this memory, which may lack a
                        // committed charge (a renewal that returns the lease
                        // later must reload from the log, not serve this copy).
                        ds.mark_stale();
                        let _ = self.lose(&ds);
                        return;
                    }
                    tracing::warn!(dataset = %ds.id, change = %id, error = %e, "cannot decide a change across shards yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        };
        if decision == Decision::Committed {
            if let Err(e) = self.apply_tail(&ds, &mut ledger).await {
                tracing::error!(dataset = %ds.id, change = %id, error = %e, "a committed change did not apply: reloading from the log");
                // Stale before the lock is released: a step queued behind it
                // must not run on memory without the committed charge.
                self.heal(&ds);
                drop(ledger);
            }
        }
        if let Some(asker) = asker {
            let _ = asker.send(decision);
        }
    }

    /// Prepare a change that is not a release under the write lock, once no
    /// multi-part step is incomplete (the change cannot land inside one) and,
    /// with `at`, at step `at` only: a shard at another step answers its step
    /// and holds nothing (the coordinator tries again at one step).
    async fn prepare_setting<'a>(
        &self,
        ds: &'a Arc<Dataset>,
        change: &ShardChange,
        at: Option<u64>,
    ) -> EngineResult<Ready<'a>> {
        let since = std::time::Instant::now();
        let mut ledger = self.lock_when_ready(ds, at, since).await?;
        let prepared = self.prepare_locked(ds, &mut ledger, change).await?;
        if at.is_some_and(|t| t != prepared.step) {
            return Ok(Ready::Passed(prepared));
        }
        Ok(Ready::Held(ledger, prepared))
    }

    async fn prepare_locked(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
        change: &ShardChange,
    ) -> EngineResult<Prepared> {
        self.locked_checks(ds, ledger).await?;
        let (budget, names) = {
            let book = ds.book_read();
            (book.budget, book.labels.names().to_vec())
        };
        let epoch = ds.epoch.load(std::sync::atomic::Ordering::Acquire);
        let step = ledger.next_step();
        let release = match change {
            ShardChange::Policy(_) => None,
            ShardChange::Budget(rho) => {
                if *rho < budget.rho_spent {
                    return Err(EngineError::Conflict {
                        detail: format!(
                            "the budget cannot drop below what releases already spent (rho = {})",
                            budget.rho_spent
                        ),
                        field: Some("rho"),
                    });
                }
                None
            }
            ShardChange::Labels | ShardChange::Archive => None,
            // Prepared from a view (`prepare.rs`), never here.
            ShardChange::Release(_) => {
                return Err(EngineError::Internal(
                    "a release is prepared from a view".into(),
                ))
            }
        };
        Ok(Prepared {
            epoch,
            step,
            budget,
            release,
            labels: names,
        })
    }

    /// Apply the shard's records that are in the log but not in memory (a
    /// committed change's), read from the log itself.
    async fn apply_tail(&self, ds: &Arc<Dataset>, ledger: &mut Ledger) -> EngineResult<()> {
        let store = self.store.clone();
        let (id, after) = (
            ds.id.clone(),
            ds.last_seq.load(std::sync::atomic::Ordering::Acquire),
        );
        let tail = tokio::task::spawn_blocking(move || {
            let mut tail: Vec<StoredRecord> = Vec::new();
            let loaded = store.load_dataset(&id, after, &mut |r| {
                tail.push(r);
                Ok(())
            });
            loaded.map(|_| tail)
        })
        .await
        .map_err(|_| EngineError::Internal("reading the log stopped".into()))?
        .map_err(EngineError::store)?;
        for stored in tail {
            let rec = &stored.record;
            let mut book = ds.book_write();
            match rec.kind {
                RecordKind::Release => {
                    let (release, left_out) =
                        parse_release(&rec.payload).map_err(EngineError::Internal)?;
                    apply_release(ledger, &mut book, release, &left_out)
                        .map_err(EngineError::Internal)?;
                    metrics::counter!("dpledger_releases_total").increment(1);
                }
                RecordKind::Archived => {
                    ds.archived
                        .store(true, std::sync::atomic::Ordering::Release);
                }
                RecordKind::BudgetChange | RecordKind::ReleasePolicy | RecordKind::Labels => {
                    apply_setting(ledger, &mut book, rec.kind, &rec.payload)
                        .map_err(EngineError::Internal)?;
                }
                other => {
                    return Err(EngineError::Internal(format!(
                        "an unexpected {other:?} record in the log"
                    )))
                }
            }
            export_gauges(&ds.id, &book);
            drop(book);
            ds.note_records(&[stored.seq], &[(rec.kind, &rec.payload)]);
        }
        Ok(())
    }

    /// Ask this node's holder of change `id` on `shard` to decide it now;
    /// when none holds it (decided already, or never prepared here), the
    /// decision as PostgreSQL has it (an undecided change is aborted).
    pub async fn decide_shard_change(&self, shard: &str, id: &str) -> EngineResult<Decision> {
        let node = self.node()?;
        if super::parse_shard_id(shard).is_none() {
            return Err(EngineError::conflict(format!("{shard:?} is not a shard")));
        }
        if let Some((_, holder)) = self.sharding.held.remove(&held_key(shard, id)) {
            let (tx, rx) = oneshot::channel();
            if holder.send(tx).is_ok() {
                if let Ok(d) = rx.await {
                    return Ok(d);
                }
            }
        }
        node.changes
            .decide(id)
            .await
            .map(Decision::from)
            .map_err(EngineError::store)
    }
}

//! A sharded dataset's policy releases (`docs/sharding.md`, "Release
//! policies"): no shard releases on its own; the owner of the dataset's first
//! shard, when its part of a step leaves it at a due step
//! ([`Engine::shard_policy_step`], under the shard's write lock), runs the curator's cross-shard release with
//! trigger `policy` on a task, at most one per dataset at a time; releases
//! falling due meanwhile coalesce into one deferred release, as for an
//! unsharded dataset (`engine::policy`). Its outcome (a refusal, say budget
//! spent) is kept in the first shard's book. A policy release has no caller:
//! its calls to other owners carry no credential (the node's own).

use super::coordinator::Coordinator;
use crate::engine::dataset::Dataset;
use crate::engine::error::{BudgetRefusal, EngineError, EngineResult};
use crate::engine::shard_names::{parse_shard_id, shard_id};
use crate::engine::Engine;
use crate::ledger::{IdempotencyKey, Ledger};
use crate::release::ReleaseTrigger;
use std::sync::Arc;
use std::time::Duration;

/// Tries of one policy release while the answer is retryable (another
/// release holds a shard's turn, an owner is moving, the shards stay apart).
const TRIES: u32 = 6;

impl Engine {
    /// Shard 0 of sharded dataset `dataset` applied its part of a due step:
    /// start its policy release on a task of its own, or defer one behind the
    /// release in flight. Returns at once (it is called with shard 0's write
    /// lock held).
    pub(in crate::engine) fn sharded_policy_due(&self, dataset: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let slots = &self.sharding.policy_slots;
            let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(deferred) = slots.get_mut(dataset) {
                // One in flight: defer one behind it; later ones coalesce.
                if std::mem::replace(deferred, true) {
                    metrics::counter!("dpledger_policy_releases_coalesced_total").increment(1);
                }
                return;
            }
            slots.insert(dataset.to_string(), false);
        }
        runtime.spawn(self.clone().run_sharded_policy(dataset.to_string()));
    }

    /// The release due, then each deferred one, until none is left.
    async fn run_sharded_policy(self, dataset: String) {
        let mut slot = SlotGuard {
            engine: self.clone(),
            dataset: dataset.clone(),
            armed: true,
        };
        loop {
            let outcome = self.policy_attempt(&dataset).await;
            self.note_shard_policy_outcome(&shard_id(&dataset, 0), outcome);
            let mut slots = self
                .sharding
                .policy_slots
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match slots.get_mut(&dataset) {
                Some(d) if *d => *d = false,
                _ => {
                    // Freed under the same lock that `sharded_policy_due`
                    // takes, so that a release falling due now starts a task
                    // of its own.
                    slots.remove(&dataset);
                    slot.armed = false;
                    return;
                }
            }
        }
    }

    /// One policy release of sharded dataset `dataset`: `Ok(true)` released,
    /// `Ok(false)` nothing to do (no policy any more; a deferred release with
    /// no step since the last policy release; the first shard handed over),
    /// or the refusal to record.
    async fn policy_attempt(&self, dataset: &str) -> EngineResult<bool> {
        if self.cluster().is_none() {
            return Err(EngineError::conflict(
                "sharded datasets exist only in cluster mode",
            ));
        }
        let layout = self
            .layout_of(dataset)
            .await?
            .ok_or_else(|| EngineError::Internal(format!("{dataset:?} has no shard layout")))?;
        let first = layout.shard_dataset(0);
        let Some(policy) = self.with_book(&first, |b| b.policy.clone())? else {
            return Ok(false);
        };
        // A deferred release with no step since the last policy release has
        // nothing new to describe; a due one finds none at its step (unless a
        // former owner of the first shard released it while handing over).
        if self.policy_released_at_now(&first).await? {
            return Ok(false);
        }
        // No caller: the calls are the node's own.
        let coordinator = self.coordinate(layout, None)?;
        // Stored with the release, so that a retry after an unknown outcome
        // finds it rather than charging twice.
        let name = format!("release-policy-{}", super::protocol::new_change_id());
        let key = Some(IdempotencyKey {
            request: name.as_bytes().to_vec(),
            key: name,
            answer: Vec::new(),
        });
        let mut pause = Duration::from_millis(100);
        for tried in 1..=TRIES {
            // The coordinator is the first shard's owner: one that handed
            // the shard over stops here, so that two nodes never run one
            // dataset's policy releases side by side (the new owner releases
            // at the next due step).
            if !self.serves(&first) {
                return Ok(false);
            }
            if tried > 1 {
                if let Ok(Some(_)) = coordinator.stored_answer(&key).await {
                    return Ok(true);
                }
            }
            let refusal = match release(&coordinator, &policy.request, &key).await {
                Ok(()) => return Ok(true),
                Err(e) => e,
            };
            let retryable = refusal.is_retryable();
            let refusal = as_recorded(refusal);
            if !retryable || tried == TRIES {
                return Err(refusal);
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        Ok(false)
    }
}

/// One try of the policy's release.
async fn release(
    coordinator: &Coordinator,
    request: &crate::release::ReleaseRequest,
    key: &Option<IdempotencyKey>,
) -> EngineResult<()> {
    coordinator
        .release_across(request, key.clone(), ReleaseTrigger::Policy)
        .await
        .map(|_| ())
}

/// A refused policy release as the first shard's book keeps it: a budget
/// refusal with its numbers; otherwise, in the refusal's words, unavailability
/// when the server's side failed and a conflict when the release itself was
/// refused (viewers read only the data-independent reason of either).
fn as_recorded(e: EngineError) -> EngineError {
    let (retryable, detail, budget) = match e {
        EngineError::OverBudget { .. } => return e,
        EngineError::Peer(ref p) => {
            let body = p.json();
            let budget = &body["budget"];
            let refusal = budget["rho_requested"]
                .as_f64()
                .map(|rho_requested| BudgetRefusal {
                    rho_spent: budget["rho_spent"].as_f64().unwrap_or(0.0),
                    rho_requested,
                    rho_budget: budget["rho_budget"].as_f64(),
                });
            (e.is_retryable(), e.to_string(), refusal)
        }
        ref other => (other.is_retryable(), other.to_string(), None),
    };
    if let Some(refusal) = budget {
        return EngineError::OverBudget { detail, refusal };
    }
    if retryable {
        EngineError::Unavailable(detail)
    } else {
        EngineError::Conflict {
            detail,
            field: None,
        }
    }
}

/// Removes a dataset's policy slot when its task ends other than by
/// returning (a panic): later due steps then start releases again.
struct SlotGuard {
    engine: Engine,
    dataset: String,
    armed: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let slots = &self.engine.sharding.policy_slots;
        let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(&self.dataset);
    }
}

// The owners' side: a shard's step tells whether the dataset's policy is due.
impl Engine {
    /// Whether the newest release of `shard` (served here) is a policy
    /// release of the step its ledger is at: a deferred policy release is
    /// then skipped, as an unsharded one is (it would spend budget on the
    /// same numbers).
    pub async fn policy_released_at_now(&self, shard: &str) -> EngineResult<bool> {
        let ds = self.dataset(shard)?;
        let ledger = self.read_ledger(&ds).await?;
        let newest = ds.book_read().history.last().map(|r| (r.step, r.trigger));
        Ok(newest == Some((ledger.next_step(), ReleaseTrigger::Policy)))
    }

    /// After a completed step of `ds`, with its write lock held: whether `ds`
    /// is a shard (then the dataset's policy is the coordinator's business,
    /// never the shard's own: `true`, and for shard 0 at a due step the
    /// release starts). `false` for an ordinary dataset, whose policy releases on
    /// its own (`policy.rs`).
    pub(in crate::engine) fn shard_policy_step(&self, ds: &Arc<Dataset>, ledger: &Ledger) -> bool {
        if self.cluster.is_none() {
            return false;
        }
        let Some((dataset, start)) = parse_shard_id(&ds.id) else {
            return false;
        };
        if start != 0 {
            return true;
        }
        let every = match &ds.book_read().policy {
            Some(p) => p.every_steps,
            None => return true,
        };
        let step = ledger.next_step();
        if every == 0 || step % every != 0 {
            return true;
        }
        self.sharded_policy_due(dataset);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sharding::PeerRefusal;

    #[test]
    fn refusals_are_recorded_as_before() {
        let peer = |status: u16, body: &str| {
            EngineError::Peer(PeerRefusal {
                status,
                content_type: None,
                retry_after: None,
                body: body.as_bytes().to_vec(),
            })
        };
        let over = as_recorded(peer(
            409,
            r#"{"detail":"no budget","budget":{"rho_spent":1.0,"rho_requested":2.0,"rho_budget":2.5}}"#,
        ));
        assert!(matches!(
            over,
            EngineError::OverBudget { ref detail, ref refusal }
                if detail == "no budget" && refusal.rho_budget == Some(2.5)
        ));
        assert!(matches!(
            as_recorded(peer(503, r#"{"detail":"moving"}"#)),
            EngineError::Unavailable(ref d) if d == "moving"
        ));
        assert!(matches!(
            as_recorded(EngineError::WouldRetire { would_retire: 3 }),
            EngineError::Conflict { field: None, .. }
        ));
        assert!(matches!(
            as_recorded(EngineError::ShardsApart("apart".into())),
            EngineError::Unavailable(ref d) if d == "apart"
        ));
    }
}

//! Release policies of a sharded dataset (`docs/sharding.md`
//! "Release policies"): the engine's side.
//!
//! The policy is a `ReleasePolicy` record in every shard's log, written by the
//! cross-shard protocol (`shard_release.rs`, [`ShardChange::Policy`]) or with
//! each shard's creation, so every shard's book holds the same policy. No shard
//! releases on its own: one coordinator sees the due step. The owner of the
//! dataset's first shard (`{dataset}~0`), when its part of a step leaves it at
//! a multiple of `every_steps`, starts a cross-shard release with trigger
//! `policy` on a task of its own (`engine::sharding`'s policy coordinator; the
//! step is never delayed).
//!
//! [`ShardChange::Policy`]: super::shard_release::ShardChange::Policy

use super::parse_shard_id;
use crate::engine::dataset::Dataset;
use crate::engine::error::EngineResult;
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::release::ReleaseTrigger;
use std::sync::Arc;

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

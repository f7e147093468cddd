//! Datasets leave memory when idle: a dataset nobody has
//! touched for a while (sooner when archived) is written to a snapshot if it
//! changed since its last one, then its ledger is dropped, keeping only a
//! placeholder of a single example (tens of kilobytes, the prefix-sum base of
//! one segment, against 526 bytes per example). The release book stays, so
//! viewers still read releases without loading anything. The next request
//! that needs the ledger loads it back from the newest snapshot and the log
//! after it (the same path as a reload), under the write lock; readers then go
//! on as before.
//!
//! What may be dropped is decided under the write lock: every record of the
//! dataset must be in a snapshot (the log is the truth either way, so a missing
//! or damaged snapshot only makes loading slower), no release may be computing
//! from a view, and no snapshot may be in progress.

use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::ledger::Ledger;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::RwLockReadGuard;

/// When idle datasets leave memory (zero: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagingPolicy {
    /// An active dataset untouched this long is paged out.
    pub idle: Duration,
    /// An archived dataset untouched this long is paged out.
    pub archived_idle: Duration,
}

impl Default for PagingPolicy {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(1800),
            archived_idle: Duration::from_secs(30),
        }
    }
}

impl PagingPolicy {
    /// How long `ds` may stay idle in memory (`None`: forever).
    fn limit(&self, ds: &Dataset) -> Option<Duration> {
        let d = if ds.is_archived() {
            self.archived_idle
        } else {
            self.idle
        };
        (!d.is_zero()).then_some(d)
    }
}

impl Engine {
    /// The dataset's ledger for reading, loaded back first if it was paged
    /// out; refused while memory may be behind the log.
    pub(super) async fn read_ledger<'a>(
        &self,
        ds: &'a Arc<Dataset>,
    ) -> EngineResult<RwLockReadGuard<'a, Ledger>> {
        ds.touch();
        loop {
            ds.check_current()?;
            if !ds.is_paged_out() {
                let ledger = ds.ledger.read().await;
                if !ds.is_paged_out() {
                    return Ok(ledger);
                }
                continue; // paged out meanwhile (it was idle): load it again
            }
            let mut ledger = ds.ledger.write().await;
            self.page_in(ds, &mut ledger).await?;
        }
    }

    /// Load a paged-out dataset back; the caller holds its write lock. Nothing
    /// to do if it is in memory.
    pub(super) async fn page_in(&self, ds: &Dataset, ledger: &mut Ledger) -> EngineResult<()> {
        if !ds.is_paged_out() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        self.reload_into(ds, ledger).await?;
        ds.paged_out.store(false, Ordering::Release);
        metrics::counter!("dpledger_page_ins_total").increment(1);
        tracing::info!(
            dataset = ds.id,
            seconds = started.elapsed().as_secs_f64(),
            "dataset loaded back into memory"
        );
        Ok(())
    }

    /// Page out `id` now if it may be (see the module note), snapshotting it
    /// first if it changed. Returns whether it left memory.
    pub async fn page_out(&self, id: &str, keep: usize) -> EngineResult<bool> {
        let ds = self.dataset(id)?;
        if ds.is_paged_out() {
            return Ok(false);
        }
        if ds.snapshot_mark().records_since > 0 {
            self.snapshot(id, keep).await?;
        }
        if let Err(e) = self.ensure_archive(&ds).await {
            // Its owners' queries will load the ledger instead.
            tracing::warn!(dataset = id, error = %e, "cannot write the archive");
        }
        let Ok(_turn) = ds.release_turn.try_lock() else {
            return Ok(false); // a release is computing from a view
        };
        let mut ledger = ds.ledger.write().await;
        let mark = *ds.snapshot_mark();
        let covered = mark.records_since == 0
            && mark.seq > 0
            && mark.seq == ds.last_seq.load(Ordering::Acquire);
        if !covered
            || ds.stale.load(Ordering::Acquire)
            || ds.snapshot_busy.load(Ordering::Acquire)
            || ledger.has_view()
        {
            return Ok(false);
        }
        let before = ledger.memory_bytes();
        *ds.paged_out_size.lock().unwrap_or_else(|e| e.into_inner()) =
            (ledger.examples(), ledger.next_step());
        *ledger = ledger.placeholder().map_err(EngineError::from)?;
        ds.clear_caches();
        ds.paged_out.store(true, Ordering::Release);
        drop(ledger);
        tokio::task::spawn_blocking(super::allocator::return_free_memory);
        metrics::counter!("dpledger_page_outs_total").increment(1);
        tracing::info!(
            dataset = ds.id,
            freed_bytes = before,
            archived = ds.is_archived(),
            "idle dataset paged out"
        );
        Ok(true)
    }

    /// Page out every dataset idle for longer than `policy` allows. Failures
    /// are logged; the dataset stays in memory and is tried again later.
    pub async fn page_out_idle(&self, policy: PagingPolicy, keep: usize) -> usize {
        let idle: Vec<String> = self
            .datasets
            .iter()
            .filter(|e| {
                let ds = e.value();
                !ds.is_paged_out() && policy.limit(ds).is_some_and(|d| ds.idle_for() >= d)
            })
            .map(|e| e.key().clone())
            .collect();
        let mut paged = 0;
        for id in idle {
            match self.page_out(&id, keep).await {
                Ok(true) => paged += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(dataset = id, error = %e, "page-out failed; will retry"),
            }
        }
        paged
    }
}

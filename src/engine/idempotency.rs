//! Changes that are safe to retry: a change sent with an
//! idempotency key is stored with it (`store::idempotency`), and a retry with
//! the same key and the same request finds the change already made and is
//! answered from it, never applied again; the same key with another request is
//! refused. And when a commit's outcome is unknown, the dataset is reloaded
//! from the log in the background at once (with backoff while the store is
//! down), so that reads recover without waiting for the next write.

use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::ledger::{IdempotencyKey, Ledger};
use crate::store::{Record, StoreError, StoredKey};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// First wait before a failed background reload is tried again.
const HEAL_FIRST_WAIT: Duration = Duration::from_millis(25);
/// Longest wait between background reloads while the store is down: reads
/// recover within about this long of the store answering again.
const HEAL_MAX_WAIT: Duration = Duration::from_millis(400);

/// What persisting a keyed change came to.
pub(super) enum Persisted {
    /// The records are stored (the caller applies them).
    Stored,
    /// An earlier try with this key is stored (another process's, or one whose
    /// outcome was unknown): memory now holds it; answer from it.
    Done(StoredKey),
}

impl Engine {
    /// The change `key` already made to `ds`, if any; the caller holds the
    /// dataset's write lock and made its locked checks. The same key with
    /// another request is [`EngineError::KeyReused`]. When the change is not in
    /// memory yet (another process made it, or a commit whose outcome this
    /// process did not learn), the dataset is reloaded from the log first.
    pub(super) async fn prior_change(
        &self,
        ds: &Dataset,
        ledger: &mut Ledger,
        key: Option<&IdempotencyKey>,
    ) -> EngineResult<Option<StoredKey>> {
        let Some(key) = key else { return Ok(None) };
        let Some(found) = self.find_key(&ds.id, &key.key).await? else {
            return Ok(None);
        };
        if found.request != key.request {
            return Err(EngineError::KeyReused {
                key: key.key.clone(),
            });
        }
        if found.seq > ds.last_seq.load(Ordering::Acquire) {
            self.reload_into(ds, ledger).await?;
            ds.stale.store(false, Ordering::Release);
        }
        Ok(Some(found))
    }

    /// For a keyed change, before anything refuses it (an archived dataset
    /// included): the change `key` already made, with memory brought up to the
    /// log first. The caller holds the write lock.
    pub(super) async fn replayed(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
        key: Option<&IdempotencyKey>,
    ) -> EngineResult<Option<StoredKey>> {
        if key.is_none() {
            return Ok(None);
        }
        self.catch_up(ds, ledger).await?;
        self.prior_change(ds, ledger, key).await
    }

    /// The key as stored for `dataset`, read on a blocking thread.
    pub(super) async fn find_key(
        &self,
        dataset: &str,
        key: &str,
    ) -> EngineResult<Option<StoredKey>> {
        let store = self.store.clone();
        let (dataset, key) = (dataset.to_string(), key.to_string());
        tokio::task::spawn_blocking(move || store.find_key(&dataset, &key))
            .await
            .map_err(|_| EngineError::Internal("the key lookup task failed".to_string()))?
            .map_err(|e| {
                tracing::error!(error = %e, "reading an idempotency key failed");
                EngineError::Unavailable(
                    "the store could not be read to check the Idempotency-Key; nothing was \
                     applied: retry"
                        .to_string(),
                )
            })
    }

    /// Persist a change to `ds` with its key (the caller holds the write lock).
    /// A key stored meanwhile (a retry racing an earlier try whose commit was
    /// still in flight, or another process) is answered from the stored change.
    pub(super) async fn persist_keyed(
        &self,
        ds: &Dataset,
        ledger: &mut Ledger,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<Persisted> {
        let lookup = key.clone();
        match self.persist_change(ds, records, key).await {
            Ok(()) => Ok(Persisted::Stored),
            Err(EngineError::Store(e @ StoreError::KeyUsed { .. })) => {
                match self.prior_change(ds, ledger, lookup.as_ref()).await? {
                    Some(done) => Ok(Persisted::Done(done)),
                    None => Err(EngineError::Store(e)),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Mark `ds` as possibly behind the log and reload it in the background at
    /// once (reads are refused until memory matches the log again), retrying
    /// with backoff while the store cannot be read. One healer per dataset.
    pub(super) fn heal(&self, ds: &Dataset) {
        ds.mark_stale();
        if ds.healing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            ds.healing.store(false, Ordering::Release);
            return;
        };
        let engine = self.clone();
        let id = ds.id.clone();
        runtime.spawn(async move {
            let mut wait = HEAL_FIRST_WAIT;
            loop {
                let Ok(ds) = engine.dataset(&id) else { return };
                let ds: Arc<Dataset> = ds;
                let healed = {
                    let mut ledger = ds.ledger.write().await;
                    if !ds.stale.load(Ordering::Acquire) {
                        true
                    } else {
                        match engine.reload_into(&ds, &mut ledger).await {
                            Ok(()) => {
                                ds.stale.store(false, Ordering::Release);
                                ds.paged_out.store(false, Ordering::Release);
                                tracing::info!(dataset = %id, "reloaded from the log");
                                true
                            }
                            Err(EngineError::NotFound(_)) => {
                                // A creation whose outcome was unknown did not land.
                                engine.forget_uncreated(&ds);
                                true
                            }
                            Err(e) => {
                                tracing::warn!(dataset = %id, error = %e, retry_in_ms = wait.as_millis() as u64, "reloading from the log failed");
                                false
                            }
                        }
                    }
                };
                if healed {
                    ds.healing.store(false, Ordering::Release);
                    // A failure between the flag's release and here re-arms a healer.
                    if ds.stale.load(Ordering::Acquire) && !ds.healing.load(Ordering::Acquire) {
                        engine.heal(&ds);
                    }
                    return;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(HEAL_MAX_WAIT);
            }
        });
    }

    /// Forget a dataset whose creation's outcome was unknown and that the log
    /// does not hold: it was never created.
    pub(super) fn forget_uncreated(&self, ds: &Arc<Dataset>) {
        let removed = self.datasets.remove_if(&ds.id, |_, d| Arc::ptr_eq(d, ds));
        if removed.is_some() {
            tracing::warn!(dataset = %ds.id, "a creation whose outcome was unknown is not in the log: forgotten");
        }
    }
}

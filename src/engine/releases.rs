//! Publishing DP releases (by a curator's request or the automatic policy) and
//! changing what governs them (budget, labels, policy), each a durable record
//! that follows the same validate → persist → apply order as steps. A release's
//! values and its charge to every example's ledger are one record, so they are
//! stored and applied together or not at all.

use super::book::{
    apply_release, apply_setting, export_gauges, json_record, BudgetPayload, PolicyPayload,
    ReleaseBook,
};
use super::dataset::Dataset;
use super::error::{BudgetRefusal, EngineError, EngineResult};
use super::idempotency::Persisted;
use super::Engine;
use crate::ledger::{IdempotencyKey, Ledger};
use crate::release::{
    rdp_of_rho, BudgetStatus, LabelAssignment, LeftOut, Release, ReleasePolicy, ReleaseRecord,
};
use crate::store::{RecordKind, StoredKey};
use serde::Serialize;
use std::sync::Arc;

/// The answer to an accepted release, defined once with the Rust client.
pub use dpledger_api::release::ReleaseOutcome;

/// Refuse a release of cost `rho` that the budget does not allow.
pub(super) fn check_budget(ds: &Dataset, book: &ReleaseBook, rho: f64) -> EngineResult<()> {
    let budget = book.budget;
    if budget.allows(rho) {
        return Ok(());
    }
    let detail = match budget.rho_budget {
        None => format!(
            "dataset {:?} has no release budget yet: a curator sets one with PUT \
             /v1/datasets/{}/release-budget (this release would cost rho = {rho})",
            ds.id, ds.id
        ),
        Some(b) => format!(
            "this release costs rho = {rho} but {} of the budget {b} is spent \
             ({} left)",
            budget.rho_spent,
            (b - budget.rho_spent).max(0.0)
        ),
    };
    Err(EngineError::OverBudget {
        detail,
        refusal: BudgetRefusal {
            rho_spent: budget.rho_spent,
            rho_requested: rho,
            rho_budget: budget.rho_budget,
        },
    })
}

/// Refuse a by-group release of a dataset without labels.
pub(super) fn check_labels(ds: &Dataset, book: &ReleaseBook, by_group: bool) -> EngineResult<()> {
    if by_group && book.labels.is_empty() {
        return Err(EngineError::Conflict {
            detail: format!(
                "by_group needs labels, and dataset {:?} has none: assign them with PUT \
                 /v1/datasets/{}/labels",
                ds.id, ds.id
            ),
            field: Some("by_group"),
        });
    }
    Ok(())
}

/// Refuse a release that leaves out of its input all of the dataset's
/// `examples` (`left_out` of them, spec §6): it would tell nothing. An
/// unsharded release checks its own ledger's count; a sharded one the sum of
/// its shards'.
pub(super) fn check_leaves_someone_in(examples: u64, left_out: u64) -> EngineResult<()> {
    if examples > 0 && left_out == examples {
        return Err(EngineError::LeavesOutEveryone { examples });
    }
    Ok(())
}

/// Refuse a charge of `rho` that the ledger cannot take now: a multi-part step
/// is incomplete, or the charge would retire examples outside `left_out`
/// (sorted ids the release leaves out of its input) or push them past their
/// budget. A trainer learns of retirements only from step answers (a retried
/// step's answer included): one caused by a release would be clipped at its
/// old threshold yet charged nothing. So a release never retires anyone.
pub(super) fn check_charge(ledger: &Ledger, rho: f64, left_out: &[u32]) -> EngineResult<()> {
    ledger.check_release()?;
    let would_retire = ledger.release_would_retire(&rdp_of_rho(ledger.orders(), rho), left_out);
    if would_retire > 0 {
        return Err(EngineError::WouldRetire { would_retire });
    }
    Ok(())
}

/// Refuse a release when there is nothing to release yet.
pub(super) fn check_bound(steps: u64, bound: f64, delta: f64) -> EngineResult<()> {
    if steps == 0 || !(bound.is_finite() && bound > 0.0) {
        return Err(EngineError::conflict(format!(
            "nothing to release: {steps} steps, worst-case epsilon {bound} at delta {delta} \
             (releases need at least one step and a finite worst case)"
        )));
    }
    Ok(())
}

/// The current time in seconds since the Unix epoch, as releases record it.
pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Engine {
    /// Persist a checked and computed release, then charge it and add it to the
    /// book; the caller holds the dataset's write lock. Nothing is charged or
    /// served unless the record is durable.
    pub(super) async fn publish(
        &self,
        ds: &Dataset,
        ledger: &mut Ledger,
        release: Release,
        left_out: &[u32],
        key: Option<IdempotencyKey>,
    ) -> EngineResult<ReleaseOutcome> {
        let record = ReleaseRecord {
            release,
            left_out: LeftOut::from_ids(left_out),
        };
        let rec = json_record(&ds.id, RecordKind::Release, &record)?;
        let release = record.release;
        // A retry is answered with this very release: it is stored with the key.
        let key = key.map(|k| IdempotencyKey {
            answer: rec.payload.clone(),
            ..k
        });
        if let Persisted::Done(done) = self.persist_keyed(ds, ledger, vec![rec], key).await? {
            return released_answer(ds, &done);
        }
        let mut book = ds.book_write();
        apply_release(ledger, &mut book, release.clone(), left_out).map_err(|e| {
            tracing::error!(dataset = ds.id, error = %e, "release persisted but not applied");
            self.heal(ds);
            EngineError::Internal(
                "release recorded but not applied: the dataset will be reloaded from the log"
                    .to_string(),
            )
        })?;
        export_gauges(&ds.id, &book);
        metrics::counter!("dpledger_releases_total").increment(1);
        Ok(ReleaseOutcome {
            release,
            budget: book.budget,
        })
    }

    /// Persist and apply one release setting (budget, labels, policy) after `check`
    /// accepted it against the current book. A retry with the same idempotency
    /// `key` finds the setting made and changes nothing (the answer describes
    /// the settings as they are now).
    async fn change_setting(
        &self,
        id: &str,
        kind: RecordKind,
        payload: &impl Serialize,
        check: impl FnOnce(&Ledger, &ReleaseBook) -> EngineResult<()>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<Arc<Dataset>> {
        let ds = self.dataset(id)?;
        let mut ledger = ds.ledger.write().await;
        if self
            .replayed(&ds, &mut ledger, key.as_ref())
            .await?
            .is_some()
        {
            drop(ledger);
            return Ok(ds);
        }
        self.locked_checks(&ds, &mut ledger).await?;
        check(&ledger, &ds.book_read())?;
        let rec = json_record(id, kind, payload)?;
        let bytes = rec.payload.clone();
        if let Persisted::Done(_) = self.persist_keyed(&ds, &mut ledger, vec![rec], key).await? {
            drop(ledger);
            return Ok(ds);
        }
        let mut book = ds.book_write();
        if let Err(e) = apply_setting(&ledger, &mut book, kind, &bytes) {
            tracing::error!(dataset = id, error = %e, "setting persisted but not applied");
            self.heal(&ds);
            return Err(EngineError::Internal(e));
        }
        export_gauges(id, &book);
        drop(book);
        drop(ledger);
        Ok(ds)
    }

    /// Set the release budget; it can never drop below what is spent.
    pub async fn set_release_budget(
        &self,
        id: &str,
        rho: f64,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<BudgetStatus> {
        let ds = self
            .change_setting(
                id,
                RecordKind::BudgetChange,
                &BudgetPayload { rho_budget: rho },
                |_, book| {
                    if rho < book.budget.rho_spent {
                        return Err(EngineError::Conflict {
                            detail: format!(
                                "the budget cannot drop below what releases already spent \
                                 (rho = {})",
                                book.budget.rho_spent
                            ),
                            field: Some("rho"),
                        });
                    }
                    Ok(())
                },
                key,
            )
            .await?;
        let budget = ds.book_read().budget;
        Ok(budget)
    }

    /// Assign group labels.
    pub async fn set_labels(
        &self,
        id: &str,
        a: LabelAssignment,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<Vec<String>> {
        let ds = self
            .change_setting(
                id,
                RecordKind::Labels,
                &a,
                |ledger, book| {
                    if ledger.config().label_budgets.is_some() {
                        return Err(EngineError::conflict(
                            "this dataset has budgets per label, so every example keeps the \
                             label it was created with (its budget was fixed by it)"
                                .to_string(),
                        ));
                    }
                    book.labels
                        .check(ledger.examples(), &a)
                        .map_err(EngineError::from)
                },
                key,
            )
            .await?;
        let names = ds.book_read().labels.names().to_vec();
        Ok(names)
    }

    /// Set (or, with `None`, remove) the automatic release policy.
    pub async fn set_release_policy(
        &self,
        id: &str,
        mut policy: Option<ReleasePolicy>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<Option<ReleasePolicy>> {
        if let Some(p) = &mut policy {
            p.validate()?;
        }
        let payload = PolicyPayload { policy };
        self.change_setting(id, RecordKind::ReleasePolicy, &payload, |_, _| Ok(()), key)
            .await?;
        Ok(payload.policy)
    }
}

/// The answer to a retried release: the release its key stored, and the budget
/// as it is now.
pub(super) fn released_answer(ds: &Dataset, done: &StoredKey) -> EngineResult<ReleaseOutcome> {
    let (release, _) = super::book::parse_release(&done.answer).map_err(|e| {
        EngineError::Internal(format!(
            "the stored answer of this release is unreadable: {e}"
        ))
    })?;
    Ok(ReleaseOutcome {
        release,
        budget: ds.book_read().budget,
    })
}

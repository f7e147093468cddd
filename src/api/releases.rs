//! The release path (issue 6): DP releases, the release budget, group labels and
//! the automatic release policy, each a durable record that follows the same
//! validate → persist → apply order as steps. A release's values and its charge
//! to every example's ledger are one record, so they are stored and applied
//! together or not at all.

use super::problem::Problem;
use super::state::{AppState, Dataset};
use crate::accounting::Conversion;
use crate::ledger::Ledger;
use crate::release::{
    compute, rdp_of_rho, BudgetStatus, LabelAssignment, Labels, Release, ReleasePolicy,
    ReleaseRequest, ReleaseTrigger, Statistics,
};
use crate::store::{Record, RecordKind};
use axum::http::StatusCode;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A dataset's releases and what governs them.
#[derive(Debug, Clone, Default)]
pub struct ReleaseBook {
    /// Budget and spend.
    pub budget: BudgetStatus,
    /// Every release, oldest first.
    pub history: Vec<Arc<Release>>,
    /// Group labels of the examples.
    pub labels: Labels,
    /// Automatic releases, if configured.
    pub policy: Option<ReleasePolicy>,
    /// Why the policy's latest attempt was refused, if it was.
    pub policy_error: Option<String>,
}

/// Payload of a `BudgetChange` record.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct BudgetPayload {
    pub rho_budget: f64,
}

/// Payload of a `ReleasePolicy` record.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PolicyPayload {
    pub policy: Option<ReleasePolicy>,
}

/// The answer to an accepted release.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReleaseOutcome {
    /// The release as stored and served to viewers.
    pub release: Release,
    /// The budget after it.
    pub budget: BudgetStatus,
}

/// A refused release: what was spent and what was asked (a problem extension).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BudgetRefusal {
    /// zCDP `rho` already spent.
    pub rho_spent: f64,
    /// zCDP `rho` this release would cost.
    pub rho_requested: f64,
    /// The budget (`null`: none set).
    pub rho_budget: Option<f64>,
}

fn book_read(ds: &Dataset) -> std::sync::RwLockReadGuard<'_, ReleaseBook> {
    ds.book.read().unwrap_or_else(|e| e.into_inner())
}

fn book_write(ds: &Dataset) -> std::sync::RwLockWriteGuard<'_, ReleaseBook> {
    ds.book.write().unwrap_or_else(|e| e.into_inner())
}

/// A record with a JSON payload (release, budget, labels, policy).
pub(super) fn json_record(
    dataset: &str,
    kind: RecordKind,
    payload: &impl Serialize,
) -> Result<Record, Problem> {
    Ok(Record {
        dataset: dataset.to_string(),
        kind,
        step: None,
        part: None,
        payload: serde_json::to_vec(payload)
            .map_err(|e| Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    })
}

/// Charge a release to the ledger and add it to the book: the one way a release
/// takes effect, live and during recovery. Checked beforehand to retire no one.
pub(super) fn apply_release(
    ledger: &mut Ledger,
    book: &mut ReleaseBook,
    release: Release,
) -> Result<(), String> {
    if release.id != book.budget.releases + 1 {
        return Err(format!(
            "release {} recorded after release {}",
            release.id, book.budget.releases
        ));
    }
    let rdp = rdp_of_rho(ledger.orders(), release.rho);
    let retired = ledger
        .charge_release(&rdp)
        .map_err(|e| format!("release {} does not apply: {e}", release.id))?;
    if !retired.is_empty() {
        // The pre-check has a safety margin, so this does not happen; the log is
        // the truth either way, and replaying it retires the same examples.
        tracing::error!(
            release = release.id,
            retired = retired.len(),
            "a release retired examples"
        );
    }
    book.budget.rho_spent += release.rho;
    book.budget.releases += 1;
    book.history.push(Arc::new(release));
    Ok(())
}

/// Apply a stored `BudgetChange`, `Labels` or `ReleasePolicy` record.
pub(super) fn apply_setting(
    ledger: &Ledger,
    book: &mut ReleaseBook,
    kind: RecordKind,
    payload: &[u8],
) -> Result<(), String> {
    match kind {
        RecordKind::BudgetChange => {
            let p: BudgetPayload =
                serde_json::from_slice(payload).map_err(|e| format!("budget: {e}"))?;
            book.budget.rho_budget = Some(p.rho_budget);
        }
        RecordKind::Labels => {
            let a: LabelAssignment =
                serde_json::from_slice(payload).map_err(|e| format!("labels: {e}"))?;
            book.labels
                .assign(ledger.examples(), &a)
                .map_err(|e| format!("labels do not apply: {e}"))?;
        }
        RecordKind::ReleasePolicy => {
            let p: PolicyPayload =
                serde_json::from_slice(payload).map_err(|e| format!("policy: {e}"))?;
            book.policy = p.policy;
            book.policy_error = None;
        }
        other => return Err(format!("{other:?} is not a release setting")),
    }
    Ok(())
}

/// Export the latest release as Prometheus gauges (for Grafana dashboards).
pub(super) fn export_gauges(dataset: &str, book: &ReleaseBook) {
    let ds = dataset.to_string();
    metrics::gauge!("dpledger_release_rho_spent", "dataset" => ds.clone())
        .set(book.budget.rho_spent);
    metrics::gauge!("dpledger_releases", "dataset" => ds.clone()).set(book.budget.releases as f64);
    let Some(latest) = book.history.last() else {
        return;
    };
    metrics::gauge!("dpledger_release_step", "dataset" => ds.clone()).set(latest.step as f64);
    metrics::gauge!("dpledger_release_bound", "dataset" => ds.clone()).set(latest.bound);
    let export = |group: &str, s: &Statistics| {
        if let Some(m) = &s.mean {
            metrics::gauge!("dpledger_release_mean", "dataset" => ds.clone(), "group" => group.to_string())
                .set(m.mean);
            metrics::gauge!("dpledger_release_count", "dataset" => ds.clone(), "group" => group.to_string())
                .set(m.count);
        }
        for q in s.quantiles.iter().flatten() {
            metrics::gauge!("dpledger_release_quantile", "dataset" => ds.clone(),
                "group" => group.to_string(), "level" => q.level.to_string())
            .set(q.value);
        }
        if let Some(h) = &s.histogram {
            for (c, le) in h.counts.iter().zip(&h.edges[1..]) {
                metrics::gauge!("dpledger_release_histogram", "dataset" => ds.clone(),
                    "group" => group.to_string(), "le" => le.to_string())
                .set(*c);
            }
        }
    };
    if let Some(p) = &latest.values.population {
        export("", p);
    }
    for g in latest.values.groups.iter().flatten() {
        export(g.label.as_deref().unwrap_or("(unlabelled)"), &g.statistics);
    }
}

/// Check a release against the budget, the labels and the ledger, and compute
/// its values: everything but persisting and charging. Synchronous, so the book's
/// read guard is held throughout (the book only changes under the ledger's write
/// lock, which the caller holds) and the labels are read in place, not copied.
fn prepare_release(
    ds: &Dataset,
    ledger: &Ledger,
    request: ReleaseRequest,
    trigger: ReleaseTrigger,
) -> Result<Release, Problem> {
    let rho = request.rho();
    let book = book_read(ds);
    let budget = book.budget;
    if !budget.allows(rho) {
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
        return Err(Problem::conflict(detail).with_budget(BudgetRefusal {
            rho_spent: budget.rho_spent,
            rho_requested: rho,
            rho_budget: budget.rho_budget,
        }));
    }
    if request.by_group && book.labels.is_empty() {
        return Err(Problem::conflict(format!(
            "by_group needs labels, and dataset {:?} has none: assign them with PUT \
             /v1/datasets/{}/labels",
            ds.id, ds.id
        ))
        .with_field("by_group"));
    }
    ledger.check_release()?;
    // A trainer learns of retirements only from step answers (a retried step's
    // answer included): one caused by a release would be clipped at its old
    // threshold yet charged nothing. So a release never retires anyone.
    let would_retire = ledger.release_would_retire(&rdp_of_rho(ledger.orders(), rho));
    if would_retire > 0 {
        return Err(Problem::conflict(format!(
            "this release would push {would_retire} examples so close to their individual \
             budget that the filter would retire them; releases never retire examples \
             (trainers learn of retirements only from step answers): spend less rho"
        )));
    }
    let delta = request.delta.unwrap_or(ledger.config().delta);
    let conversion = Conversion::default();
    let bound = ledger.worst_case(delta, conversion)?.epsilon;
    if ledger.next_step() == 0 || !(bound.is_finite() && bound > 0.0) {
        return Err(Problem::conflict(format!(
            "nothing to release: {} steps, worst-case epsilon {bound} at delta {delta} \
             (releases need at least one step and a finite worst case)",
            ledger.next_step()
        )));
    }
    let values = blocking(|| -> Result<_, Problem> {
        let epsilons = ledger.all_epsilons(delta, conversion)?;
        let mut rng = rand::rngs::StdRng::from_os_rng();
        Ok(compute(&mut rng, &request, &epsilons, bound, &book.labels))
    })?;
    Ok(Release {
        id: budget.releases + 1,
        step: ledger.next_step(),
        released_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        trigger,
        request,
        delta,
        bound,
        rho,
        values,
    })
}

/// Run `f` where blocking is allowed: an `O(n)` pass over a large dataset must not
/// stall the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl AppState {
    /// Publish a release requested by a curator.
    pub async fn release(
        &self,
        id: &str,
        request: ReleaseRequest,
    ) -> Result<ReleaseOutcome, Problem> {
        let ds = self.writable(id)?;
        let mut ledger = ds.ledger.write().await;
        self.locked_checks(&ds, &mut ledger).await?;
        self.release_locked(&ds, &mut ledger, request, ReleaseTrigger::Request)
            .await
    }

    /// Publish a release with the dataset's write lock held: check the budget and
    /// the ledger, compute, persist, then charge. Nothing is charged or served
    /// unless the record is durable.
    pub(super) async fn release_locked(
        &self,
        ds: &Dataset,
        ledger: &mut Ledger,
        mut request: ReleaseRequest,
        trigger: ReleaseTrigger,
    ) -> Result<ReleaseOutcome, Problem> {
        request.validate()?;
        let release = prepare_release(ds, ledger, request, trigger)?;
        let rec = json_record(&ds.id, RecordKind::Release, &release)?;
        self.persist_change(ds, vec![rec]).await?;
        let mut book = book_write(ds);
        apply_release(ledger, &mut book, release.clone()).map_err(|e| {
            tracing::error!(dataset = ds.id, error = %e, "release persisted but not applied");
            ds.stale.store(true, Ordering::Release);
            Problem::internal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "release recorded but not applied: the dataset will be reloaded from the log",
            )
        })?;
        export_gauges(&ds.id, &book);
        metrics::counter!("dpledger_releases_total").increment(1);
        Ok(ReleaseOutcome {
            release,
            budget: book.budget,
        })
    }

    /// After an applied step: the policy's release, if one is due. A refusal
    /// (budget spent, say) never fails the step; it is kept for the status.
    pub(super) async fn policy_release(&self, ds: &Dataset, ledger: &mut Ledger) {
        let policy = book_read(ds).policy.clone();
        let Some(policy) = policy else {
            return;
        };
        if ledger.next_step() % policy.every_steps != 0 {
            return;
        }
        let result = self
            .release_locked(ds, ledger, policy.request, ReleaseTrigger::Policy)
            .await;
        let mut book = book_write(ds);
        match result {
            Ok(_) => book.policy_error = None,
            Err(p) => {
                tracing::warn!(dataset = ds.id, detail = p.detail, "policy release refused");
                metrics::counter!("dpledger_policy_releases_refused_total").increment(1);
                book.policy_error = Some(p.detail);
            }
        }
    }

    /// Persist and apply one release setting (budget, labels, policy) after `check`
    /// accepted it against the current book.
    async fn change_setting(
        &self,
        id: &str,
        kind: RecordKind,
        payload: &impl Serialize,
        check: impl FnOnce(&Ledger, &ReleaseBook) -> Result<(), Problem>,
    ) -> Result<Arc<Dataset>, Problem> {
        let ds = self.writable(id)?;
        let mut ledger = ds.ledger.write().await;
        self.locked_checks(&ds, &mut ledger).await?;
        check(&ledger, &book_read(&ds))?;
        let rec = json_record(id, kind, payload)?;
        let bytes = rec.payload.clone();
        self.persist_change(&ds, vec![rec]).await?;
        let mut book = book_write(&ds);
        if let Err(e) = apply_setting(&ledger, &mut book, kind, &bytes) {
            tracing::error!(dataset = id, error = %e, "setting persisted but not applied");
            ds.stale.store(true, Ordering::Release);
            return Err(Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, e));
        }
        export_gauges(id, &book);
        drop(book);
        drop(ledger);
        Ok(ds)
    }

    /// Set the release budget; it can never drop below what is spent.
    pub async fn set_release_budget(&self, id: &str, rho: f64) -> Result<BudgetStatus, Problem> {
        let ds = self
            .change_setting(
                id,
                RecordKind::BudgetChange,
                &BudgetPayload { rho_budget: rho },
                |_, book| {
                    if rho < book.budget.rho_spent {
                        return Err(Problem::conflict(format!(
                            "the budget cannot drop below what releases already spent (rho = {})",
                            book.budget.rho_spent
                        ))
                        .with_field("rho"));
                    }
                    Ok(())
                },
            )
            .await?;
        let budget = book_read(&ds).budget;
        Ok(budget)
    }

    /// Assign group labels.
    pub async fn set_labels(&self, id: &str, a: LabelAssignment) -> Result<Vec<String>, Problem> {
        let ds = self
            .change_setting(id, RecordKind::Labels, &a, |ledger, book| {
                book.labels
                    .check(ledger.examples(), &a)
                    .map_err(Problem::from)
            })
            .await?;
        let names = book_read(&ds).labels.names().to_vec();
        Ok(names)
    }

    /// Set (or, with `None`, remove) the automatic release policy.
    pub async fn set_release_policy(
        &self,
        id: &str,
        mut policy: Option<ReleasePolicy>,
    ) -> Result<Option<ReleasePolicy>, Problem> {
        if let Some(p) = &mut policy {
            p.validate()?;
        }
        let payload = PolicyPayload { policy };
        self.change_setting(id, RecordKind::ReleasePolicy, &payload, |_, _| Ok(()))
            .await?;
        Ok(payload.policy)
    }

    /// Read a dataset's release book (503 while it is reloading): viewers never
    /// wait for the ledger's lock.
    pub fn with_book<T>(&self, id: &str, f: impl FnOnce(&ReleaseBook) -> T) -> Result<T, Problem> {
        let ds = self.dataset(id)?;
        ds.check_current()?;
        let book = book_read(&ds);
        Ok(f(&book))
    }
}

//! The release book: a dataset's releases, release budget, group labels and
//! automatic policy, and the one way each stored record changes it (live and
//! during recovery alike), so that replaying the log rebuilds exactly what was
//! served.

use super::error::EngineError;
use crate::ledger::Ledger;
use crate::release::{
    rdp_of_rho, release_pld_events, BudgetStatus, LabelRecord, Labels, Release, ReleasePolicy,
    ReleaseRecord, Statistics,
};
use crate::store::{Record, RecordKind};
use serde::{Deserialize, Serialize};
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
    pub policy_error: Option<PolicyRefusal>,
}

/// Why an automatic (policy) release was refused, in two forms: viewers and owners
/// read `reason`, which depends on no individual's data; curators and admins read
/// `detail`, which may (e.g. how many examples are near their individual budget).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRefusal {
    /// Data-independent reason ([`super::EngineError::public_reason`]).
    pub reason: &'static str,
    /// The full refusal, for curators.
    pub detail: String,
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

/// A record with a JSON payload (release, budget, labels, policy).
pub(super) fn json_record(
    dataset: &str,
    kind: RecordKind,
    payload: &impl Serialize,
) -> Result<Record, EngineError> {
    Ok(Record {
        dataset: dataset.to_string(),
        kind,
        step: None,
        part: None,
        payload: serde_json::to_vec(payload).map_err(|e| EngineError::Internal(e.to_string()))?,
    })
}

/// A stored release record: the release and the examples it left out of its
/// input (sorted ids).
pub(super) fn parse_release(payload: &[u8]) -> Result<(Release, Vec<u32>), String> {
    let record: ReleaseRecord =
        serde_json::from_slice(payload).map_err(|e| format!("release: {e}"))?;
    let left_out = record.left_out.ids()?;
    Ok((record.release, left_out))
}

/// Charge a release to the ledger, leaving out the examples `left_out` (sorted
/// ids), and add it to the book: the one way a release takes effect, live and
/// during recovery. Checked beforehand to retire no one.
pub(super) fn apply_release(
    ledger: &mut Ledger,
    book: &mut ReleaseBook,
    release: Release,
    left_out: &[u32],
) -> Result<(), String> {
    if release.id != book.budget.releases + 1 {
        return Err(format!(
            "release {} recorded after release {}",
            release.id, book.budget.releases
        ));
    }
    let rdp = rdp_of_rho(ledger.orders(), release.rho);
    let events = release_pld_events(&release.request);
    let retired = ledger
        .charge_release_with_pld(&rdp, Some(&events), left_out)
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
    add_to_book(book, release);
    Ok(())
}

/// Add a charged release to the book (its charge is already in the ledger: here
/// after [`apply_release`] charged it, or in a snapshot's ledger).
fn add_to_book(book: &mut ReleaseBook, release: Release) {
    book.budget.rho_spent += release.rho;
    book.budget.releases += 1;
    book.history.push(Arc::new(release));
}

/// Rebuild a release book from the records that built it (a snapshot's), by the
/// same parsing as a replay of the log; the ledger already holds every charge.
pub(super) fn rebuild_book(
    ledger: &Ledger,
    records: &[(RecordKind, Arc<[u8]>)],
) -> Result<ReleaseBook, String> {
    let mut book = ReleaseBook::default();
    for (kind, payload) in records {
        match kind {
            RecordKind::Release => {
                let (release, _) = parse_release(payload)?;
                if release.id != book.budget.releases + 1 {
                    return Err(format!(
                        "release {} recorded after release {}",
                        release.id, book.budget.releases
                    ));
                }
                add_to_book(&mut book, release);
            }
            kind => apply_setting(ledger, &mut book, *kind, payload)?,
        }
    }
    Ok(book)
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
            let r: LabelRecord =
                serde_json::from_slice(payload).map_err(|e| format!("labels: {e}"))?;
            book.labels
                .apply(ledger.examples(), &r)
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

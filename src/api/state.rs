//! Server state: the datasets' ledgers, the durable store they are rebuilt from,
//! and the one path by which anything changes.
//!
//! Every change follows **validate → persist → apply**: the ledger checks the
//! request without mutating (`check_*`), the record is appended durably to the
//! store (group commit), and only then is it applied in memory and acknowledged.
//! A request the ledger would refuse never reaches the log; a step the log could
//! not store is never acknowledged. The dataset's write lock is held from check
//! to apply, so the log's order is the ledger's order.

use super::problem::Problem;
pub use super::releases::ReleaseBook;
use super::releases::{
    apply_release, apply_setting, export_gauges, json_record, BudgetPayload, PolicyPayload,
};
use crate::ledger::{DatasetConfig, Ledger, RefreshOutcome, StepOutcome, StepReport};
use crate::release::{LabelAssignment, ReleasePolicy};
use crate::store::codec::StepPayload;
use crate::store::{append_async, Record, RecordKind, Store, StoreError, StoredRecord};
use axum::http::StatusCode;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::RwLock;

/// One dataset (training run) served by this process.
#[derive(Debug)]
pub struct Dataset {
    /// Its id.
    pub id: String,
    /// Its ledger. Readers (queries) share; writers (steps) are exclusive.
    pub ledger: RwLock<Ledger>,
    /// Archived datasets are read-only.
    pub archived: AtomicBool,
    /// Set when memory may be behind the log (a change was persisted but could not
    /// be applied, or a commit's outcome is unknown and reloading failed). Writers
    /// reload from the log first; readers get 503 until then.
    pub stale: AtomicBool,
    /// Releases, release budget, labels and policy. Changed only while the
    /// ledger's write lock is held (so releases and steps are ordered as in the
    /// log); read without it by viewers.
    pub book: std::sync::RwLock<ReleaseBook>,
}

impl Dataset {
    fn new(id: &str, ledger: Ledger) -> Self {
        Dataset {
            id: id.to_string(),
            ledger: RwLock::new(ledger),
            archived: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            book: std::sync::RwLock::new(ReleaseBook::default()),
        }
    }

    /// Refuse reads while memory may be behind the log.
    pub fn check_current(&self) -> Result<(), Problem> {
        if self.stale.load(Ordering::Acquire) {
            return Err(Problem::internal(
                StatusCode::SERVICE_UNAVAILABLE,
                "this dataset is being reloaded from the log: retry shortly",
            ));
        }
        Ok(())
    }
}

/// Payload of a `DatasetCreated` record.
#[derive(Debug, Serialize, Deserialize)]
struct CreatedPayload {
    config: DatasetConfig,
}

/// Request-size and range limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Largest range of thresholds returned by one request.
    pub max_threshold_range: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 << 20,
            max_threshold_range: 1 << 20,
        }
    }
}

/// Everything the handlers share.
pub struct AppState {
    datasets: DashMap<String, Arc<Dataset>>,
    store: Arc<dyn Store>,
    /// Token verification.
    pub auth: super::auth::Authorizer,
    /// Limits.
    pub limits: Limits,
    /// Prometheus exposition, when metrics are installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("datasets", &self.datasets.len())
            .field("store", &self.store.describe())
            .finish()
    }
}

/// Whether `id` is an acceptable dataset id: 1–64 of `[A-Za-z0-9._-]`, and not
/// `.` or `..` (URL path navigation: such a dataset could not be addressed).
pub fn valid_dataset_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(super) fn store_problem(e: StoreError) -> Problem {
    match e {
        StoreError::Duplicate {
            dataset,
            step,
            part,
        } => Problem::conflict(format!(
            "step {step} part {} of dataset {dataset} is already recorded in the store by another \
             dpledger process; this process's view is stale (restart it to reload the log)",
            part.unwrap_or(0)
        )),
        other => {
            tracing::error!(error = %other, "store append failed; nothing was acknowledged");
            Problem::internal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store could not make this change durable; nothing was applied or acknowledged: retry",
            )
        }
    }
}

impl AppState {
    /// Load every record of `store` and rebuild the ledgers. Any record that does
    /// not apply cleanly is corruption: refuse to start rather than serve epsilons
    /// computed from a partial log.
    pub fn recover(
        store: Arc<dyn Store>,
        auth: super::auth::Authorizer,
        limits: Limits,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> anyhow::Result<Self> {
        let datasets: DashMap<String, Arc<Dataset>> = DashMap::new();
        let started = Instant::now();
        let description = store.describe();
        let mut apply = |stored: StoredRecord| -> Result<(), StoreError> {
            apply_record(&datasets, &stored).map_err(|detail| StoreError::Corrupt {
                store: description.clone(),
                seq: Some(stored.seq),
                detail,
            })
        };
        let stats = store.load(&mut apply)?;
        for d in datasets.iter() {
            export_gauges(d.key(), &d.book.read().unwrap_or_else(|e| e.into_inner()));
        }
        tracing::info!(
            records = stats.records,
            datasets = datasets.len(),
            seconds = started.elapsed().as_secs_f64(),
            "recovered ledgers from {}",
            store.describe()
        );
        Ok(Self {
            datasets,
            store,
            auth,
            limits,
            metrics,
        })
    }

    /// The dataset, or 404.
    pub fn dataset(&self, id: &str) -> Result<Arc<Dataset>, Problem> {
        self.datasets
            .get(id)
            .map(|d| d.clone())
            .ok_or_else(|| Problem::not_found(format!("no dataset {id:?}")))
    }

    /// Every dataset id, sorted.
    pub fn dataset_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.datasets.iter().map(|e| e.key().clone()).collect();
        ids.sort();
        ids
    }

    pub(super) fn writable(&self, id: &str) -> Result<Arc<Dataset>, Problem> {
        let ds = self.dataset(id)?;
        if ds.archived.load(Ordering::Acquire) {
            return Err(Problem::conflict(format!(
                "dataset {id:?} is archived and read-only"
            )));
        }
        Ok(ds)
    }

    /// Checks made after taking a dataset's write lock, when they can no longer
    /// change under us: the dataset is still the registered one (a failed create
    /// removes it), it is not archived, and memory is current with the log
    /// (reloading it if it may not be).
    pub(super) async fn locked_checks(
        &self,
        ds: &Arc<Dataset>,
        ledger: &mut Ledger,
    ) -> Result<(), Problem> {
        let registered = self
            .datasets
            .get(&ds.id)
            .is_some_and(|d| Arc::ptr_eq(&d, ds));
        if !registered {
            return Err(Problem::not_found(format!("no dataset {:?}", ds.id)));
        }
        if ds.archived.load(Ordering::Acquire) {
            return Err(Problem::conflict(format!(
                "dataset {:?} is archived and read-only",
                ds.id
            )));
        }
        if ds.stale.load(Ordering::Acquire) {
            self.reload_into(ds, ledger).await?;
            ds.stale.store(false, Ordering::Release);
        }
        Ok(())
    }

    pub(super) async fn persist(&self, records: Vec<Record>) -> Result<(), StoreError> {
        let started = Instant::now();
        append_async(&self.store, records).await?;
        metrics::histogram!("dpledger_store_commit_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Persist a change to `ds` (whose write lock the caller holds). When the
    /// commit's outcome is unknown the change may be in the log, so the dataset is
    /// marked stale and reloaded before anything else touches it.
    pub(super) async fn persist_change(
        &self,
        ds: &Dataset,
        records: Vec<Record>,
    ) -> Result<(), Problem> {
        self.persist(records).await.map_err(|e| {
            if matches!(e, StoreError::OutcomeUnknown { .. }) {
                ds.stale.store(true, Ordering::Release);
            }
            store_problem(e)
        })
    }

    /// Rebuild one dataset's ledger and release book from the log into `ds`; the
    /// caller holds the dataset's write lock (`ledger`).
    pub(super) async fn reload_into(
        &self,
        ds: &Dataset,
        ledger: &mut Ledger,
    ) -> Result<(), Problem> {
        let (fresh, book) = self.reload(&ds.id).await?;
        *ledger = fresh;
        *ds.book.write().unwrap_or_else(|e| e.into_inner()) = book;
        Ok(())
    }

    /// Rebuild one dataset's ledger from the log. Used when memory may be behind
    /// the log: a commit whose outcome is unknown, or a step another process
    /// stored. Runs on a blocking thread; the caller holds the dataset's write lock.
    async fn reload(&self, id: &str) -> Result<(Ledger, ReleaseBook), Problem> {
        let store = self.store.clone();
        let id = id.to_string();
        let rebuilt =
            tokio::task::spawn_blocking(move || -> anyhow::Result<Option<Arc<Dataset>>> {
                let one: DashMap<String, Arc<Dataset>> = DashMap::new();
                let description = store.describe();
                store.load(&mut |stored: StoredRecord| {
                    if stored.record.dataset != id {
                        return Ok(());
                    }
                    apply_record(&one, &stored).map_err(|detail| StoreError::Corrupt {
                        store: description.clone(),
                        seq: Some(stored.seq),
                        detail,
                    })
                })?;
                Ok(one.remove(&id).map(|(_, d)| d))
            })
            .await
            .map_err(|_| {
                Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "reload task failed")
            })?
            .map_err(|e| {
                tracing::error!(error = %e, "reloading a dataset from the log failed");
                Problem::internal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the store could not be read back; nothing was acknowledged: retry",
                )
            })?;
        let dataset = rebuilt.ok_or_else(|| {
            Problem::internal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "dataset missing from the log",
            )
        })?;
        let dataset = Arc::try_unwrap(dataset)
            .map_err(|_| Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "reload raced"))?;
        let book = dataset.book.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok((dataset.ledger.into_inner(), book))
    }

    /// Create a dataset, with its optional release settings (stored with the
    /// creation, atomically). 409 if the id is taken.
    pub async fn create_dataset(
        &self,
        id: &str,
        config: DatasetConfig,
        setup: DatasetSetup,
    ) -> Result<Arc<Dataset>, Problem> {
        if !valid_dataset_id(id) {
            return Err(Problem::bad_request(
                "id must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)",
            )
            .with_field("id"));
        }
        let ledger = Ledger::new(config.clone())?;
        let settings = setup.records(id, &ledger)?;
        // The entry is reserved first so two concurrent creates cannot both persist.
        let dataset = Arc::new(Dataset::new(id, ledger));
        let guard = dataset.ledger.write().await;
        match self.datasets.entry(id.to_string()) {
            dashmap::Entry::Occupied(_) => {
                return Err(Problem::conflict(format!("dataset {id:?} already exists")))
            }
            dashmap::Entry::Vacant(v) => {
                v.insert(dataset.clone());
            }
        }
        let payload = serde_json::to_vec(&CreatedPayload { config })
            .map_err(|e| Problem::bad_request(e.to_string()))?;
        let record = Record {
            dataset: id.to_string(),
            kind: RecordKind::DatasetCreated,
            step: None,
            part: None,
            payload,
        };
        let mut records = vec![record];
        records.extend(settings);
        let applied: Vec<(RecordKind, Vec<u8>)> = records[1..]
            .iter()
            .map(|r| (r.kind, r.payload.clone()))
            .collect();
        if let Err(e) = self.persist(records).await {
            if matches!(e, StoreError::OutcomeUnknown { .. }) {
                // The creation may be in the log: keep the entry only if it is.
                let mut guard = guard;
                if self.reload_into(&dataset, &mut guard).await.is_ok() {
                    drop(guard);
                    return Ok(dataset);
                }
            }
            self.datasets.remove(id);
            return Err(store_problem(e));
        }
        {
            let mut book = dataset.book.write().unwrap_or_else(|e| e.into_inner());
            for (kind, payload) in &applied {
                // Checked by `DatasetSetup::records` against this very ledger.
                if let Err(e) = apply_setting(&guard, &mut book, *kind, payload) {
                    tracing::error!(dataset = id, error = %e, "setting persisted but not applied");
                    dataset.stale.store(true, Ordering::Release);
                }
            }
            export_gauges(id, &book);
        }
        drop(guard.downgrade());
        Ok(dataset)
    }

    /// Apply one step report (or part): validate, persist, apply.
    pub async fn report_step(&self, id: &str, report: StepReport) -> Result<StepOutcome, Problem> {
        let ds = self.writable(id)?;
        let started = Instant::now();
        let mut ledger = ds.ledger.write().await;
        self.locked_checks(&ds, &mut ledger).await?;
        if let Some(previous) = ledger.check_step(&report)? {
            return Ok(previous);
        }
        let part = report.part_or_whole();
        let record = Record {
            dataset: id.to_string(),
            kind: RecordKind::StepPart,
            step: Some(report.step),
            part: Some(part.index),
            payload: payload_from_report(&report).encode(),
        };
        match self.persist(vec![record]).await {
            Ok(()) => {}
            Err(e @ (StoreError::Duplicate { .. } | StoreError::OutcomeUnknown { .. })) => {
                // Memory may be behind the log (another process stored this step, or
                // our commit's outcome is unknown): rebuild from the log and answer
                // from there. An identical report is then a retry; nothing else is
                // acknowledged.
                tracing::warn!(dataset = id, step = report.step, error = %e, "reloading the dataset from the log");
                match self.reload_into(&ds, &mut ledger).await {
                    Ok(()) => {}
                    Err(p) => {
                        ds.stale.store(true, Ordering::Release);
                        return Err(p);
                    }
                }
                return match ledger.check_step(&report)? {
                    Some(previous) => Ok(previous),
                    None => Err(store_problem(e)),
                };
            }
            Err(e) => return Err(store_problem(e)),
        }
        let outcome = ledger.step(&report).map_err(|e| {
            // check_step promised this cannot happen; the log is the truth, so the
            // next request reloads the ledger from it.
            tracing::error!(dataset = id, step = report.step, error = %e, "step persisted but not applied");
            ds.stale.store(true, Ordering::Release);
            Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "step recorded but not applied: the dataset will be reloaded from the log; retry")
        })?;
        if outcome.complete {
            self.policy_release(&ds, &mut ledger).await;
        }
        metrics::counter!("dpledger_steps_total").increment(1);
        metrics::counter!("dpledger_norms_ingested_total").increment(report.ids.len() as u64);
        metrics::histogram!("dpledger_step_seconds").record(started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    /// Apply a full-batch refresh: validate, persist, apply.
    pub async fn refresh(
        &self,
        id: &str,
        ids: Vec<u64>,
        norms: Vec<f64>,
    ) -> Result<RefreshOutcome, Problem> {
        let ds = self.writable(id)?;
        let mut ledger = ds.ledger.write().await;
        self.locked_checks(&ds, &mut ledger).await?;
        ledger.check_refresh(&ids, &norms)?;
        let payload = StepPayload {
            step: ledger.next_step(),
            part: None,
            noise_multiplier: None,
            sampling_rate: None,
            ids,
            norms,
        };
        let record = Record {
            dataset: id.to_string(),
            kind: RecordKind::Refresh,
            step: None,
            part: None,
            payload: payload.encode(),
        };
        // The refresh may be in the log even on error: memory then catches up first.
        self.persist_change(&ds, vec![record]).await?;
        ledger.refresh(&payload.ids, &payload.norms).map_err(|e| {
            tracing::error!(dataset = id, error = %e, "refresh persisted but not applied");
            ds.stale.store(true, Ordering::Release);
            Problem::internal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "refresh recorded but not applied: the dataset will be reloaded from the log",
            )
        })
    }

    /// Archive a dataset: read-only from then on, never deleted.
    pub async fn archive(&self, id: &str) -> Result<(), Problem> {
        let ds = self.dataset(id)?;
        let mut ledger = ds.ledger.write().await;
        if ds.archived.load(Ordering::Acquire) {
            return Ok(());
        }
        self.locked_checks(&ds, &mut ledger).await?;
        let record = Record {
            dataset: id.to_string(),
            kind: RecordKind::Archived,
            step: None,
            part: None,
            payload: Vec::new(),
        };
        self.persist_change(&ds, vec![record]).await?;
        ds.archived.store(true, Ordering::Release);
        Ok(())
    }
}

/// The durable encoding of a step report.
pub fn payload_from_report(report: &StepReport) -> StepPayload {
    StepPayload {
        step: report.step,
        part: report.part.map(|p| (p.index, p.count)),
        noise_multiplier: report.noise_multiplier,
        sampling_rate: report.sampling_rate,
        ids: report.ids.clone(),
        norms: report.norms.clone(),
    }
}

/// The step report a durable (or binary HTTP) payload encodes.
pub fn report_from_payload(payload: StepPayload) -> StepReport {
    StepReport {
        step: payload.step,
        ids: payload.ids,
        norms: payload.norms,
        noise_multiplier: payload.noise_multiplier,
        sampling_rate: payload.sampling_rate,
        part: payload
            .part
            .map(|(index, count)| crate::ledger::Part { index, count }),
    }
}

/// Apply one stored record during recovery; `Err` describes why it does not apply.
fn apply_record(
    datasets: &DashMap<String, Arc<Dataset>>,
    stored: &StoredRecord,
) -> Result<(), String> {
    let rec = &stored.record;
    let existing = || {
        datasets
            .get(&rec.dataset)
            .map(|d| d.clone())
            .ok_or_else(|| format!("record for unknown dataset {:?}", rec.dataset))
    };
    match rec.kind {
        RecordKind::DatasetCreated => {
            let payload: CreatedPayload =
                serde_json::from_slice(&rec.payload).map_err(|e| format!("dataset config: {e}"))?;
            let ledger = Ledger::new(payload.config).map_err(|e| format!("dataset config: {e}"))?;
            if datasets.contains_key(&rec.dataset) {
                return Err(format!("dataset {:?} created twice", rec.dataset));
            }
            datasets.insert(
                rec.dataset.clone(),
                Arc::new(Dataset::new(&rec.dataset, ledger)),
            );
        }
        RecordKind::StepPart => {
            let ds = existing()?;
            let payload =
                StepPayload::decode(&rec.payload).map_err(|e| format!("step payload: {e}"))?;
            let report = report_from_payload(payload);
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let outcome = ledger
                .step(&report)
                .map_err(|e| format!("step {} does not apply: {e}", report.step))?;
            if outcome.duplicate {
                return Err(format!("step {} recorded twice", report.step));
            }
        }
        RecordKind::Refresh => {
            let ds = existing()?;
            let payload =
                StepPayload::decode(&rec.payload).map_err(|e| format!("refresh payload: {e}"))?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            if ledger.next_step() != payload.step {
                return Err(format!(
                    "refresh recorded before step {} but the log reaches step {}",
                    payload.step,
                    ledger.next_step()
                ));
            }
            ledger
                .refresh(&payload.ids, &payload.norms)
                .map_err(|e| format!("refresh does not apply: {e}"))?;
        }
        RecordKind::Archived => {
            existing()?.archived.store(true, Ordering::Release);
        }
        RecordKind::Release => {
            let ds = existing()?;
            let release: crate::release::Release =
                serde_json::from_slice(&rec.payload).map_err(|e| format!("release: {e}"))?;
            let mut ledger = ds
                .ledger
                .try_write()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let mut book = ds.book.write().unwrap_or_else(|e| e.into_inner());
            apply_release(&mut ledger, &mut book, release)?;
        }
        kind @ (RecordKind::BudgetChange | RecordKind::Labels | RecordKind::ReleasePolicy) => {
            let ds = existing()?;
            let ledger = ds
                .ledger
                .try_read()
                .map_err(|_| "ledger busy during recovery".to_string())?;
            let mut book = ds.book.write().unwrap_or_else(|e| e.into_inner());
            apply_setting(&ledger, &mut book, kind, &rec.payload)?;
        }
    }
    Ok(())
}

/// Release settings given when a dataset is created.
#[derive(Debug, Clone, Default)]
pub struct DatasetSetup {
    /// Release budget in zCDP `rho`.
    pub release_budget: Option<f64>,
    /// Labels of examples `0..labels.len()`.
    pub labels: Option<Vec<Option<String>>>,
    /// Automatic release policy.
    pub release_policy: Option<ReleasePolicy>,
}

impl DatasetSetup {
    /// Validate against the new ledger and encode as the records stored with the
    /// creation.
    fn records(&self, id: &str, ledger: &Ledger) -> Result<Vec<Record>, Problem> {
        let mut out = Vec::new();
        if let Some(rho) = self.release_budget {
            out.push(json_record(
                id,
                RecordKind::BudgetChange,
                &BudgetPayload { rho_budget: rho },
            )?);
        }
        if let Some(labels) = &self.labels {
            if labels.len() as u64 > ledger.examples() {
                return Err(Problem::bad_request(format!(
                    "{} labels for {} examples",
                    labels.len(),
                    ledger.examples()
                ))
                .with_field("labels"));
            }
            let a = LabelAssignment {
                ids: (0..labels.len() as u64).collect(),
                labels: labels.clone(),
            };
            crate::release::Labels::default().check(ledger.examples(), &a)?;
            out.push(json_record(id, RecordKind::Labels, &a)?);
        }
        if let Some(p) = &self.release_policy {
            let mut p = p.clone();
            p.validate()?;
            out.push(json_record(
                id,
                RecordKind::ReleasePolicy,
                &PolicyPayload { policy: Some(p) },
            )?);
        }
        Ok(out)
    }
}

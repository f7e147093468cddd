//! The commands that change a dataset's ledger: create, step, refresh, archive.
//! Each follows validate → persist → apply with the dataset's write lock held
//! from check to apply (see the module doc of [`crate::engine`]).

use super::book::{apply_setting, export_gauges, json_record, BudgetPayload, PolicyPayload};
use super::dataset::{valid_dataset_id, Dataset};
use super::error::{EngineError, EngineResult};
use super::idempotency::Persisted;
use super::Engine;
use crate::ledger::DatasetConfigExt;
use crate::ledger::{
    DatasetConfig, IdempotencyKey, Ledger, RefreshOutcome, StepOutcome, StepReport,
};
use crate::release::{LabelAssignment, ReleasePolicy};
use crate::store::codec::StepPayload;
use crate::store::{Record, RecordKind, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Payload of a `DatasetCreated` record.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CreatedPayload {
    pub(super) config: DatasetConfig,
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
    fn records(&self, id: &str, ledger: &Ledger) -> EngineResult<Vec<Record>> {
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
                return Err(EngineError::BadRequest {
                    detail: format!("{} labels for {} examples", labels.len(), ledger.examples()),
                    field: Some("labels"),
                });
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

impl Engine {
    /// Create a dataset, with its optional release settings (stored with the
    /// creation, atomically). A conflict if the id is taken, unless by this very
    /// creation (the same idempotency `key` and request): then the dataset.
    pub async fn create_dataset(
        &self,
        id: &str,
        config: DatasetConfig,
        setup: DatasetSetup,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<Arc<Dataset>> {
        // A shard of a sharded dataset (cluster mode, `sharding/layout.rs`) is
        // created by the node coordinating its dataset's creation.
        match &self.cluster {
            Some(_) if !valid_dataset_id(id) => {
                self.check_shard_creation(id, &config, setup.release_policy.as_ref())
                    .await?
            }
            _ if !valid_dataset_id(id) => {
                return Err(EngineError::BadRequest {
                    detail: "id must be 1-64 characters of A-Z a-z 0-9 . _ - (and not . or ..)"
                        .to_string(),
                    field: Some("id"),
                })
            }
            _ => super::sharding::check_no_shard_fields(&config)?,
        }
        // The threshold mode and the ex-post orders become explicit in the
        // stored configuration, so that a replay never re-derives them.
        let config = config.with_creation_defaults()?;
        let mut ledger = Ledger::new(config.clone())?;
        let settings = setup.records(id, &ledger)?;
        if ledger.awaits_budget_labels() {
            let Some(labels) = &setup.labels else {
                return Err(EngineError::BadRequest {
                    detail: "label_budgets give the examples of a label their budget from the \
                             labels given at creation: send labels with the dataset"
                        .to_string(),
                    field: Some("labels"),
                });
            };
            ledger.assign_budget_labels(labels)?;
        }
        if let (Some(existing), Some(key)) = (self.datasets.get(id).map(|d| d.clone()), &key) {
            if let Some(found) = self.find_key(id, &key.key).await? {
                if found.request != key.request {
                    return Err(EngineError::KeyReused {
                        key: key.key.clone(),
                    });
                }
                return Ok(existing);
            }
        }
        // The entry is reserved first so two concurrent creates cannot both persist.
        let dataset = Arc::new(Dataset::new(id, ledger));
        let mut guard = dataset.ledger.write().await;
        // Cluster mode: placed on this node, whose new lease is claimed first
        // so that the creation record is fenced like every other.
        let _creating = match &self.cluster {
            Some(node) => {
                let (epoch, creating) = node.claim_new(id).await?;
                dataset
                    .epoch
                    .store(epoch, std::sync::atomic::Ordering::Release);
                Some(creating)
            }
            None => None,
        };
        match self.datasets.entry(id.to_string()) {
            dashmap::Entry::Occupied(_) => {
                return Err(EngineError::conflict(format!(
                    "dataset {id:?} already exists"
                )))
            }
            dashmap::Entry::Vacant(v) => {
                v.insert(dataset.clone());
            }
        }
        if let Some(key) = &key {
            // The creation this key made may be in the log but not in memory (its
            // outcome was unknown, or another process made it).
            match self.find_key(id, &key.key).await {
                Ok(None) => {}
                Ok(Some(found)) if found.request == key.request => {
                    if let Err(e) = self.reload_into(&dataset, &mut guard).await {
                        self.datasets.remove_if(id, |_, d| Arc::ptr_eq(d, &dataset));
                        return Err(e);
                    }
                    drop(guard);
                    return Ok(dataset);
                }
                Ok(Some(_)) => {
                    self.datasets.remove_if(id, |_, d| Arc::ptr_eq(d, &dataset));
                    return Err(EngineError::KeyReused {
                        key: key.key.clone(),
                    });
                }
                Err(e) => {
                    self.datasets.remove_if(id, |_, d| Arc::ptr_eq(d, &dataset));
                    return Err(e);
                }
            }
        }
        let payload = serde_json::to_vec(&CreatedPayload { config }).map_err(|e| {
            EngineError::BadRequest {
                detail: e.to_string(),
                field: None,
            }
        })?;
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
        if let Err(e) = self.persist(&dataset, records, key).await {
            if matches!(e, StoreError::OutcomeUnknown { .. }) {
                // The creation may be in the log: keep the entry only if it is.
                // Until that is known the dataset is stale (refused to readers)
                // and reloaded in the background: forgotten if not in the log.
                match self.reload_into(&dataset, &mut guard).await {
                    Ok(()) => {
                        drop(guard);
                        return Ok(dataset);
                    }
                    Err(EngineError::NotFound(_)) => {}
                    Err(_) => {
                        drop(guard);
                        self.heal(&dataset);
                        return Err(EngineError::store(e));
                    }
                }
            }
            if matches!(e, StoreError::Fenced { .. }) {
                return Err(self.lose(&dataset));
            }
            self.datasets.remove_if(id, |_, d| Arc::ptr_eq(d, &dataset));
            return Err(EngineError::store(e));
        }
        {
            let mut book = dataset.book_write();
            for (kind, payload) in &applied {
                // Checked by `DatasetSetup::records` against this very ledger.
                if let Err(e) = apply_setting(&guard, &mut book, *kind, payload) {
                    tracing::error!(dataset = id, error = %e, "setting persisted but not applied");
                    self.heal(&dataset);
                }
            }
            export_gauges(id, &book);
        }
        drop(guard.downgrade());
        Ok(dataset)
    }

    /// Apply one step report (or part): validate, persist, apply.
    pub async fn report_step(&self, id: &str, report: StepReport) -> EngineResult<StepOutcome> {
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
            payload: StepPayload::from(&report).encode(),
        };
        match self.persist(&ds, vec![record], None).await {
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
                        self.heal(&ds);
                        // Still unknown: say so (a retry of the step is safe).
                        return Err(if matches!(e, StoreError::OutcomeUnknown { .. }) {
                            EngineError::store(e)
                        } else {
                            p
                        });
                    }
                }
                return match ledger.check_step(&report)? {
                    Some(previous) => {
                        // The reload found this very step applied: start its
                        // policy release, if due (nothing else has).
                        if previous.complete {
                            self.policy_release(&ds, &mut ledger);
                        }
                        Ok(previous)
                    }
                    None => Err(EngineError::store(e)),
                };
            }
            Err(e) => return Err(EngineError::store(e)),
        }
        let outcome = ledger.step(&report).map_err(|e| {
            // check_step promised this cannot happen; the log is the truth, so the
            // next request reloads the ledger from it.
            tracing::error!(dataset = id, step = report.step, error = %e, "step persisted but not applied");
            self.heal(&ds);
            EngineError::Internal(
                "step recorded but not applied: the dataset will be reloaded from the log; retry"
                    .to_string(),
            )
        })?;
        if outcome.complete {
            self.policy_release(&ds, &mut ledger);
        }
        metrics::counter!("dpledger_steps_total").increment(1);
        metrics::counter!("dpledger_norms_ingested_total").increment(report.ids.len() as u64);
        metrics::histogram!("dpledger_step_seconds").record(started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    /// Apply a full-batch refresh: validate, persist, apply. A retry with the
    /// same idempotency `key` is answered from the refresh it made (with the
    /// ids' thresholds as they are now), never applied twice.
    pub async fn refresh(
        &self,
        id: &str,
        ids: Vec<u64>,
        norms: Vec<f64>,
        key: Option<IdempotencyKey>,
    ) -> EngineResult<RefreshOutcome> {
        let ds = self.dataset(id)?;
        let mut ledger = ds.ledger.write().await;
        if let Some(done) = self.replayed(&ds, &mut ledger, key.as_ref()).await? {
            return refresh_answer(&ledger, &ids, &done.answer);
        }
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
        let key = key.map(|k| IdempotencyKey {
            answer: payload.step.to_string().into_bytes(),
            ..k
        });
        // The refresh may be in the log even on error: memory then catches up first.
        if let Persisted::Done(done) = self
            .persist_keyed(&ds, &mut ledger, vec![record], key)
            .await?
        {
            return refresh_answer(&ledger, &payload.ids, &done.answer);
        }
        ledger.refresh(&payload.ids, &payload.norms).map_err(|e| {
            tracing::error!(dataset = id, error = %e, "refresh persisted but not applied");
            self.heal(&ds);
            EngineError::Internal(
                "refresh recorded but not applied: the dataset will be reloaded from the log"
                    .to_string(),
            )
        })
    }

    /// Archive a dataset: read-only from then on, never deleted. Archiving an
    /// archived dataset changes nothing (and is answered as a success).
    pub async fn archive(&self, id: &str, key: Option<IdempotencyKey>) -> EngineResult<()> {
        let ds = self.dataset(id)?;
        let mut ledger = ds.ledger.write().await;
        if self
            .replayed(&ds, &mut ledger, key.as_ref())
            .await?
            .is_some()
            || ds.archived.load(Ordering::Acquire)
        {
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
        if let Persisted::Stored = self
            .persist_keyed(&ds, &mut ledger, vec![record], key)
            .await?
        {
            ds.archived.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// The answer to a retried refresh: the step it took effect at (stored with
/// its key), and the refreshed ids' thresholds and retirements as they are now.
fn refresh_answer(ledger: &Ledger, ids: &[u64], stored: &[u8]) -> EngineResult<RefreshOutcome> {
    let effective_step = std::str::from_utf8(stored)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            EngineError::Internal("the stored answer of this refresh is unreadable".to_string())
        })?;
    let mut thresholds = Vec::with_capacity(ids.len());
    let mut retired = Vec::new();
    for &i in ids {
        let range = i..i.saturating_add(1);
        thresholds.extend(ledger.thresholds(range.clone())?);
        retired.extend(ledger.retired_in(range));
    }
    Ok(RefreshOutcome {
        effective_step,
        thresholds,
        retired,
        refresh_due: ledger.refresh_due(),
    })
}

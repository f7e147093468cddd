//! Exactly once, in order (spec §3): steps are numbered, a gap is refused, a
//! retry with identical content gets the original answer (within the retry
//! window) and changes nothing, different content is a conflict. A step may come
//! in parts (data-parallel workers): each part is idempotent, parts are disjoint
//! and agree on count and hyperparameters, and the step is applied when its last
//! part arrives.

use super::columns::{PENDING, RETIRED};
use super::{Ledger, StepParams};
use crate::ledger::error::LedgerError;
use crate::ledger::protocol::{Part, StepOutcome, StepReport};

/// How many applied steps keep their answers for retries. Older retries get
/// [`LedgerError::Archived`]. A retry is a network-level event, so a short window
/// suffices, and it bounds memory to `window × batch` thresholds.
pub const RETRY_WINDOW: u64 = 32;

/// Most parts one step may be split into.
pub const MAX_PARTS: u32 = 4096;

/// The result of validating a step report.
pub(super) enum CheckedStep {
    /// A retry: the answer to give, nothing to apply.
    Answer(StepOutcome),
    /// A new step (or part) that will apply.
    Fresh {
        part: Part,
        hash: u64,
        params: StepParams,
        thresholds: Vec<f64>,
    },
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct PendingPart {
    pub(super) hash: u64,
    pub(super) ids: Vec<u64>,
    pub(super) norms: Vec<f64>,
    pub(super) outcome: StepOutcome,
}

/// A multi-part step whose parts are arriving. Nothing of it is applied yet.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) step: u64,
    pub(super) count: u32,
    pub(super) noise_bits: Option<u64>,
    pub(super) rate_bits: Option<u64>,
    pub(super) params: StepParams,
    pub(super) parts: Vec<Option<PendingPart>>,
    pub(super) received: u32,
}

/// The answers of one applied step, kept for retries.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct StepRecord {
    pub(super) step: u64,
    pub(super) parts: Vec<(u64, StepOutcome)>,
}

impl Ledger {
    /// Every check of [`Ledger::step`], without mutating.
    pub(super) fn validate_step(
        &mut self,
        report: &StepReport,
    ) -> Result<CheckedStep, LedgerError> {
        let part = report.part_or_whole();
        if part.count == 0 || part.count > MAX_PARTS || part.index >= part.count {
            return Err(LedgerError::invalid(
                "part",
                format!(
                    "needs 1 <= count <= {MAX_PARTS} and index < count, got index {} of count {}",
                    part.index, part.count
                ),
            ));
        }
        let hash = report.content_hash();
        if report.step < self.next_step {
            return self
                .answer_retry(report.step, part, hash, &report.ids)
                .map(CheckedStep::Answer);
        }
        if report.step > self.next_step {
            return Err(LedgerError::OutOfOrder {
                expected: self.next_step,
                got: report.step,
            });
        }
        let t = report.step;
        if self.pending.is_none() {
            self.check_refresh_arrived(t)?;
        }
        let noise_bits = report.noise_multiplier.map(|x| (x + 0.0).to_bits());
        let rate_bits = report.sampling_rate.map(|x| (x + 0.0).to_bits());
        let params = if let Some(p) = &self.pending {
            if let Some(Some(received)) = p.parts.get(part.index as usize) {
                return if received.hash == hash {
                    Ok(CheckedStep::Answer(StepOutcome {
                        duplicate: true,
                        ..received.outcome.clone()
                    }))
                } else {
                    Err(LedgerError::Conflict {
                        step: t,
                        reason: format!(
                            "part {} was already received with different content",
                            part.index
                        ),
                    })
                };
            }
            if p.count != part.count {
                return Err(LedgerError::Conflict {
                    step: t,
                    reason: format!(
                        "earlier parts announced {} parts, this one says {}",
                        p.count, part.count
                    ),
                });
            }
            if p.noise_bits != noise_bits || p.rate_bits != rate_bits {
                return Err(LedgerError::Conflict {
                    step: t,
                    reason:
                        "parts of one step must carry the same noise_multiplier and sampling_rate"
                            .into(),
                });
            }
            p.params.clone()
        } else {
            self.resolve_params(report)?
        };
        let thresholds = self.check_batch(&report.ids, &report.norms, Some(t))?;
        Ok(CheckedStep::Fresh {
            part,
            hash,
            params,
            thresholds,
        })
    }

    /// Validate a step report without changing anything (it takes `&mut self` only
    /// to mark and unmark ids while detecting duplicates in O(batch)): `Ok(Some(answer))` for a
    /// retry (the answer `step` would give), `Ok(None)` when `step` would apply it.
    /// Whenever this returns `Ok(None)`, `step` with the same report and no call in
    /// between succeeds: a server can persist the report in between and never
    /// store something the ledger refuses.
    pub fn check_step(&mut self, report: &StepReport) -> Result<Option<StepOutcome>, LedgerError> {
        Ok(match self.validate_step(report)? {
            CheckedStep::Answer(outcome) => Some(outcome),
            CheckedStep::Fresh { .. } => None,
        })
    }

    /// Apply (or receive one part of) a step. See the module documentation of
    /// [`crate::ledger`] for the protocol; errors leave the ledger unchanged.
    pub fn step(&mut self, report: &StepReport) -> Result<StepOutcome, LedgerError> {
        let (part, hash, params, thresholds) = match self.validate_step(report)? {
            CheckedStep::Answer(outcome) => return Ok(outcome),
            CheckedStep::Fresh {
                part,
                hash,
                params,
                thresholds,
            } => (part, hash, params, thresholds),
        };
        let t = report.step;
        let noise_bits = report.noise_multiplier.map(|x| (x + 0.0).to_bits());
        let rate_bits = report.sampling_rate.map(|x| (x + 0.0).to_bits());
        // Everything is valid from here on: no error may occur below.
        let mut outcome = StepOutcome {
            step: t,
            duplicate: false,
            part: report.part,
            complete: false,
            thresholds,
            retired: Vec::new(),
            refresh_due: None,
        };
        if part.count == 1 {
            outcome.retired = self.apply_step(t, &params, &[(&report.ids, &report.norms)]);
            outcome.complete = true;
            outcome.refresh_due = self.refresh_due();
            self.zero_retired(&report.ids, &mut outcome);
            self.remember(StepRecord {
                step: t,
                parts: vec![(hash, outcome.clone())],
            });
            return Ok(outcome);
        }
        // A part of a multi-part step: keep it until the last part arrives.
        for &id in &report.ids {
            self.flags[id as usize] |= PENDING;
        }
        let mut pending = self.pending.take().unwrap_or_else(|| Pending {
            step: t,
            count: part.count,
            noise_bits,
            rate_bits,
            params: params.clone(),
            parts: vec![None; part.count as usize],
            received: 0,
        });
        pending.received += 1;
        if pending.received < pending.count {
            pending.parts[part.index as usize] = Some(PendingPart {
                hash,
                ids: report.ids.clone(),
                norms: report.norms.clone(),
                outcome: outcome.clone(),
            });
            self.pending = Some(pending);
            return Ok(outcome);
        }
        // The last part: apply the whole step.
        let mut batches: Vec<(&[u64], &[f64])> = Vec::with_capacity(pending.parts.len());
        for (index, slot) in pending.parts.iter().enumerate() {
            match slot {
                Some(p) => batches.push((&p.ids, &p.norms)),
                None if index == part.index as usize => batches.push((&report.ids, &report.norms)),
                None => {} // unreachable: received == count
            }
        }
        for (ids, _) in &batches {
            for &id in ids.iter() {
                self.flags[id as usize] &= !PENDING;
            }
        }
        outcome.retired = self.apply_step(t, &params, &batches);
        outcome.complete = true;
        outcome.refresh_due = self.refresh_due();
        self.zero_retired(&report.ids, &mut outcome);
        drop(batches);
        let parts = pending
            .parts
            .into_iter()
            .map(|slot| match slot {
                Some(p) => (p.hash, p.outcome),
                None => (hash, outcome.clone()),
            })
            .collect();
        self.remember(StepRecord { step: t, parts });
        Ok(outcome)
    }

    /// Ids that the step itself retired get threshold 0 in its answer (they are also
    /// listed in `retired`).
    pub(super) fn zero_retired(&self, ids: &[u64], outcome: &mut StepOutcome) {
        if outcome.retired.is_empty() {
            return;
        }
        for (th, &id) in outcome.thresholds.iter_mut().zip(ids) {
            if self.flags[id as usize] & RETIRED != 0 {
                *th = 0.0;
            }
        }
    }

    /// The answer to a retry of an already applied step.
    /// `ids` are the retried report's (the same as the stored part's: their
    /// content hashes match).
    pub(super) fn answer_retry(
        &self,
        step: u64,
        part: Part,
        hash: u64,
        ids: &[u64],
    ) -> Result<StepOutcome, LedgerError> {
        let oldest = self.history.front().map_or(self.next_step, |r| r.step);
        let record = step
            .checked_sub(oldest)
            .and_then(|k| self.history.get(k as usize))
            .filter(|r| r.step == step);
        let Some(record) = record else {
            return Err(LedgerError::Archived {
                step,
                window: RETRY_WINDOW,
            });
        };
        if record.parts.len() != part.count as usize {
            return Err(LedgerError::Conflict {
                step,
                reason: format!(
                    "the step was applied in {} part(s), this report says {}",
                    record.parts.len(),
                    part.count
                ),
            });
        }
        let Some((stored_hash, outcome)) = record.parts.get(part.index as usize) else {
            return Err(LedgerError::invalid("part", "index out of range"));
        };
        if *stored_hash != hash {
            return Err(LedgerError::Conflict {
                step,
                reason: "the step (or this part) was already applied with different content".into(),
            });
        }
        // The step is applied now (it is behind the next step), whichever
        // part completed it: a retry of an earlier part says so, so that a
        // sharded dataset's merged answer (every shard complete) is true once
        // every shard has the step, even when one shard's part was a retry.
        let mut answer = StepOutcome {
            duplicate: true,
            complete: true,
            ..outcome.clone()
        };
        // A part stored before the step completed answered without the
        // step's retirements: complete now, it carries them as the completing
        // part did (the sorted `retired`, and threshold 0 for its own ids the
        // step retired), so that a trainer never keeps clipping a retired
        // example at a non-zero threshold.
        if !outcome.complete {
            if let Some((_, completing)) = record.parts.iter().find(|(_, o)| o.complete) {
                answer.retired = completing.retired.clone();
                answer.refresh_due = completing.refresh_due.clone();
            }
            for (th, id) in answer.thresholds.iter_mut().zip(ids) {
                if answer.retired.binary_search(id).is_ok() {
                    *th = 0.0;
                }
            }
        }
        Ok(answer)
    }

    pub(super) fn remember(&mut self, record: StepRecord) {
        if self.history.len() as u64 >= RETRY_WINDOW {
            self.history.pop_front();
        }
        self.history.push_back(record);
    }

    pub(super) fn refuse_if_pending(&self, action: &'static str) -> Result<(), LedgerError> {
        match &self.pending {
            Some(p) => Err(LedgerError::StepInProgress {
                step: p.step,
                received: p.received,
                count: p.count,
                action,
            }),
            None => Ok(()),
        }
    }
}

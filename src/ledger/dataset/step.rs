//! One step's validation and accrual (spec §3.2–§3.4): resolving its
//! hyperparameters, checking its batch, charging every example (sampled ones at
//! `v_min(b_i, bucket(g_i))`, the others through the prefix sums), moving the
//! thresholds; refreshes (§3.5); and compaction of the prefix-sum segments.

use super::columns::{prefetch, ALL_TOP, PENDING, PREFETCH_AHEAD, RETIRED, SEEN};
use super::compact::Eval;
use super::levels::{SegmentParams, MAX_SEGMENTS};
use super::view::save_for_view;
use super::{Accrual, Ledger, StepParams};
use crate::accounting::table::StepMechanism;
use crate::accounting::validate;
use crate::ledger::error::LedgerError;
use crate::ledger::filter::next_check;
use crate::ledger::protocol::{check_norms, RefreshOutcome, StepReport};

/// Segments are compacted once their bases take more than this many bytes (or a
/// quarter of the RDP vectors, whichever is larger): a compaction costs one pass
/// over all examples, which this amortises over many changes of hyperparameters.
const MIN_SEGMENT_BUDGET: usize = 32 << 20;

impl Ledger {
    /// Validate a step's hyperparameter overrides and fetch its table.
    pub(super) fn resolve_params(&self, report: &StepReport) -> Result<StepParams, LedgerError> {
        let sigma = match report.noise_multiplier {
            Some(s) => validate::positive_noise_multiplier("noise_multiplier", s)?,
            None => self.default_sigma,
        };
        let mechanism = match self.accrual {
            Accrual::Poisson(_) => {
                let q = match report.sampling_rate {
                    Some(q) => validate::sampling_rate("sampling_rate", q)?,
                    None => self.default_rate,
                };
                StepMechanism::Poisson { q, sigma }
            }
            Accrual::Shuffle(ref state) => {
                if let Some(q) = report.sampling_rate {
                    return Err(LedgerError::invalid(
                        "sampling_rate",
                        format!("a shuffled dataset has no sampling rate (got {q}); only noise_multiplier may change per step"),
                    ));
                }
                // The predictable mode booked the epoch's charges at its first
                // step: a later step may not add noise-less exposure.
                if let Some(booked) = state.booked_sigma {
                    let first = report.step % state.steps_per_epoch == 0;
                    if !first && sigma < booked {
                        return Err(LedgerError::invalid(
                            "noise_multiplier",
                            format!(
                                "{sigma} is below {booked}, the noise multiplier this epoch's charge was booked at (its first step); a smaller one may start only at an epoch's first step"
                            ),
                        ));
                    }
                }
                StepMechanism::Gaussian { sigma }
            }
        };
        let current = self.next_params();
        if current.mechanism == mechanism {
            return Ok(current.clone());
        }
        if !self.levels.has_room_for(SegmentParams::of(mechanism)) {
            return Err(LedgerError::invalid(
                "noise_multiplier",
                format!(
                    "the dataset has had {MAX_SEGMENTS} distinct (sampling_rate, noise_multiplier) \
                     settings, the most its per-example history can record; reuse one of them"
                ),
            ));
        }
        let table = self.tables.get(&self.grid, mechanism, &self.orders);
        Ok(StepParams { mechanism, table })
    }

    /// Check a batch (ids in range, distinct, not in another part of the step in
    /// progress; norms finite and `>= 0`; lengths equal; in shuffle mode, not yet
    /// processed in this epoch). `step` is `None` for refreshes. Leaves the ledger
    /// exactly as it found it. Returns the thresholds the report gives its ids (0
    /// for retired examples), computed in the same pass.
    pub(super) fn check_batch(
        &mut self,
        ids: &[u64],
        norms: &[f64],
        step: Option<u64>,
    ) -> Result<Vec<f64>, LedgerError> {
        if ids.len() != norms.len() {
            return Err(LedgerError::invalid(
                "norms",
                format!("has {} entries but ids has {}", norms.len(), ids.len()),
            ));
        }
        check_norms(norms)?;
        let n = self.n as u64;
        let epoch = match (&self.accrual, step) {
            (Accrual::Shuffle(s), Some(t)) => Some((t / s.steps_per_epoch, s.steps_per_epoch)),
            _ => None,
        };
        let mut error = None;
        let mut marked = 0;
        for (j, &id) in ids.iter().enumerate() {
            if let Some(&ahead) = ids.get(j + PREFETCH_AHEAD) {
                prefetch(&self.flags, ahead as usize);
            }
            if id >= n {
                error = Some(LedgerError::invalid(
                    "ids",
                    format!("ids[{j}] = {id} is out of range: the dataset has {n} examples (ids 0..{n})"),
                ));
                break;
            }
            let i = id as usize;
            let f = self.flags[i];
            if f & SEEN != 0 {
                let first = ids[..j].iter().position(|&x| x == id).unwrap_or(0);
                error = Some(LedgerError::invalid(
                    "ids",
                    format!("id {id} appears twice in one report (ids[{first}] and ids[{j}])"),
                ));
                break;
            }
            if f & PENDING != 0 {
                let t = step.unwrap_or(self.next_step);
                let part = self
                    .pending
                    .as_ref()
                    .and_then(|p| {
                        p.parts
                            .iter()
                            .position(|s| s.as_ref().is_some_and(|s| s.ids.contains(&id)))
                    })
                    .unwrap_or(0);
                error = Some(LedgerError::Conflict {
                    step: t,
                    reason: format!(
                        "id {id} is already in part {part} of this step; parts must be disjoint"
                    ),
                });
                break;
            }
            if let (Some((e, spe)), Some(t)) = (epoch, step) {
                if f & RETIRED == 0 && self.since[i] > e {
                    let done = self.since[i] - 1;
                    error = Some(LedgerError::EpochViolation {
                        step: t,
                        id,
                        epoch: done,
                        first_step: done.saturating_mul(spe),
                        last_step: done.saturating_mul(spe).saturating_add(spe - 1),
                    });
                    break;
                }
            }
            self.flags[i] |= SEEN;
            marked = j + 1;
        }
        if let Some(error) = error {
            for &id in &ids[..marked] {
                self.flags[id as usize] &= !SEEN;
            }
            return Err(error);
        }
        // A step report moves thresholds only in the sampled mode; in the
        // predictable mode its answer repeats the thresholds in force.
        let moves = step.is_none() || !self.config.is_predictable();
        let mut thresholds = Vec::with_capacity(ids.len());
        for (&id, &g) in ids.iter().zip(norms) {
            let f = &mut self.flags[id as usize];
            *f &= !SEEN;
            thresholds.push(if *f & RETIRED != 0 {
                0.0
            } else if moves {
                self.grid.value(self.grid.bucket_of(g))
            } else {
                self.grid.value(self.bucket[id as usize])
            });
        }
        Ok(thresholds)
    }

    /// Apply validated step `t`: accrue, move thresholds, run the filter. Returns the
    /// ids retired from step `t + 1` on. Infallible by construction.
    ///
    /// The loop touches each reported example once: its columns and RDP row are
    /// prefetched a few reports ahead, and the filter's check of the example is done
    /// while its row is still in cache.
    pub(super) fn apply_step(
        &mut self,
        t: u64,
        params: &StepParams,
        batches: &[(&[u64], &[f64])],
    ) -> Vec<u64> {
        let now = t + 1;
        self.current = params.clone();
        let recompute = self.filter_update_bound();
        let poisson = matches!(self.accrual, Accrual::Poisson(_));
        let segment = SegmentParams::of(params.mechanism);
        let shuffle_segment = if poisson {
            self.levels.begin_poisson_step(t, segment);
            None
        } else {
            self.levels.shuffle_segment(segment)
        };
        self.sync_seg_tables();
        // The predictable mode charges every example at its threshold (the
        // threshold ledger, spec §3.4): a report changes nothing, so the
        // per-report loop below is skipped and the filter's queued checks stand.
        let moves_thresholds = !self.config.is_predictable();
        // Per-report filter checks, unless the bound grew and all are redone below.
        let mut checks = if recompute || !moves_thresholds {
            None
        } else {
            self.filter.as_mut()
        };
        let mut epoch_begins = false;
        let (prefix, shuffle_epoch) = match &mut self.accrual {
            Accrual::Poisson(prefix) => {
                prefix.begin_step(t, params.mechanism, params.table.clone());
                (Some(&*prefix), 0)
            }
            Accrual::Shuffle(state) => {
                epoch_begins = t % state.steps_per_epoch == 0;
                if epoch_begins && !moves_thresholds {
                    state.booked_sigma = Some(params.mechanism.sigma());
                    state.booked_segment = shuffle_segment;
                }
                (None, state.begin_step(t, params.table.row(self.top)))
            }
        };
        self.pld
            .record_step(params.mechanism, (!poisson).then_some(shuffle_epoch));
        let moving: &[(&[u64], &[f64])] = if moves_thresholds { batches } else { &[] };
        for (ids, norms) in moving {
            for (j, (&id, &g)) in ids.iter().zip(norms.iter()).enumerate() {
                if let Some(&ahead) = ids.get(j + PREFETCH_AHEAD) {
                    let ahead = ahead as usize;
                    prefetch(&self.flags, ahead);
                    prefetch(&self.bucket, ahead);
                    self.levels.prefetch(ahead);
                    if let Some(f) = checks.as_deref() {
                        prefetch(&f.predicted, ahead);
                    }
                }
                let i = id as usize;
                let f = self.flags[i];
                if f & RETIRED != 0 {
                    continue; // charged nothing: its clipped norm is 0
                }
                let b = self.bucket[i];
                let kg = self.grid.bucket_of(g);
                if poisson {
                    // The open run at `b` ends when the bucket moves: before step
                    // t when it moves down (t is charged at kg), after it when up.
                    // A report that keeps the bucket changes nothing: step t is
                    // charged at `b`, inside the open run.
                    if kg != b {
                        save_for_view!(self, i, prefix);
                        self.levels.close_run(i, b, if kg < b { t } else { now });
                        self.flags[i] = f & !ALL_TOP;
                    }
                } else {
                    save_for_view!(self, i, prefix);
                    if let Some(s) = shuffle_segment {
                        self.levels.charge(i, s, b.min(kg));
                    }
                    self.since[i] = shuffle_epoch + 1;
                }
                self.bucket[i] = kg;
                if let Some(filter) = checks.as_deref_mut() {
                    let class = filter.class(i);
                    let (k, limit) = (class.index, class.limit);
                    let eval = Eval {
                        levels: &self.levels,
                        tables: &self.seg_tables,
                        prefix,
                        top: self.top,
                    };
                    // `Ledger::release_of`, by field: the accrual is borrowed.
                    let release = self.shares.own(&self.flags, i).unwrap_or(&self.release);
                    let value = eval.own_at(i, kg, self.flags[i], now, k) + release[k];
                    let c = class.bound[kg as usize];
                    let rate = if poisson { c } else { 0.0 };
                    let at = next_check(now, value, c, rate, limit);
                    filter.schedule_by(id as u32, at);
                }
            }
        }
        if !poisson && !moves_thresholds {
            // Predictable thresholds with shuffled batches (spec §3.6).
            self.mark_processed(batches, shuffle_epoch);
            if epoch_begins {
                self.book_epoch(shuffle_segment, now);
            }
        }
        if !moves_thresholds {
            // The discounted ledger, for estimates (`discounts.rs`).
            let segment = match &self.accrual {
                Accrual::Poisson(_) => self.levels.current_segment(),
                Accrual::Shuffle(s) => s.booked_segment,
            };
            if let Some(s) = segment {
                self.note_discounts(batches, s);
            }
        }
        self.next_step = now;
        self.forget_refresh_before(now);
        let retired = if recompute {
            self.filter_recompute_all()
        } else {
            self.filter_pop_due()
        };
        self.maybe_compact();
        retired
    }

    // ------------------------------------------------------------------ refresh

    /// Refresh (spec §3.2): set each reported example's threshold to the
    /// bucket of its observed norm, effective from the next step. In the
    /// predictable mode only the ids the public schedule calls for before the
    /// next step are taken, each once (possibly over several calls). Accrues nothing
    /// itself: the example's accrual so far (at its old threshold) is settled first.
    /// Retired examples stay retired. Refused while a multi-part step is incomplete.
    pub fn refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<RefreshOutcome, LedgerError> {
        let thresholds = self.validate_refresh(ids, norms)?;
        self.record_refresh(ids);
        let now = self.next_step;
        for (j, (&id, &g)) in ids.iter().zip(norms).enumerate() {
            // As in a step: the next reports' state is loaded while this one's
            // is worked on (a block's ids are contiguous, but each example's
            // level list is an allocation of its own).
            if let Some(&ahead) = ids.get(j + PREFETCH_AHEAD) {
                let ahead = ahead as usize;
                prefetch(&self.bucket, ahead);
                self.levels.prefetch(ahead);
            }
            let i = id as usize;
            let f = self.flags[i];
            if f & RETIRED != 0 {
                continue;
            }
            let kg = self.grid.bucket_of(g);
            let b = self.bucket[i];
            if kg == b {
                continue;
            }
            if let Accrual::Poisson(prefix) = &self.accrual {
                save_for_view!(self, i, Some(prefix));
                self.levels.close_run(i, b, now);
                self.flags[i] = f & !ALL_TOP;
            } else {
                save_for_view!(self, i, None);
            }
            self.bucket[i] = kg;
        }
        let retired = self.filter_after_refresh(ids);
        let mut thresholds = thresholds;
        if !retired.is_empty() {
            // Like a step's answer: an id this refresh retired has threshold 0.
            for (t, &id) in thresholds.iter_mut().zip(ids) {
                if self.flags[id as usize] & RETIRED != 0 {
                    *t = 0.0;
                }
            }
        }
        Ok(RefreshOutcome {
            effective_step: now,
            thresholds,
            retired,
            refresh_due: self.refresh_due(),
        })
    }

    /// Validate a refresh without changing anything; when this succeeds,
    /// [`Ledger::refresh`] with the same arguments and no call in between succeeds.
    pub fn check_refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<(), LedgerError> {
        self.validate_refresh(ids, norms).map(|_| ())
    }

    pub(super) fn validate_refresh(
        &mut self,
        ids: &[u64],
        norms: &[f64],
    ) -> Result<Vec<f64>, LedgerError> {
        self.refuse_if_pending("a refresh")?;
        self.check_on_schedule(ids)?;
        self.check_batch(ids, norms, None)
    }

    // ------------------------------------------------------------------ compaction

    pub(super) fn maybe_compact(&mut self) {
        if let Accrual::Poisson(prefix) = &self.accrual {
            // A quarter of what dense RDP rows would take: the same trigger as
            // before the compact form, so a replay compacts where the live ledger did.
            let budget = MIN_SEGMENT_BUDGET.max(self.n * self.m * 2);
            if prefix.len() > 1 && prefix.bytes() > budget {
                self.compact();
            }
        }
    }

    /// Settle every example up to the current step and drop all prefix-sum segments
    /// but the current one: `O(n × #orders)`. Runs automatically when segments (one
    /// per change of hyperparameters) exceed their memory budget; results are
    /// unchanged up to floating-point rounding (examples charged only at the top
    /// bucket stay bit-identical to the worst case). With a release's view open
    /// it first settles the view (`view.rs`): compaction falls at the same step
    /// with or without a view, as in a replay of the log.
    pub fn compact(&mut self) {
        if matches!(self.accrual, Accrual::Poisson(_)) {
            self.settle_view();
        }
        if let Accrual::Poisson(prefix) = &mut self.accrual {
            let first = prefix.current().start;
            for i in 0..self.n {
                // An open run that began before the current segment could not be
                // read through the prefix sums once the older segments go: close
                // it into the example's counts up to that segment (integers: no
                // rounding); the rest of it stays open.
                if self.flags[i] & (ALL_TOP | RETIRED) == 0 && self.levels.run_start(i) < first {
                    self.levels.close_run(i, self.bucket[i], first);
                }
            }
            prefix.drop_old_segments();
        }
    }
}

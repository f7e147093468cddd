//! One dataset's ledger: per-example state, the step protocol, refreshes, the
//! individual filter, releases and queries (spec §3, §6, §7).
//!
//! # Storage: columnar arrays, not a concurrent map
//!
//! Ids are dense (`0..n`), so per-example state lives in plain vectors indexed by id:
//! `bucket: Vec<u32>`, `since: Vec<u64>`, `flags: Vec<u8>` and the accumulated RDP
//! vectors in one flat `Vec<f64>` of `n × #orders`. Against a `dashmap` (or any hash
//! map) this saves the hashing and probing on every report, the per-entry key and
//! control bytes, and one heap allocation (with its allocator header) per example for
//! the RDP vector; the RDP vectors of consecutive ids are contiguous, which makes the
//! `O(n)` passes (releases, all-epsilon queries, compaction) streaming reads. A
//! concurrent map would buy nothing: steps must be applied one at a time and in
//! order, so the server serialises them per dataset anyway (one lock per ledger).
//! `benches/ledger.rs` (group `store`) measures both layouts on the step's access
//! pattern: the columnar update of a 4096-example batch at n = 10^6 ran 2.2-2.8x
//! faster than the hash map's (across runs), whose layout also needs about 600
//! bytes per example against 525. At 64 orders the ledger uses 526 bytes per example (about 540 with the
//! individual filter), see [`Ledger::memory_bytes`].
//!
//! # Where a step's time goes
//!
//! A step is bound by memory, not arithmetic: each reported example's 512-byte RDP
//! row is a random access into hundreds of megabytes. Two measures more than
//! tripled throughput on the benchmark: rows are prefetched [`PREFETCH_AHEAD`]
//! reports ahead, and the large columns are backed by transparent huge pages
//! (without them nearly every row costs a TLB miss and a page walk).

use super::config::{Clipping, DatasetConfig, Sampling};
use super::convert::Converter;
use super::error::LedgerError;
use super::filter::{choose_order, next_check, Filter, FILTER_MARGIN, NEVER};
use super::prefix::PrefixSums;
use super::protocol::{
    ExamplePrivacy, FilterStatus, LedgerStatus, Part, PendingStatus, RefreshOutcome, StepOutcome,
    StepReport, WorstCase,
};
use crate::accounting::conversion::{Conversion, EpsilonAtOrder};
use crate::accounting::grid::BucketGrid;
use crate::accounting::table::{RdpTable, StepMechanism, TableCache};
use crate::accounting::validate;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// How many applied steps keep their answers for retries. Older retries get
/// [`LedgerError::Archived`]. A retry is a network-level event, so a short window
/// suffices, and it bounds memory to `window × batch` thresholds.
pub const RETRY_WINDOW: u64 = 32;

/// Most parts one step may be split into.
pub const MAX_PARTS: u32 = 4096;

/// Segments are compacted once their bases take more than this many bytes (or a
/// quarter of the RDP vectors, whichever is larger): a compaction costs one pass
/// over all examples, which this amortises over many changes of hyperparameters.
const MIN_SEGMENT_BUDGET: usize = 32 << 20;

// Bits of `flags`.
/// Every charge so far was at the top bucket: the example's RDP is exactly the
/// worst case's `P(T)[K]` and its accumulator is not maintained.
const ALL_TOP: u8 = 1;
/// Retired by the individual filter: bucket 0, accrues nothing.
const RETIRED: u8 = 2;
/// Counted once in `over_budget`.
const OVER_BUDGET: u8 = 4;
/// Scratch bit of batch validation (duplicate detection); always cleared again.
const SEEN: u8 = 8;
/// In a received part of the step in progress.
const PENDING: u8 = 16;

/// How many reports ahead the accrual loop prefetches per-example state. A report
/// touches one random 512-byte RDP row (64 orders) plus three small columns; at a
/// million examples these are cache and TLB misses, so the loop is bound by memory
/// latency unless several examples' loads are in flight at once.
pub(crate) const PREFETCH_AHEAD: usize = 16;

/// Ask the CPU to start loading `slice[index]` into cache (no effect if out of
/// range, or on targets other than x86_64).
#[inline(always)]
fn prefetch<T>(slice: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(index) {
        // SAFETY: a prefetch is a hint without architectural effect (it cannot
        // fault); the pointer is to a live element of `slice`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (x as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, index);
}

/// Start loading example `i`'s state (columns and RDP row) into cache.
#[inline(always)]
fn prefetch_example(flags: &[u8], bucket: &[u32], since: &[u64], acc: &[f64], m: usize, i: usize) {
    prefetch(flags, i);
    prefetch(bucket, i);
    prefetch(since, i);
    let row = i.saturating_mul(m);
    for k in (0..m).step_by(8) {
        prefetch(acc, row + k);
    }
}

/// The process-wide cache of per-bucket tables: datasets with the same grid,
/// orders and hyperparameters share their tables.
fn table_cache() -> &'static TableCache {
    static CACHE: OnceLock<TableCache> = OnceLock::new();
    CACHE.get_or_init(TableCache::new)
}

/// The hyperparameters of one step and the table they determine.
/// The result of validating a step report.
enum CheckedStep {
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

#[derive(Debug, Clone)]
struct StepParams {
    mechanism: StepMechanism,
    table: Arc<RdpTable>,
}

/// Shuffle mode: charges happen only at processing; the worst case is one Gaussian
/// charge at `C` per epoch, at the epoch's smallest noise multiplier.
#[derive(Debug, Clone)]
struct ShuffleState {
    steps_per_epoch: u64,
    /// Worst-case RDP of all completed epochs.
    worst_done: Vec<f64>,
    /// Per order, the largest top-bucket charge of the steps of epoch `epoch`.
    epoch_max: Vec<f64>,
    /// The epoch of the latest step (meaningless before the first step).
    epoch: u64,
    started: bool,
}

#[derive(Debug, Clone)]
enum Accrual {
    Poisson(PrefixSums),
    Shuffle(ShuffleState),
}

#[derive(Debug, Clone)]
struct PendingPart {
    hash: u64,
    ids: Vec<u64>,
    norms: Vec<f64>,
    outcome: StepOutcome,
}

/// A multi-part step whose parts are arriving. Nothing of it is applied yet.
#[derive(Debug, Clone)]
struct Pending {
    step: u64,
    count: u32,
    noise_bits: Option<u64>,
    rate_bits: Option<u64>,
    params: StepParams,
    parts: Vec<Option<PendingPart>>,
    received: u32,
}

/// The answers of one applied step, kept for retries.
#[derive(Debug, Clone)]
struct StepRecord {
    step: u64,
    parts: Vec<(u64, StepOutcome)>,
}

/// The per-example privacy ledger of one dataset (one training run).
///
/// A plain struct (`Send + Sync`); a server wraps each ledger in its own lock.
/// Every `&mut self` method validates its whole input before changing anything, so
/// an error never leaves partial state.
#[derive(Debug, Clone)]
pub struct Ledger {
    config: DatasetConfig,
    grid: BucketGrid,
    orders: Vec<f64>,
    n: usize,
    m: usize,
    top: u32,
    default_sigma: f64,
    default_rate: f64,
    /// Threshold bucket `b_i` (for the next step); 0 once retired.
    bucket: Vec<u32>,
    /// Poisson: the step from which accrual at `bucket` is not yet in `acc`.
    /// Shuffle: one past the epoch of the example's last processing (0: never).
    since: Vec<u64>,
    flags: Vec<u8>,
    /// `n × m` accumulated RDP, settled up to `since` (Poisson), row-major by id.
    acc: Vec<f64>,
    accrual: Accrual,
    /// The latest step's hyperparameters (the defaults before step 0).
    current: StepParams,
    /// The dataset's default hyperparameters.
    default: StepParams,
    next_step: u64,
    release: Vec<f64>,
    releases: u64,
    filter: Option<Filter>,
    pending: Option<Pending>,
    history: VecDeque<StepRecord>,
    retired: u64,
    over_budget: u64,
}

/// A vector of `len` copies of `value`, or an error naming `examples` when the
/// allocation fails (a huge `n` must be refused, not abort the process).
fn try_filled<T: Clone>(len: usize, value: T) -> Result<Vec<T>, LedgerError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        LedgerError::invalid(
            "examples",
            format!(
                "cannot allocate {} bytes of per-example state",
                len.saturating_mul(std::mem::size_of::<T>())
            ),
        )
    })?;
    advise_huge_pages(&mut v);
    v.resize(len, value);
    Ok(v)
}

/// Ask Linux to back a large, not yet touched buffer with transparent huge pages.
///
/// A step touches a few thousand random rows spread over hundreds of megabytes;
/// with 4 KiB pages nearly every row costs a TLB miss and a page walk (doubly
/// expensive under virtualisation), which the benchmark showed to be the largest
/// cost of a step. 2 MiB pages make the whole ledger fit the TLB. This is advice
/// only: where it is refused or unsupported nothing changes.
fn advise_huge_pages<T>(v: &mut Vec<T>) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let lo = start.saturating_add(HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    let hi = start.saturating_add(bytes) / HUGE_PAGE * HUGE_PAGE;
    if hi > lo {
        madvise_huge(lo, hi - lo);
    }
}

#[cfg(target_os = "linux")]
fn madvise_huge(addr: usize, len: usize) {
    use std::ffi::{c_int, c_void};
    const MADV_HUGEPAGE: c_int = 14;
    extern "C" {
        fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    }
    // SAFETY: `addr..addr + len` lies inside a live allocation owned by the caller
    // and is page aligned; MADV_HUGEPAGE only changes how the kernel backs those
    // pages (contents are preserved). A failure (e.g. THP disabled) is harmless and
    // deliberately ignored.
    let _ = unsafe { madvise(addr as *mut c_void, len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn madvise_huge(_addr: usize, _len: usize) {}

impl Ledger {
    /// Create the ledger of a dataset: every example at threshold `C`, nothing
    /// accrued. Computes (or takes from the cache) the default per-bucket table.
    pub fn new(config: DatasetConfig) -> Result<Self, LedgerError> {
        config.validate()?;
        let grid = config.grid()?;
        let orders = config.sorted_orders()?;
        let n = usize::try_from(config.examples)
            .map_err(|_| LedgerError::invalid("examples", "too large for this machine"))?;
        let m = orders.len();
        let nm = n
            .checked_mul(m)
            .filter(|&x| x <= isize::MAX as usize / 8)
            .ok_or_else(|| LedgerError::invalid("examples", "examples × orders is too large"))?;
        let top = grid.top();
        let sigma = config.noise_multiplier;
        let (accrual, current, default_rate, initial_flags) = match config.sampling {
            Sampling::Poisson { rate } => {
                let mechanism = StepMechanism::Poisson { q: rate, sigma };
                let table = table_cache().get(&grid, mechanism, &orders);
                (
                    Accrual::Poisson(PrefixSums::new(mechanism, table.clone(), grid.len(), m)),
                    StepParams { mechanism, table },
                    rate,
                    ALL_TOP,
                )
            }
            Sampling::Shuffle { batch_size } => {
                let mechanism = StepMechanism::Gaussian { sigma };
                let table = table_cache().get(&grid, mechanism, &orders);
                let steps_per_epoch = config.examples.div_ceil(batch_size);
                (
                    Accrual::Shuffle(ShuffleState {
                        steps_per_epoch,
                        worst_done: vec![0.0; m],
                        epoch_max: vec![0.0; m],
                        epoch: 0,
                        started: false,
                    }),
                    StepParams { mechanism, table },
                    1.0,
                    0,
                )
            }
        };
        let mut ledger = Self {
            grid,
            n,
            m,
            top,
            default_sigma: sigma,
            default_rate,
            bucket: try_filled(n, top)?,
            since: try_filled(n, 0u64)?,
            flags: try_filled(n, initial_flags)?,
            acc: try_filled(nm, 0.0f64)?,
            accrual,
            default: current.clone(),
            current,
            next_step: 0,
            release: vec![0.0; m],
            releases: 0,
            filter: None,
            pending: None,
            history: VecDeque::new(),
            retired: 0,
            over_budget: 0,
            orders,
            config,
        };
        if let Some(budget) = ledger.config.individual_budget {
            let per_step = ledger.current.table.row(top).to_vec();
            let (index, rdp_budget) =
                choose_order(&ledger.orders, &per_step, budget.epsilon, budget.delta)?;
            let bound = (0..=top)
                .map(|k| ledger.current.table.row(k)[index])
                .collect();
            // All examples start alike: one prediction for everyone.
            let c = per_step[index];
            let limit = rdp_budget * (1.0 - FILTER_MARGIN);
            let at = next_check(0, 0.0, c, ledger.unsampled_rate(c), limit);
            let predicted = try_filled(n, at)?;
            let filter = Filter::new(
                budget,
                index,
                ledger.orders[index],
                rdp_budget,
                bound,
                predicted,
            );
            ledger.filter = Some(filter);
        }
        Ok(ledger)
    }

    // ------------------------------------------------------------------ accessors

    /// The configuration the ledger was created with.
    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// The sorted orders every RDP vector of this ledger refers to.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// The bucket grid of thresholds.
    pub fn grid(&self) -> &BucketGrid {
        &self.grid
    }

    /// Number of examples.
    pub fn examples(&self) -> u64 {
        self.n as u64
    }

    /// The step the ledger accepts next (= the number of steps applied).
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Heap memory held by the ledger, in bytes (per-example columns, segments,
    /// filter queue, retry window and pending parts; shared tables not included).
    pub fn memory_bytes(&self) -> u64 {
        let mut bytes = self.bucket.capacity() * 4
            + self.since.capacity() * 8
            + self.flags.capacity()
            + self.acc.capacity() * 8
            + self.release.capacity() * 8;
        bytes += match &self.accrual {
            Accrual::Poisson(p) => p.bytes(),
            Accrual::Shuffle(s) => (s.worst_done.capacity() + s.epoch_max.capacity()) * 8,
        };
        if let Some(f) = &self.filter {
            bytes += f.bytes();
        }
        for rec in &self.history {
            for (_, out) in &rec.parts {
                bytes += outcome_bytes(out);
            }
        }
        if let Some(p) = &self.pending {
            for part in p.parts.iter().flatten() {
                bytes += part.ids.capacity() * 8
                    + part.norms.capacity() * 8
                    + outcome_bytes(&part.outcome);
            }
        }
        bytes as u64
    }

    // ------------------------------------------------------------------ steps

    /// Every check of [`Ledger::step`], without mutating.
    fn validate_step(&mut self, report: &StepReport) -> Result<CheckedStep, LedgerError> {
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
                .answer_retry(report.step, part, hash)
                .map(CheckedStep::Answer);
        }
        if report.step > self.next_step {
            return Err(LedgerError::OutOfOrder {
                expected: self.next_step,
                got: report.step,
            });
        }
        let t = report.step;
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
        };
        if part.count == 1 {
            outcome.retired = self.apply_step(t, &params, &[(&report.ids, &report.norms)]);
            outcome.complete = true;
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
    fn zero_retired(&self, ids: &[u64], outcome: &mut StepOutcome) {
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
    fn answer_retry(&self, step: u64, part: Part, hash: u64) -> Result<StepOutcome, LedgerError> {
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
        Ok(StepOutcome {
            duplicate: true,
            ..outcome.clone()
        })
    }

    fn remember(&mut self, record: StepRecord) {
        if self.history.len() as u64 >= RETRY_WINDOW {
            self.history.pop_front();
        }
        self.history.push_back(record);
    }

    /// Validate a step's hyperparameter overrides and fetch its table.
    fn resolve_params(&self, report: &StepReport) -> Result<StepParams, LedgerError> {
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
            Accrual::Shuffle(_) => {
                if let Some(q) = report.sampling_rate {
                    return Err(LedgerError::invalid(
                        "sampling_rate",
                        format!("a shuffled dataset has no sampling rate (got {q}); only noise_multiplier may change per step"),
                    ));
                }
                StepMechanism::Gaussian { sigma }
            }
        };
        let current = self.next_params();
        if current.mechanism == mechanism {
            return Ok(current.clone());
        }
        let table = table_cache().get(&self.grid, mechanism, &self.orders);
        Ok(StepParams { mechanism, table })
    }

    /// Check a batch (ids in range, distinct, not in another part of the step in
    /// progress; norms finite and `>= 0`; lengths equal; in shuffle mode, not yet
    /// processed in this epoch). `step` is `None` for refreshes. Leaves the ledger
    /// exactly as it found it. Returns the thresholds the report gives its ids (0
    /// for retired examples), computed in the same pass.
    fn check_batch(
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
        if let Some((j, g)) = norms
            .iter()
            .enumerate()
            .find(|(_, g)| !(g.is_finite() && **g >= 0.0))
        {
            return Err(LedgerError::invalid(
                "norms",
                format!("norms[{j}] = {g}: every norm must be a finite number >= 0"),
            ));
        }
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
        let mut thresholds = Vec::with_capacity(ids.len());
        for (&id, &g) in ids.iter().zip(norms) {
            let f = &mut self.flags[id as usize];
            *f &= !SEEN;
            thresholds.push(if *f & RETIRED != 0 {
                0.0
            } else {
                self.grid.value(self.grid.bucket_of(g))
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
    fn apply_step(
        &mut self,
        t: u64,
        params: &StepParams,
        batches: &[(&[u64], &[f64])],
    ) -> Vec<u64> {
        let m = self.m;
        let top = self.top;
        let now = t + 1;
        self.current = params.clone();
        let recompute = self.filter_update_bound();
        let poisson = matches!(self.accrual, Accrual::Poisson(_));
        // Per-report filter checks, unless the bound grew and all are redone below.
        let mut checks = if recompute {
            None
        } else {
            self.filter.as_mut()
        };
        let table = &*params.table;
        let (prefix, shuffle_epoch) = match &mut self.accrual {
            Accrual::Poisson(prefix) => {
                prefix.begin_step(t, params.mechanism, params.table.clone());
                (Some(&*prefix), 0)
            }
            Accrual::Shuffle(state) => {
                let epoch = t / state.steps_per_epoch;
                let top_row = table.row(top);
                if state.started && epoch == state.epoch {
                    for (w, &r) in state.epoch_max.iter_mut().zip(top_row) {
                        *w = w.max(r);
                    }
                } else {
                    if state.started {
                        for (w, &e) in state.worst_done.iter_mut().zip(&state.epoch_max) {
                            *w += e;
                        }
                    }
                    state.epoch_max.copy_from_slice(top_row);
                    state.epoch = epoch;
                    state.started = true;
                }
                (None, epoch)
            }
        };
        let seg_start = prefix.map_or(0, |p| p.current().start);
        // The filter's value of an example still charged only at the top bucket.
        let top_value = match (&checks, prefix) {
            (Some(f), Some(p)) => p.prefix_at(now, top, f.index) + self.release[f.index],
            _ => 0.0,
        };
        for (ids, norms) in batches {
            for (j, (&id, &g)) in ids.iter().zip(norms.iter()).enumerate() {
                if let Some(&ahead) = ids.get(j + PREFETCH_AHEAD) {
                    let ahead = ahead as usize;
                    prefetch_example(&self.flags, &self.bucket, &self.since, &self.acc, m, ahead);
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
                let kmin = b.min(kg);
                let acc = &mut self.acc[i * m..(i + 1) * m];
                let charge = table.row(kmin);
                let mut still_top = false;
                match prefix {
                    Some(prefix) if f & ALL_TOP != 0 => {
                        if kmin == top {
                            still_top = true;
                        } else {
                            // First charge below the top: materialise P(t)[K].
                            prefix.prefix_into(t, top, acc);
                            for (a, &c) in acc.iter_mut().zip(charge) {
                                *a += c;
                            }
                            self.flags[i] = f & !ALL_TOP;
                        }
                        self.since[i] = now;
                    }
                    Some(prefix) => {
                        let s = self.since[i];
                        if s >= seg_start {
                            let d = (t - s) as f64;
                            let row = table.row(b);
                            for ((a, &r), &c) in acc.iter_mut().zip(row).zip(charge) {
                                *a += d * r + c;
                            }
                        } else {
                            prefix.add_difference(s, t, b, acc);
                            for (a, &c) in acc.iter_mut().zip(charge) {
                                *a += c;
                            }
                        }
                        self.since[i] = now;
                    }
                    None => {
                        if kmin > 0 {
                            for (a, &c) in acc.iter_mut().zip(charge) {
                                *a += c;
                            }
                        }
                        self.since[i] = shuffle_epoch + 1;
                    }
                }
                self.bucket[i] = kg;
                if let Some(filter) = checks.as_deref_mut() {
                    let k = filter.index;
                    let value = if still_top {
                        top_value
                    } else {
                        acc[k] + self.release[k]
                    };
                    let c = filter.bound[kg as usize];
                    let rate = if poisson { c } else { 0.0 };
                    let at = next_check(now, value, c, rate, filter.limit);
                    filter.schedule_by(id as u32, at);
                }
            }
        }
        self.next_step = now;
        let retired = if recompute {
            self.filter_recompute_all()
        } else {
            self.filter_pop_due()
        };
        self.maybe_compact();
        retired
    }

    // ------------------------------------------------------------------ refresh

    /// Full-batch refresh (spec §3.5): set each reported example's threshold to the
    /// bucket of its observed norm, effective from the next step. Accrues nothing
    /// itself: the example's accrual so far (at its old threshold) is settled first.
    /// Retired examples stay retired. Refused while a multi-part step is incomplete.
    pub fn refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<RefreshOutcome, LedgerError> {
        let thresholds = self.validate_refresh(ids, norms)?;
        let now = self.next_step;
        let m = self.m;
        let top = self.top;
        for (&id, &g) in ids.iter().zip(norms) {
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
                let acc = &mut self.acc[i * m..(i + 1) * m];
                if f & ALL_TOP != 0 {
                    prefix.prefix_into(now, top, acc);
                    self.flags[i] = f & !ALL_TOP;
                } else {
                    prefix.add_difference(self.since[i], now, b, acc);
                }
                self.since[i] = now;
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
        })
    }

    /// Validate a refresh without changing anything; when this succeeds,
    /// [`Ledger::refresh`] with the same arguments and no call in between succeeds.
    pub fn check_refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<(), LedgerError> {
        self.validate_refresh(ids, norms).map(|_| ())
    }

    fn validate_refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<Vec<f64>, LedgerError> {
        self.refuse_if_pending("a refresh")?;
        self.check_batch(ids, norms, None)
    }

    fn refuse_if_pending(&self, action: &'static str) -> Result<(), LedgerError> {
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

    // ------------------------------------------------------------------ releases

    /// How many examples the individual filter would retire if a release of
    /// `rdp` were charged now (0 without a filter), without changing anything:
    /// `O(n)`. The server refuses releases whose retirements could not reach the
    /// trainer before its next step.
    pub fn release_would_retire(&self, rdp: &[f64]) -> u64 {
        let Some(filter) = &self.filter else {
            return 0;
        };
        let j = filter.index;
        let extra = rdp.get(j).copied().unwrap_or(f64::INFINITY);
        (0..self.n)
            .filter(|&i| {
                self.flags[i] & RETIRED == 0
                    && self.value_at(i, self.next_step, j)
                        + extra
                        + filter.bound[self.bucket[i] as usize]
                        > filter.limit * (1.0 - 1e-9)
            })
            .count() as u64
    }

    /// Whether a release could be charged now (no multi-part step is incomplete),
    /// without changing anything: the server checks before it persists.
    pub fn check_release(&self) -> Result<(), LedgerError> {
        self.refuse_if_pending("a release")
    }

    /// Charge the RDP of a DP release (spec §6) to every example and to the worst
    /// case, in `O(#orders)`: it is kept as one dataset-wide offset added at query
    /// time. With an individual filter this costs one `O(n)` pass (every example's
    /// value moved): examples the release pushes past their budget are counted in
    /// `over_budget`, and examples that could no longer afford a step are retired
    /// (returned). Refused while a multi-part step is incomplete.
    pub fn charge_release(&mut self, rdp: &[f64]) -> Result<Vec<u64>, LedgerError> {
        self.refuse_if_pending("a release")?;
        if rdp.len() != self.m {
            return Err(LedgerError::invalid(
                "rdp",
                format!(
                    "has {} values but the ledger keeps {} orders",
                    rdp.len(),
                    self.m
                ),
            ));
        }
        if let Some((j, r)) = rdp
            .iter()
            .enumerate()
            .find(|(_, r)| !(r.is_finite() && **r >= 0.0))
        {
            return Err(LedgerError::invalid(
                "rdp",
                format!("rdp[{j}] = {r}: every value must be a finite number >= 0"),
            ));
        }
        for (o, &r) in self.release.iter_mut().zip(rdp) {
            *o += r;
        }
        self.releases += 1;
        Ok(self.filter_recompute_all())
    }

    // ------------------------------------------------------------------ filter

    /// The latest step's parameters (the defaults before the first step): they
    /// bound what the next step charges, as far as the ledger can know.
    fn next_params(&self) -> &StepParams {
        &self.current
    }

    /// What an unreported example accrues per step at charge bound `c`.
    fn unsampled_rate(&self, c: f64) -> f64 {
        match self.accrual {
            Accrual::Poisson(_) => c,
            Accrual::Shuffle(_) => 0.0,
        }
    }

    /// RDP of example `i` at order `j` at step `now`, releases included.
    fn value_at(&self, i: usize, now: u64, j: usize) -> f64 {
        let f = self.flags[i];
        let own = match &self.accrual {
            Accrual::Poisson(prefix) => {
                if f & RETIRED != 0 {
                    self.acc[i * self.m + j]
                } else if f & ALL_TOP != 0 {
                    prefix.prefix_at(now, self.top, j)
                } else {
                    self.acc[i * self.m + j]
                        + prefix.difference_at(self.since[i], now, self.bucket[i], j)
                }
            }
            Accrual::Shuffle(_) => self.acc[i * self.m + j],
        };
        own + self.release[j]
    }

    /// When example `i` is next due for a filter check, seen from step `now`.
    fn predict(&self, filter: &Filter, i: usize, now: u64) -> u64 {
        if self.flags[i] & RETIRED != 0 {
            return NEVER;
        }
        let value = self.value_at(i, now, filter.index);
        let c = filter.bound[self.bucket[i] as usize];
        next_check(now, value, c, self.unsampled_rate(c), filter.limit)
    }

    /// Retire example `i` at step `now`: settle its accrual, threshold 0.
    fn retire(&mut self, i: usize, now: u64) {
        let m = self.m;
        if let Accrual::Poisson(prefix) = &self.accrual {
            let acc = &mut self.acc[i * m..(i + 1) * m];
            if self.flags[i] & ALL_TOP != 0 {
                prefix.prefix_into(now, self.top, acc);
            } else {
                prefix.add_difference(self.since[i], now, self.bucket[i], acc);
            }
            self.since[i] = now;
        }
        self.bucket[i] = 0;
        self.flags[i] = (self.flags[i] & !ALL_TOP) | RETIRED;
        if let Some(f) = &mut self.filter {
            f.predicted[i] = NEVER;
        }
        self.retired += 1;
    }

    /// Refresh the filter's bound on the next step's charge at `alpha*`: the larger
    /// of the default hyperparameters' and the latest step's (a schedule may keep the
    /// latest values, or return to the defaults after a cheaper step). Returns true
    /// when it grew for some bucket: then every queued check may be late and all
    /// must be recomputed (`O(n)`, once per such change of hyperparameters).
    fn filter_update_bound(&mut self) -> bool {
        let Some(filter) = self.filter.as_mut() else {
            return false;
        };
        let j = filter.index;
        let mut increased = false;
        for (k, slot) in filter.bound.iter_mut().enumerate() {
            let k = k as u32;
            let c = self.default.table.row(k)[j].max(self.current.table.row(k)[j]);
            increased |= c > *slot;
            *slot = c;
        }
        increased
    }

    /// Filter work after a refresh changed the thresholds of `ids`.
    fn filter_after_refresh(&mut self, ids: &[u64]) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let now = self.next_step;
        for &id in ids {
            let i = id as usize;
            if self.flags[i] & RETIRED == 0 {
                let at = self.predict(&filter, i, now);
                filter.schedule_by(id as u32, at);
            }
        }
        let retired = self.filter_pop(&mut filter, now);
        self.filter = Some(filter);
        retired
    }

    /// Run the checks that fell due at the current step.
    fn filter_pop_due(&mut self) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let retired = self.filter_pop(&mut filter, self.next_step);
        self.filter = Some(filter);
        retired
    }

    /// Recompute every prediction (`O(n)`), counting examples already past their
    /// budget, then retire those due.
    fn filter_recompute_all(&mut self) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let now = self.next_step;
        for i in 0..self.n {
            if self.flags[i] & RETIRED != 0 {
                continue;
            }
            if self.flags[i] & OVER_BUDGET == 0
                && self.value_at(i, now, filter.index) > filter.budget
            {
                self.flags[i] |= OVER_BUDGET;
                self.over_budget += 1;
            }
            filter.predicted[i] = self.predict(&filter, i, now);
        }
        filter.rebuild();
        let retired = self.filter_pop(&mut filter, now);
        self.filter = Some(filter);
        retired
    }

    /// Check every queued example due at `now`; retire those whose next step could
    /// push them over budget, re-queue the others. Returns the retired ids, sorted.
    fn filter_pop(&mut self, filter: &mut Filter, now: u64) -> Vec<u64> {
        let mut retired = Vec::new();
        while let Some((at, ids)) = filter.pop_due(now) {
            for id in ids {
                let i = id as usize;
                if filter.predicted[i] != at || self.flags[i] & RETIRED != 0 {
                    continue; // stale entry
                }
                filter.predicted[i] = NEVER;
                let value = self.value_at(i, now, filter.index);
                let c = filter.bound[self.bucket[i] as usize];
                if value + c > filter.limit {
                    self.retire(i, now);
                    retired.push(id as u64);
                } else {
                    let next = next_check(now, value, c, self.unsampled_rate(c), filter.limit);
                    filter.schedule(
                        id,
                        if next == NEVER {
                            NEVER
                        } else {
                            next.max(now + 1)
                        },
                    );
                }
            }
        }
        retired.sort_unstable();
        retired
    }

    // ------------------------------------------------------------------ compaction

    fn maybe_compact(&mut self) {
        if let Accrual::Poisson(prefix) = &self.accrual {
            let budget = MIN_SEGMENT_BUDGET.max(self.acc.len() * 2);
            if prefix.len() > 1 && prefix.bytes() > budget {
                self.compact();
            }
        }
    }

    /// Settle every example up to the current step and drop all prefix-sum segments
    /// but the current one: `O(n × #orders)`. Runs automatically when segments (one
    /// per change of hyperparameters) exceed their memory budget; results are
    /// unchanged up to floating-point rounding (examples charged only at the top
    /// bucket stay bit-identical to the worst case).
    pub fn compact(&mut self) {
        let now = self.next_step;
        let m = self.m;
        if let Accrual::Poisson(prefix) = &mut self.accrual {
            for i in 0..self.n {
                let f = self.flags[i];
                if f & (ALL_TOP | RETIRED) == 0 {
                    prefix.add_difference(
                        self.since[i],
                        now,
                        self.bucket[i],
                        &mut self.acc[i * m..(i + 1) * m],
                    );
                }
                self.since[i] = now;
            }
            prefix.drop_old_segments();
        }
    }

    // ------------------------------------------------------------------ queries

    /// Write example `i`'s RDP vector (releases included) at the current step.
    fn rdp_into(&self, i: usize, out: &mut [f64]) {
        let now = self.next_step;
        let m = self.m;
        let f = self.flags[i];
        match &self.accrual {
            Accrual::Poisson(prefix) => {
                if f & ALL_TOP != 0 && f & RETIRED == 0 {
                    prefix.prefix_into(now, self.top, out);
                } else {
                    out.copy_from_slice(&self.acc[i * m..(i + 1) * m]);
                    if f & RETIRED == 0 {
                        prefix.add_difference(self.since[i], now, self.bucket[i], out);
                    }
                }
            }
            Accrual::Shuffle(_) => out.copy_from_slice(&self.acc[i * m..(i + 1) * m]),
        }
        for (o, &r) in out.iter_mut().zip(&self.release) {
            *o += r;
        }
    }

    fn check_delta(delta: f64) -> Result<(), LedgerError> {
        validate::delta("delta", delta)?;
        Ok(())
    }

    fn check_id(&self, id: u64) -> Result<usize, LedgerError> {
        if id >= self.n as u64 {
            return Err(LedgerError::invalid(
                "id",
                format!("{id} is out of range: the dataset has {} examples", self.n),
            ));
        }
        Ok(id as usize)
    }

    /// The privacy of one example at the current step.
    pub fn privacy(
        &self,
        id: u64,
        delta: f64,
        conversion: Conversion,
    ) -> Result<ExamplePrivacy, LedgerError> {
        Self::check_delta(delta)?;
        let i = self.check_id(id)?;
        let mut rdp = vec![0.0; self.m];
        self.rdp_into(i, &mut rdp);
        let eps = Converter::new(&self.orders, delta, conversion).epsilon(&rdp);
        let f = self.flags[i];
        Ok(ExamplePrivacy {
            id,
            epsilon: eps.epsilon,
            order: eps.order,
            rdp,
            steps: self.next_step,
            retired: f & RETIRED != 0,
            over_budget: f & OVER_BUDGET != 0,
            threshold: self.grid.value(self.bucket[i]),
            guarantee: self.config.clipping == Clipping::PerExample,
        })
    }

    /// The worst case's RDP (spec §4) at the current step, releases included.
    pub fn worst_case_rdp(&self) -> Vec<f64> {
        let mut rdp = vec![0.0; self.m];
        match &self.accrual {
            Accrual::Poisson(prefix) => prefix.prefix_into(self.next_step, self.top, &mut rdp),
            Accrual::Shuffle(s) => {
                for ((o, &w), &e) in rdp.iter_mut().zip(&s.worst_done).zip(&s.epoch_max) {
                    *o = if s.started { w + e } else { 0.0 };
                }
            }
        }
        for (o, &r) in rdp.iter_mut().zip(&self.release) {
            *o += r;
        }
        rdp
    }

    /// The data-independent accountant at the current step: every threshold at `C`
    /// (Poisson: `sum_t SGM_RDP(q_t, sigma_t)`; shuffle: one Gaussian charge at `C`
    /// per epoch begun, at that epoch's smallest noise multiplier).
    pub fn worst_case(&self, delta: f64, conversion: Conversion) -> Result<WorstCase, LedgerError> {
        Self::check_delta(delta)?;
        let rdp = self.worst_case_rdp();
        let eps = Converter::new(&self.orders, delta, conversion).epsilon(&rdp);
        Ok(WorstCase {
            epsilon: eps.epsilon,
            order: eps.order,
            rdp,
            steps: self.next_step,
        })
    }

    /// Current thresholds `v_{b_i}` of the ids in `range` (0 for retired examples).
    pub fn thresholds(&self, range: Range<u64>) -> Result<Vec<f64>, LedgerError> {
        if range.start > range.end || range.end > self.n as u64 {
            return Err(LedgerError::invalid(
                "range",
                format!(
                    "{}..{} is not within the dataset's ids 0..{}",
                    range.start, range.end, self.n
                ),
            ));
        }
        Ok(self.bucket[range.start as usize..range.end as usize]
            .iter()
            .map(|&k| self.grid.value(k))
            .collect())
    }

    /// The ids in `range` that the individual filter retired (threshold 0 for good,
    /// unlike an example whose last norm was 0): `O(range)`.
    pub fn retired_in(&self, range: Range<u64>) -> Vec<u64> {
        let end = range.end.min(self.n as u64);
        (range.start.min(end)..end)
            .filter(|&id| self.flags[id as usize] & RETIRED != 0)
            .collect()
    }

    /// Epsilon and optimal order of every example, by id: `O(n × #orders)`.
    pub fn epsilons(
        &self,
        delta: f64,
        conversion: Conversion,
    ) -> Result<Vec<EpsilonAtOrder>, LedgerError> {
        Self::check_delta(delta)?;
        let conv = Converter::new(&self.orders, delta, conversion);
        let mut rdp = vec![0.0; self.m];
        let mut out = Vec::with_capacity(self.n);
        for i in 0..self.n {
            self.rdp_into(i, &mut rdp);
            out.push(conv.epsilon(&rdp));
        }
        Ok(out)
    }

    /// Epsilon of every example, by id: `O(n × #orders)` (for DP releases of
    /// aggregates, spec §6).
    pub fn all_epsilons(
        &self,
        delta: f64,
        conversion: Conversion,
    ) -> Result<Vec<f64>, LedgerError> {
        Ok(self
            .epsilons(delta, conversion)?
            .into_iter()
            .map(|e| e.epsilon)
            .collect())
    }

    /// A summary of the ledger's state.
    pub fn status(&self) -> LedgerStatus {
        LedgerStatus {
            examples: self.n as u64,
            orders: self.m,
            steps: self.next_step,
            pending: self.pending.as_ref().map(|p| PendingStatus {
                step: p.step,
                received: p.received,
                count: p.count,
            }),
            guarantee: self.config.clipping == Clipping::PerExample,
            retired: self.retired,
            over_budget: self.over_budget,
            filter: self.filter.as_ref().map(|f| FilterStatus {
                epsilon: f.epsilon,
                delta: f.delta,
                order: f.order,
                rdp_budget: f.budget,
            }),
            releases: self.releases,
            segments: match &self.accrual {
                Accrual::Poisson(p) => p.len(),
                Accrual::Shuffle(_) => 1,
            },
            memory_bytes: self.memory_bytes(),
        }
    }
}

fn outcome_bytes(out: &StepOutcome) -> usize {
    out.thresholds.capacity() * 8 + out.retired.capacity() * 8 + std::mem::size_of::<StepOutcome>()
}

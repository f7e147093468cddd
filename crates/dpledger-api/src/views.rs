//! What the dataset and privacy queries answer: a dataset's view (its
//! configuration, the ledger's summary, the worst case by both accountants,
//! a sharded dataset's shards), a range's thresholds, and one example's
//! privacy with its labelled parts and optional PLD estimate. The server
//! writes these, the Rust client reads them, with one definition.
//!
//! JSON has no infinity. The server writes an unbounded epsilon, order or
//! RDP as `null` (serde_json's encoding of a non-finite number), and these
//! types read `null` back as `f64::INFINITY` (the fields marked with
//! `null_inf`), so an unbounded value is never mistaken for a small one and
//! a value read and written again is the same JSON. The field stays an `f64`
//! rather than an `Option<f64>`: the server's answers and its OpenAPI
//! document are unchanged, and a reader compares numbers without unwrapping.

use crate::config::DatasetConfig;
use crate::status::{FilterStatus, PendingStatus};
use crate::step::RefreshDue;
use serde::{Deserialize, Serialize};

/// Per-example privacy at the current step: three numbers with three
/// meanings (spec §10), each labelled with its kind and delta. Only
/// `guarantee` is a proven (epsilon, delta)-DP statement; the top-level
/// `epsilon` is always the guarantee.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExamplePrivacy {
    /// The example.
    pub id: u64,
    /// The guarantee's epsilon (`guarantee.epsilon`): the (epsilon,
    /// delta)-DP of the whole run for this example.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// The delta of every part.
    pub delta: f64,
    /// Which bound gave `epsilon`.
    pub bound: Bound,
    /// Ex ante: the worst case (PLD or RDP, valid for every example), or with
    /// the individual filter in the predictable mode, `min(eps(B), worst case)`.
    pub guarantee: PrivacyPart,
    /// Ex post, output-specific (predictable mode only; `null` otherwise): in
    /// this run, except with probability delta, what was released reveals at
    /// most this much about the example. Not DP of the mechanism.
    pub ex_post: Option<PrivacyPart>,
    /// The ledger's epsilon by the improved conversion: an estimate, never a
    /// guarantee (a realized sum is not a bound, spec §10).
    pub estimate: PrivacyPart,
    /// Which ledger `rdp`, `rdp_epsilon` and the estimate come from.
    pub ledger: LedgerKind,
    /// `estimate.epsilon` (the number served as per-instance before the
    /// predictable mode; kept so that older readers find it).
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub rdp_epsilon: f64,
    /// The dataset's PLD worst-case epsilon at the same delta (`null` when none).
    pub worst_case_pld_epsilon: Option<f64>,
    /// The Rényi order attaining `rdp_epsilon`.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub order: f64,
    /// Its accumulated RDP at each of the ledger's orders (training and releases).
    #[serde(deserialize_with = "crate::null_inf::vec_f64_or_inf")]
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
    /// True when the individual filter has retired it.
    pub retired: bool,
    /// True when a step with overridden hyperparameters (or a release) pushed it
    /// past its individual budget before it could be retired: its guarantee
    /// falls back to the worst case.
    pub over_budget: bool,
    /// Its current clipping threshold (for the next step).
    pub threshold: f64,
}

/// One labelled number of an example's privacy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrivacyPart {
    /// What the number means.
    pub kind: PrivacyKind,
    /// Its epsilon.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// Its delta.
    pub delta: f64,
}

/// What a per-example number means (spec §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PrivacyKind {
    /// (epsilon, delta)-DP of the run for every example (PLD or RDP worst case).
    WorstCase,
    /// (epsilon, delta)-DP of the run for this example through the individual
    /// filter (Feldman & Zrnic): its threshold ledger never exceeds its budget.
    IndividualFilter,
    /// The ex-post bound: `P'(L > epsilon) <= delta` for the released transcript.
    ExPost,
    /// An estimate: no proven statement.
    Estimate,
}

/// Which per-example ledger a number comes from (spec §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LedgerKind {
    /// Every example charged at its predictable threshold (the predictable mode).
    Threshold,
    /// The old protocol's ledger, thresholds moved by sampled reports (or
    /// global clipping): estimates only.
    Sampled,
}

/// Which bound gave an example's `epsilon` (spec §8, §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The dataset's PLD worst case, which holds for every example (spec §8).
    WorstCasePld,
    /// The dataset's RDP worst case (spec §4).
    WorstCaseRdp,
    /// The individual filter's budget (spec §7).
    IndividualFilter,
}

/// The data-independent RDP accountant (spec §4) at the current step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorstCase {
    /// Its epsilon at the requested delta.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// The Rényi order attaining it.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub order: f64,
    /// Its RDP at each of the ledger's orders.
    #[serde(deserialize_with = "crate::null_inf::vec_f64_or_inf")]
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
}

/// A summary of the ledger's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LedgerStatus {
    /// Number of examples.
    pub examples: u64,
    /// Number of Rényi orders kept per example.
    pub orders: usize,
    /// Steps applied so far (= the next step expected).
    pub steps: u64,
    /// A multi-part step that is half received, if any.
    pub pending: Option<PendingStatus>,
    /// False when the dataset is clipped globally (per-example numbers are estimates).
    pub guarantee: bool,
    /// Examples retired by the individual filter.
    pub retired: u64,
    /// Examples pushed past their budget by overridden steps or releases.
    pub over_budget: u64,
    /// The filter's parameters, when an individual budget is set.
    pub filter: Option<FilterStatus>,
    /// Number of DP releases charged to every example.
    pub releases: u64,
    /// Prefix-sum segments held (one per change of hyperparameters since the last
    /// compaction).
    pub segments: usize,
    /// Heap memory of the ledger, in bytes.
    pub memory_bytes: u64,
}

/// Which accountant gave a worst-case epsilon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorstCaseMethod {
    /// The privacy loss distribution accountant (spec §8).
    Pld,
    /// The RDP accountant (spec §4).
    Rdp,
}

/// The PLD worst case (spec §8): a proven upper bound for every example.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PldWorstCase {
    /// Its epsilon at the requested delta.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// Grid spacing of the privacy loss used (losses rounded up on it).
    pub value_discretization: f64,
    /// Always true: a pessimistic discretisation, a valid upper bound.
    pub guarantee: bool,
}

/// The worst case by both accountants, the tighter first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorstCaseBounds {
    /// The tightest proven worst-case epsilon: `min(pld.epsilon, rdp.epsilon)`.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// The accountant that gave `epsilon`.
    pub method: WorstCaseMethod,
    /// Number of steps applied so far.
    pub steps: u64,
    /// The PLD worst case (`null` when it could not be computed, see `pld_error`).
    pub pld: Option<PldWorstCase>,
    /// Why there is no PLD worst case, if there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pld_error: Option<String>,
    /// The RDP worst case (spec §4), as before: epsilon, order, RDP vector.
    pub rdp: WorstCase,
}

/// Steps of one example at one (segment, grid level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LevelSteps {
    /// The segment's sampling rate `q` (1 in shuffle mode: a Gaussian charge).
    pub sampling_rate: f64,
    /// The segment's noise multiplier `sigma` (noise std `sigma * C`).
    pub noise_multiplier: f64,
    /// The grid level's threshold `v_k` the steps were charged at.
    pub threshold: f64,
    /// `sigma * C / v_k`: the noise multiplier of the sampled Gaussian composed.
    pub effective_noise_multiplier: f64,
    /// Number of steps charged at this (segment, level).
    pub steps: u64,
}

/// An example's PLD epsilon over its actual history of thresholds: an
/// estimate, **not** a proven bound (its thresholds were chosen adaptively from
/// its own gradients, and PLD composition is not proven for that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PldEstimate {
    /// The estimate's epsilon at the query's delta.
    #[serde(deserialize_with = "crate::null_inf::f64_or_inf")]
    pub epsilon: f64,
    /// Always false: PLD composition under adaptively chosen thresholds is not a
    /// proven bound. The example's guarantee is `example.epsilon`.
    pub guarantee: bool,
    /// Grid spacing of the privacy loss (losses rounded up on it).
    pub value_discretization: f64,
    /// Steps composed (the sum over `levels`; steps at threshold 0 cost nothing).
    pub steps: u64,
    /// Releases composed (every example is charged every release).
    pub releases: u64,
    /// The example's steps per (segment, level), by segment then threshold.
    pub levels: Vec<LevelSteps>,
}

/// One shard of a sharded dataset: a contiguous range of its example ids,
/// served by one node under its own lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardView {
    /// The shard's internal dataset (`{dataset}~{start}`); its example `i` is
    /// the dataset's example `start + i`.
    pub dataset: String,
    /// First example id of the range (inclusive).
    pub start: u64,
    /// End of the range (exclusive).
    pub end: u64,
    /// The node holding the shard's live lease (`null`: none now, it is moving).
    pub owner: Option<String>,
    /// The lease's epoch (bumped at every takeover).
    pub epoch: u64,
    /// Steps the shard has applied (equal on every shard between steps).
    pub steps: u64,
}

/// A dataset's state, with the public worst case at its reporting delta.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetView {
    /// The id.
    pub id: String,
    /// Archived datasets are read-only.
    pub archived: bool,
    /// The configuration it was created with.
    pub config: DatasetConfig,
    /// Ledger summary (steps, retirements, memory).
    pub status: LedgerStatus,
    /// The data-independent accountants (PLD and RDP) at the configured delta.
    pub worst_case: WorstCaseBounds,
    /// A sharded dataset's shards, in id order (absent when unsharded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardView>>,
}

/// Current clipping thresholds of a range of examples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Thresholds {
    /// The first id.
    pub start: u64,
    /// The step these thresholds apply to (the next step).
    pub next_step: u64,
    /// Threshold of ids `start, start+1, ...` (0 for retired examples).
    pub thresholds: Vec<f64>,
    /// The ids of the range that the individual filter retired: leave them out of
    /// batches (a threshold of 0 alone may also mean a last norm of 0).
    pub retired: Vec<u64>,
    /// Predictable mode: the scheduled refresh due before `next_step`, if any
    /// (compute these examples' unclipped norms at the current model and POST
    /// them to `.../refresh` before clipping the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_due: Option<RefreshDue>,
}

/// One example's privacy, with the worst case beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrivacyView {
    /// The delta used.
    pub delta: f64,
    /// The example's own accounting (proven bounds).
    pub example: ExamplePrivacy,
    /// The data-independent accountants (PLD and RDP) at the same delta.
    pub worst_case: WorstCaseBounds,
    /// With `method=pld_estimate`: the example's PLD estimate, NOT a guarantee
    /// (`"guarantee": false`); never part of `example.epsilon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pld_estimate: Option<PldEstimate>,
}

impl LevelSteps {
    /// The `(q, sigma_eff)` of this level, the key of its cached spectrum.
    pub fn level(&self) -> (f64, f64) {
        (self.sampling_rate, self.effective_noise_multiplier)
    }
}

impl ExamplePrivacy {
    /// Bound the example's guarantee by the PLD worst case too (spec §8): the
    /// smaller of two proven bounds is one.
    pub fn bounded_by(mut self, worst_case_pld: Option<f64>) -> Self {
        if let Some(w) = worst_case_pld {
            if w < self.epsilon {
                self.epsilon = w;
                self.bound = Bound::WorstCasePld;
                self.guarantee.epsilon = w;
                self.guarantee.kind = PrivacyKind::WorstCase;
            }
        }
        self.worst_case_pld_epsilon = worst_case_pld;
        self
    }
}

//! The messages of the step protocol and the answers of queries (spec §3).

use crate::accounting::InvalidArgument;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// One part of a step that data-parallel workers report separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// Which part this is, `0..count`.
    pub index: u32,
    /// How many parts the step has; every part must say the same.
    pub count: u32,
}

impl Part {
    /// A step reported in one piece.
    pub const WHOLE: Part = Part { index: 0, count: 1 };
}

/// What the trainer reports for one step (or one part of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepReport {
    /// Step number; steps are applied in order from 0.
    pub step: u64,
    /// Ids of the examples in the batch (distinct). Empty for an empty batch.
    #[serde(default)]
    pub ids: Vec<u64>,
    /// Their observed, unclipped gradient norms (finite, `>= 0`), same order.
    #[serde(default)]
    pub norms: Vec<f64>,
    /// Noise multiplier of this step when it differs from the dataset's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_multiplier: Option<f64>,
    /// Sampling rate of this step when it differs from the default (Poisson only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate: Option<f64>,
    /// Present when the step is reported in several parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
}

impl StepReport {
    /// A whole-step report with the dataset's default hyperparameters.
    pub fn new(step: u64, ids: Vec<u64>, norms: Vec<f64>) -> Self {
        Self {
            step,
            ids,
            norms,
            noise_multiplier: None,
            sampling_rate: None,
            part: None,
        }
    }

    /// The part this report is (a whole step is part 0 of 1).
    pub fn part_or_whole(&self) -> Part {
        self.part.unwrap_or(Part::WHOLE)
    }

    /// xxh3 of a canonical encoding of every field, used to recognise retries.
    ///
    /// A missing `part` encodes as part 0 of 1 and `-0.0` as `0.0`, so reports that
    /// mean the same thing hash the same.
    pub fn content_hash(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(b"dpledger.step.v1");
        h.update(&self.step.to_le_bytes());
        let part = self.part_or_whole();
        h.update(&part.index.to_le_bytes());
        h.update(&part.count.to_le_bytes());
        for opt in [self.noise_multiplier, self.sampling_rate] {
            match opt {
                None => h.update(&[0]),
                Some(x) => {
                    h.update(&[1]);
                    h.update(&(x + 0.0).to_bits().to_le_bytes());
                }
            }
        }
        h.update(&(self.ids.len() as u64).to_le_bytes());
        let mut buf = [0u8; 2048];
        for chunk in self.ids.chunks(256) {
            for (slot, id) in buf.chunks_exact_mut(8).zip(chunk) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 8]);
        }
        h.update(&(self.norms.len() as u64).to_le_bytes());
        for chunk in self.norms.chunks(256) {
            for (slot, g) in buf.chunks_exact_mut(8).zip(chunk) {
                slot.copy_from_slice(&(g + 0.0).to_bits().to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 8]);
        }
        h.digest()
    }
}

/// The ledger's answer to a step report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepOutcome {
    /// The step reported.
    pub step: u64,
    /// True when this answers a retry: the report was already applied (or, for a
    /// part, already received) and nothing changed.
    pub duplicate: bool,
    /// The part answered (absent for a whole step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<Part>,
    /// True once the step has been applied (also in the answer to a retry of
    /// any part of an applied step); false for parts still waiting for other
    /// parts.
    pub complete: bool,
    /// New clipping thresholds `v_{b_i}` of the reported ids, in report order: the
    /// trainer must clip each example at this value from the next step on (0 for
    /// retired examples).
    pub thresholds: Vec<f64>,
    /// Ids the individual filter retires: from the next step on their threshold is
    /// 0 (the trainer must stop sampling them or clip them to zero). Sorted; only
    /// in the answer of the part that completes the step.
    pub retired: Vec<u64>,
}

/// The answer to a full-batch refresh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RefreshOutcome {
    /// The step from which the new thresholds apply (the next step).
    pub effective_step: u64,
    /// New thresholds of the refreshed ids, in report order.
    pub thresholds: Vec<f64>,
    /// Ids the individual filter retires before `effective_step` because a raised
    /// threshold would let the next step push them over budget.
    pub retired: Vec<u64>,
}

/// Per-example privacy at the current step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExamplePrivacy {
    /// The example.
    pub id: u64,
    /// Its (epsilon, delta)-DP epsilon at the requested delta: the smaller of
    /// its per-instance RDP epsilon and the dataset's PLD worst case (spec §8),
    /// both proven bounds.
    pub epsilon: f64,
    /// The bound that gave `epsilon`.
    pub bound: Bound,
    /// Its per-instance RDP epsilon (spec §5).
    pub rdp_epsilon: f64,
    /// The dataset's PLD worst-case epsilon at the same delta (`null` when none).
    pub worst_case_pld_epsilon: Option<f64>,
    /// The Rényi order attaining `rdp_epsilon`.
    pub order: f64,
    /// Its accumulated RDP at each of the ledger's orders (training and releases).
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
    /// True when the individual filter has retired it.
    pub retired: bool,
    /// True when a step with overridden hyperparameters (or a release) pushed it
    /// past its individual budget before it could be retired.
    pub over_budget: bool,
    /// Its current clipping threshold (for the next step).
    pub threshold: f64,
    /// False when the dataset is clipped globally: then this is an estimate.
    pub guarantee: bool,
}

/// Which bound gave an example's epsilon (spec §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The example's own RDP ledger (spec §3, §5).
    PerInstanceRdp,
    /// The dataset's PLD worst case, which holds for every example (spec §8).
    WorstCasePld,
}

/// The data-independent RDP accountant (spec §4) at the current step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorstCase {
    /// Its epsilon at the requested delta.
    pub epsilon: f64,
    /// The Rényi order attaining it.
    pub order: f64,
    /// Its RDP at each of the ledger's orders.
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
}

/// A step whose parts are still arriving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PendingStatus {
    /// The step.
    pub step: u64,
    /// Parts received.
    pub received: u32,
    /// Parts announced.
    pub count: u32,
}

/// The individual filter's fixed parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FilterStatus {
    /// The individual budget's epsilon.
    pub epsilon: f64,
    /// The individual budget's delta.
    pub delta: f64,
    /// The Rényi order `alpha*` at which the budget is enforced.
    pub order: f64,
    /// The RDP budget at `alpha*`.
    pub rdp_budget: f64,
}

/// A summary of the ledger's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// Refuses a norm that is not a finite number >= 0 (field `norms`): the rule
/// every reported batch keeps, checked by the ledger and, before any shard
/// sees a step, where a sharded dataset's report is split.
pub fn check_norms(norms: &[f64]) -> Result<(), InvalidArgument> {
    match norms
        .iter()
        .enumerate()
        .find(|(_, g)| !(g.is_finite() && **g >= 0.0))
    {
        Some((j, g)) => Err(InvalidArgument::new(
            "norms",
            format!("norms[{j}] = {g}: every norm must be a finite number >= 0"),
        )),
        None => Ok(()),
    }
}

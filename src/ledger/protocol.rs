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
    /// Predictable mode: the scheduled refresh due before the next step, if
    /// any (only in the answer of the part that completes the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_due: Option<RefreshDue>,
}

/// The refresh that the public schedule calls for before a step (predictable
/// mode, spec §3.2): the trainer computes these examples' unclipped norms at
/// the current model and sends them before it clips the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RefreshDue {
    /// The step the refresh must arrive before (its thresholds apply from it).
    pub before_step: u64,
    /// True for a full pass (every example); false for a round-robin block.
    pub full: bool,
    /// The block's first id: the ids due are `(first_id + j) mod examples` for
    /// `j < count` (a full pass: `0..examples`).
    pub first_id: u64,
    /// How many ids are due (retired ids may be left out).
    pub count: u64,
    /// How many of them have arrived so far.
    pub received: u64,
}

impl RefreshDue {
    /// A sharded dataset's due refresh from its shards' (each a full pass
    /// over its own ids): one full pass over all of them, or `None` when no
    /// shard has one due.
    pub fn merge<'a>(parts: impl IntoIterator<Item = Option<&'a RefreshDue>>) -> Option<Self> {
        parts
            .into_iter()
            .flatten()
            .fold(None, |acc: Option<Self>, d| {
                Some(match acc {
                    None => d.clone(),
                    Some(a) => RefreshDue {
                        before_step: a.before_step.max(d.before_step),
                        full: a.full && d.full,
                        first_id: 0,
                        count: a.count + d.count,
                        received: a.received + d.received,
                    },
                })
            })
    }
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
    /// Predictable mode: what of the scheduled refresh is still due before
    /// `effective_step` (`received == count` once complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_due: Option<RefreshDue>,
}

/// Per-example privacy at the current step: three numbers with three
/// meanings (spec §10), each labelled with its kind and delta. Only
/// `guarantee` is a proven (epsilon, delta)-DP statement; the top-level
/// `epsilon` is always the guarantee.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExamplePrivacy {
    /// The example.
    pub id: u64,
    /// The guarantee's epsilon (`guarantee.epsilon`): the (epsilon,
    /// delta)-DP of the whole run for this example.
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
    /// past its individual budget before it could be retired: its guarantee
    /// falls back to the worst case.
    pub over_budget: bool,
    /// Its current clipping threshold (for the next step).
    pub threshold: f64,
}

/// One labelled number of an example's privacy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PrivacyPart {
    /// What the number means.
    pub kind: PrivacyKind,
    /// Its epsilon.
    pub epsilon: f64,
    /// Its delta.
    pub delta: f64,
}

/// What a per-example number means (spec §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LedgerKind {
    /// Every example charged at its predictable threshold (the predictable mode).
    Threshold,
    /// The old protocol's ledger, thresholds moved by sampled reports (or
    /// global clipping): estimates only.
    Sampled,
}

/// Which bound gave an example's `epsilon` (spec §8, §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// The budgets of their own that some labels have (fixed at creation);
    /// every other example has the one above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_budgets: Vec<LabelBudgetStatus>,
}

/// One label's budget under the individual filter, as enforced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LabelBudgetStatus {
    /// The label.
    pub label: String,
    /// The budget's epsilon.
    pub epsilon: f64,
    /// The budget's delta.
    pub delta: f64,
    /// The Rényi order `alpha*` at which it is enforced.
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

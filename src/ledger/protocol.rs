//! The messages of the step protocol and the answers of queries (spec §3).
//!
//! The step protocol's own messages are defined once, with the Rust client, in
//! the workspace crate `dpledger-api` (`dpledger_api::step`) and re-exported
//! here under their usual paths; the answers of queries are the server's.

use crate::accounting::InvalidArgument;
use serde::{Deserialize, Serialize};

pub use dpledger_api::status::{FilterStatus, LabelBudgetStatus, PendingStatus};

pub use dpledger_api::step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

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

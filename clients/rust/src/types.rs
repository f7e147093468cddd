//! Request and response bodies of the dataset, training and privacy endpoints,
//! field for field as in `openapi/openapi.json` (those of the release endpoints
//! are in [`crate::release`]). JSON has no infinity: the server writes an
//! unbounded epsilon or RDP as `null`, which these types read back as
//! `f64::INFINITY` so that no value is ever mistaken for a small one.

use serde::{Deserialize, Deserializer, Serialize};

/// The step protocol's messages, defined once with the server in the workspace
/// crate `dpledger-api`, so that what this client sends and reads is what the
/// server accepts and answers, field for field.
pub use dpledger_api::step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

/// `null` (the server's encoding of an infinite value) reads as `+inf`.
pub(crate) fn f64_or_inf<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// A list whose `null` entries read as `+inf`.
pub(crate) fn vec_f64_or_inf<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?
        .into_iter()
        .map(|x| x.unwrap_or(f64::INFINITY))
        .collect())
}

/// How batches are drawn. The accounting differs fundamentally between the two,
/// and a trainer must draw batches exactly as declared here.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Sampling {
    /// Each example joins each step independently with probability `rate`.
    Poisson {
        /// Default sampling rate `q`; a step may override it.
        rate: f64,
    },
    /// Fixed-size batches of a shuffled dataset, each example at most once per epoch.
    Shuffle {
        /// Batch size `b`.
        batch_size: u64,
    },
}

/// Who clips at which norm; decides whether per-example numbers are a guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clipping {
    /// The trainer clips each example at the threshold dpledger gave it: the
    /// per-example epsilons are guarantees.
    #[default]
    PerExample,
    /// The trainer clips everyone at `C`: per-example numbers are estimates.
    Global,
}

/// A per-example budget; enables the individual filter (spec §7), which retires
/// examples before they could exceed it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IndividualBudget {
    /// The epsilon no example may exceed (at `delta`).
    pub epsilon: f64,
    /// The delta at which `epsilon` is promised.
    pub delta: f64,
}

/// Whether thresholds are predictable (the server's default) or move with
/// sampled reports (the old protocol: every per-example number an estimate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThresholdMode {
    /// Thresholds change only at scheduled refreshes; per-example guarantees
    /// (through the filter) and ex-post bounds hold.
    Predictable,
    /// A step report moves a sampled example's threshold: estimates only.
    Sampled,
}

/// The predictable mode's public refresh schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RefreshSchedule {
    /// A full pass before steps `0, E, 2E, ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_every: Option<u64>,
    /// A round-robin block of `m` ids `(t*m + j) mod n` before every step `t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u64>,
}

/// The ex-post bound's orders and weights, fixed at creation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExPostOrders {
    /// Rényi orders (a subset of the dataset's).
    pub orders: Vec<f64>,
    /// Positive weights summing to 1.
    pub weights: Vec<f64>,
}

/// Everything fixed when a dataset's ledger is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetConfig {
    /// Number of examples `n`; ids are `0..n`.
    pub examples: u64,
    /// Maximum clipping norm `C`.
    pub max_grad_norm: f64,
    /// Rounding precision `r` of thresholds (server default `C / 100`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounding: Option<f64>,
    /// Default noise multiplier `sigma`.
    pub noise_multiplier: f64,
    /// How batches are drawn.
    pub sampling: Sampling,
    /// Rényi orders (server default: 64 orders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// Delta at which epsilons are reported by default.
    pub delta: f64,
    /// Who clips.
    #[serde(default)]
    pub clipping: Clipping,
    /// Optional individual budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub individual_budget: Option<IndividualBudget>,
    /// Budgets of their own for the examples of some labels, given with the
    /// labels at creation; every other example has `individual_budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_budgets: Option<std::collections::BTreeMap<String, IndividualBudget>>,
    /// The threshold mode (server default: predictable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ThresholdMode>,
    /// The predictable mode's refresh schedule (none: thresholds stay at `C`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshSchedule>,
    /// Steps the run plans (aims the default ex-post orders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_steps: Option<u64>,
    /// The ex-post orders (server default: derived at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ex_post: Option<ExPostOrders>,
}

impl DatasetConfig {
    /// A Poisson-sampled, per-example-clipped configuration with the server's
    /// defaults (rounding `C/100`, its 64 orders, no individual budget).
    pub fn poisson(
        examples: u64,
        max_grad_norm: f64,
        noise_multiplier: f64,
        rate: f64,
        delta: f64,
    ) -> Self {
        Self {
            examples,
            max_grad_norm,
            rounding: None,
            noise_multiplier,
            sampling: Sampling::Poisson { rate },
            orders: None,
            delta,
            clipping: Clipping::PerExample,
            individual_budget: None,
            label_budgets: None,
            thresholds: None,
            refresh: None,
            planned_steps: None,
            ex_post: None,
        }
    }
}

/// Body of `POST /v1/datasets`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CreateDataset<'a> {
    pub id: &'a str,
    pub config: &'a DatasetConfig,
    #[serde(flatten)]
    pub setup: &'a crate::release::DatasetSetup,
}

/// Dataset ids visible to the caller.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct DatasetList {
    pub datasets: Vec<String>,
}

/// A dataset's state, with the public worst case at its reporting delta.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DatasetView {
    /// The id.
    pub id: String,
    /// Archived datasets are read-only.
    pub archived: bool,
    /// The configuration it was created with.
    pub config: DatasetConfig,
    /// Ledger summary.
    pub status: LedgerStatus,
    /// The data-independent accountants (PLD and RDP) at the configured delta.
    pub worst_case: WorstCaseBounds,
    /// A sharded dataset's shards, in id order (`None`: unsharded; cluster
    /// mode).
    #[serde(default)]
    pub shards: Option<Vec<ShardView>>,
}

/// One shard of a sharded dataset: ids `start..end`, served by `owner` under
/// its own lease.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ShardView {
    /// The shard's internal dataset (`{dataset}~{start}`).
    pub dataset: String,
    /// First example id (inclusive).
    pub start: u64,
    /// End of the range (exclusive).
    pub end: u64,
    /// The node holding its live lease (`None`: it is moving).
    pub owner: Option<String>,
    /// The lease's epoch.
    pub epoch: u64,
    /// Steps the shard has applied.
    pub steps: u64,
}

pub use dpledger_api::status::{FilterStatus, LabelBudgetStatus, PendingStatus};

/// A summary of a ledger's state.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LedgerStatus {
    /// Number of examples.
    pub examples: u64,
    /// Number of Rényi orders kept per example.
    pub orders: usize,
    /// Steps applied so far (= the next step expected).
    pub steps: u64,
    /// A multi-part step that is half received, if any.
    #[serde(default)]
    pub pending: Option<PendingStatus>,
    /// False when the dataset is clipped globally.
    pub guarantee: bool,
    /// Examples retired by the individual filter.
    pub retired: u64,
    /// Examples pushed past their budget by overridden steps or releases.
    pub over_budget: u64,
    /// The filter's parameters, when an individual budget is set.
    #[serde(default)]
    pub filter: Option<FilterStatus>,
    /// Number of DP releases charged to every example.
    pub releases: u64,
    /// Prefix-sum segments held.
    pub segments: usize,
    /// Heap memory of the ledger, in bytes.
    pub memory_bytes: u64,
}

/// The data-independent RDP accountant at the current step (the `rdp` part of
/// [`WorstCaseBounds`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WorstCase {
    /// Its epsilon at the requested delta (`+inf` when unbounded).
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// The Rényi order attaining it.
    #[serde(deserialize_with = "f64_or_inf")]
    pub order: f64,
    /// Its RDP at each of the ledger's orders.
    #[serde(deserialize_with = "vec_f64_or_inf")]
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
}

/// Which accountant gave a worst-case epsilon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorstCaseMethod {
    /// The privacy loss distribution accountant (tightest; spec §8).
    Pld,
    /// The RDP accountant (spec §4).
    Rdp,
}

/// The PLD worst case: a proven upper bound for every example.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct PldWorstCase {
    /// Its epsilon at the requested delta.
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// Grid spacing of the privacy loss (losses rounded up on it).
    pub value_discretization: f64,
    /// Always true: a pessimistic discretisation.
    pub guarantee: bool,
}

/// The data-independent worst case by both accountants; `epsilon` is the tighter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WorstCaseBounds {
    /// The tightest proven worst-case epsilon, `min(pld.epsilon, rdp.epsilon)`.
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// The accountant that gave `epsilon`.
    pub method: WorstCaseMethod,
    /// Number of steps applied so far.
    pub steps: u64,
    /// The PLD worst case (`None` when it could not be computed: see `pld_error`).
    #[serde(default)]
    pub pld: Option<PldWorstCase>,
    /// Why there is no PLD worst case, if there is none.
    #[serde(default)]
    pub pld_error: Option<String>,
    /// The RDP worst case (epsilon, order, RDP vector).
    pub rdp: WorstCase,
}

/// Which bound gave an example's epsilon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The dataset's PLD worst case, which holds for every example.
    WorstCasePld,
    /// The dataset's RDP worst case.
    WorstCaseRdp,
    /// The individual filter's budget (predictable mode).
    IndividualFilter,
}

/// What a per-example number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrivacyKind {
    /// (epsilon, delta)-DP of the run for every example.
    WorstCase,
    /// (epsilon, delta)-DP of the run for this example through the filter.
    IndividualFilter,
    /// Ex post: `P'(L > epsilon) <= delta` for the released transcript.
    ExPost,
    /// No proven statement.
    Estimate,
}

/// One labelled number of an example's privacy.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct PrivacyPart {
    /// What it means.
    pub kind: PrivacyKind,
    /// Its epsilon (`+inf` when unbounded).
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// Its delta.
    pub delta: f64,
}

/// Which per-example ledger the numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerKind {
    /// Every example at its predictable threshold.
    Threshold,
    /// The old protocol's ledger (estimates only).
    Sampled,
}

/// Current clipping thresholds of a range of examples.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Thresholds {
    /// The first id.
    pub start: u64,
    /// The step these thresholds apply to (the next step).
    pub next_step: u64,
    /// Thresholds of ids `start, start+1, ...` (0 for retired examples).
    pub thresholds: Vec<f64>,
    /// Ids of the range the individual filter retired (a threshold of 0 alone
    /// may also mean a last norm of 0).
    #[serde(default)]
    pub retired: Vec<u64>,
    /// The scheduled refresh due before `next_step` (predictable mode).
    #[serde(default)]
    pub refresh_due: Option<RefreshDue>,
}

/// Body of `POST /v1/datasets/{d}/refresh`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RefreshRequest<'a> {
    pub ids: &'a [u64],
    pub norms: &'a [f64],
}

/// Which RDP-to-(epsilon, delta) conversion a query uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conversion {
    /// Balle et al. 2020 (tighter; the server's default).
    #[default]
    Improved,
    /// Mironov 2017.
    Classic,
}

impl Conversion {
    /// The query-string spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Conversion::Improved => "improved",
            Conversion::Classic => "classic",
        }
    }
}

/// Optional parameters of the privacy queries; `Default` asks for the dataset's
/// delta and the improved conversion.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PrivacyQuery {
    /// Delta in (0, 1); default the dataset's reporting delta.
    pub delta: Option<f64>,
    /// The conversion; default improved.
    pub conversion: Option<Conversion>,
}

impl PrivacyQuery {
    /// At a given delta.
    pub fn at_delta(delta: f64) -> Self {
        Self {
            delta: Some(delta),
            conversion: None,
        }
    }

    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(d) = self.delta {
            out.push(("delta", format!("{d:e}")));
        }
        if let Some(c) = self.conversion {
            out.push(("conversion", c.as_str().to_string()));
        }
        out
    }
}

/// One example's privacy at the current step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ExamplePrivacy {
    /// The example.
    pub id: u64,
    /// The guarantee's epsilon (`+inf` when unbounded): the (epsilon,
    /// delta)-DP of the run for this example.
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// The delta of every part.
    pub delta: f64,
    /// The bound that gave `epsilon`.
    pub bound: Bound,
    /// The guarantee (worst case, or the individual filter's).
    pub guarantee: PrivacyPart,
    /// The ex-post bound (predictable mode only).
    #[serde(default)]
    pub ex_post: Option<PrivacyPart>,
    /// The ledger's epsilon: an estimate, never a guarantee.
    pub estimate: PrivacyPart,
    /// Which ledger `rdp` and the estimate come from.
    pub ledger: LedgerKind,
    /// `estimate.epsilon`.
    #[serde(deserialize_with = "f64_or_inf")]
    pub rdp_epsilon: f64,
    /// The dataset's PLD worst case at the same delta (`None` when none).
    #[serde(default)]
    pub worst_case_pld_epsilon: Option<f64>,
    /// The Rényi order attaining `rdp_epsilon`.
    #[serde(deserialize_with = "f64_or_inf")]
    pub order: f64,
    /// Its accumulated RDP at each of the ledger's orders.
    #[serde(deserialize_with = "vec_f64_or_inf")]
    pub rdp: Vec<f64>,
    /// Number of steps applied so far.
    pub steps: u64,
    /// True when the individual filter has retired it.
    pub retired: bool,
    /// True when it was pushed past its individual budget.
    pub over_budget: bool,
    /// Its current clipping threshold (for the next step).
    pub threshold: f64,
}

/// One example's privacy with the worst case beside it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PrivacyView {
    /// The delta used.
    pub delta: f64,
    /// The example's own accounting.
    pub example: ExamplePrivacy,
    /// The data-independent accountants (PLD and RDP) at the same delta.
    pub worst_case: WorstCaseBounds,
    /// The example's PLD estimate, only when asked for
    /// ([`crate::Client::example_pld_estimate`]). NOT a guarantee.
    #[serde(default)]
    pub pld_estimate: Option<PldEstimate>,
}

/// Steps of one example at one (hyperparameter segment, grid level).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LevelSteps {
    /// The segment's sampling rate `q` (1 in shuffle mode: a Gaussian charge).
    pub sampling_rate: f64,
    /// The segment's noise multiplier `sigma`.
    pub noise_multiplier: f64,
    /// The threshold `v_k` the steps were charged at.
    pub threshold: f64,
    /// `sigma * C / v_k`: the noise multiplier of the sampled Gaussian composed.
    pub effective_noise_multiplier: f64,
    /// Number of steps charged there.
    pub steps: u64,
}

/// An example's PLD epsilon over its actual history of thresholds: an
/// estimate (`guarantee` is always false), never the example's guarantee.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PldEstimate {
    /// The estimate's epsilon at the query's delta.
    #[serde(deserialize_with = "f64_or_inf")]
    pub epsilon: f64,
    /// Always false: PLD composition under adaptive thresholds is not proven.
    pub guarantee: bool,
    /// Grid spacing of the privacy loss.
    pub value_discretization: f64,
    /// Steps composed.
    pub steps: u64,
    /// Releases composed.
    pub releases: u64,
    /// The example's steps per (segment, level).
    pub levels: Vec<LevelSteps>,
}

/// Liveness / readiness.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Health {
    /// `"ok"`.
    pub status: String,
}

/// What the service keeps where (`GET /v1/admin/storage`, admin only).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StorageReport {
    /// Where the store is (no secrets).
    pub store: String,
    /// Records in the log (compacted ones included).
    pub log_records: u64,
    /// Payload bytes of the log's records.
    pub log_bytes: u64,
    /// Bytes of complete snapshots.
    pub snapshot_bytes: u64,
    /// Bytes of archives of archived datasets' answers.
    pub archive_bytes: u64,
    /// Memory held by every dataset's ledger.
    pub memory_bytes: u64,
    /// Datasets whose ledger is in memory.
    pub datasets_in_memory: u64,
    /// Datasets paged out.
    pub datasets_paged_out: u64,
    /// The sampled-Gaussian table cache.
    pub table_cache: TableCacheReport,
    /// The PLD estimates' cache of level spectra and answers.
    pub estimate_cache: EstimateCacheReport,
    /// Every dataset.
    pub datasets: Vec<DatasetStorageReport>,
}

/// The table cache's size against its bound.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TableCacheReport {
    /// Tables held.
    pub tables: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// The bound.
    pub bound_bytes: u64,
    /// Tables dropped to stay within the bound.
    pub evictions: u64,
}

/// The PLD estimates' cache against its bound.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EstimateCacheReport {
    /// Spectrum pairs held (per level, grid and FFT size).
    pub spectra: u64,
    /// MGF pairs held (per level and grid).
    pub mgfs: u64,
    /// Finished answers held.
    pub answers: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// The bound.
    pub bound_bytes: u64,
    /// Entries dropped to stay within the bound.
    pub evictions: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that computed their value.
    pub misses: u64,
}

/// One dataset's part of the storage report.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DatasetStorageReport {
    /// Its id.
    pub id: String,
    /// Archived (read-only).
    pub archived: bool,
    /// Out of memory until its next request.
    pub paged_out: bool,
    /// Its examples.
    pub examples: u64,
    /// Steps applied.
    pub steps: u64,
    /// Memory its ledger holds now.
    pub memory_bytes: u64,
    /// `memory_bytes` per example (0 while paged out; the compact ledger,
    /// docs/ledger-memory.md).
    #[serde(default)]
    pub memory_bytes_per_example: f64,
    /// The newest snapshot's bytes per example (0 without a snapshot).
    #[serde(default)]
    pub snapshot_bytes_per_example: f64,
    /// Seconds since it was last read or changed.
    pub idle_seconds: f64,
    /// Sequence number of its last record.
    pub last_seq: u64,
    /// Its records in the log.
    pub log_records: u64,
    /// Payload bytes of its records.
    pub log_bytes: u64,
    /// Bytes of its snapshots.
    pub snapshot_bytes: u64,
    /// Bytes of its archive.
    pub archive_bytes: u64,
    /// Its newest complete snapshot.
    #[serde(default)]
    pub newest_snapshot: Option<SnapshotReport>,
    /// Records applied since that snapshot (what a restart replays).
    pub records_since_snapshot: u64,
}

/// A dataset's newest snapshot.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SnapshotReport {
    /// Catalogue id.
    pub id: u64,
    /// The record it was taken at.
    pub seq: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was written (seconds since the Unix epoch).
    pub created: u64,
    /// Seconds since it was written.
    pub age_seconds: u64,
    /// Kept by a compaction.
    pub pinned: bool,
}

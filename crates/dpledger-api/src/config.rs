//! A dataset's configuration as `POST /v1/datasets` takes it and every
//! dataset view shows it: everything fixed when a dataset's ledger is created,
//! with the pure rules that read it (the threshold mode in force, the epoch of
//! shuffled batches, the refresh schedule's block). The server's validation
//! and creation defaults, which need its accounting, stay in the server
//! (`dpledger::ledger::DatasetConfigExt`); so do its limits.
//!
//! The server is strict (`deny_unknown_fields`): a body with a field it does
//! not know is refused rather than half understood. The Rust client reads
//! configurations with the same type, so it refuses an answer with a field it
//! does not know too: client and server are released from one workspace.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How batches are drawn. The accounting differs fundamentally between the two.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Sampling {
    /// Each example joins each step independently with probability `rate`
    /// (amplification by sampling; every step charges every example).
    Poisson {
        /// Default sampling rate `q`; a step may override it.
        rate: f64,
    },
    /// Fixed-size batches of a shuffled dataset: each example is in at most one
    /// batch per epoch and is charged only at the step that processed it (the
    /// Gaussian mechanism at its clipped norm, no amplification; seed 002 Thm. 2).
    ///
    /// Epoch rule: with `S = ceil(n / b)` steps per epoch, steps `e S ..= e S + S - 1`
    /// form epoch `e` (one pass over the data, the last batch possibly short, as a
    /// data loader that keeps the last batch produces). An example reported twice in
    /// one epoch is refused (the ledger's `EpochViolation`). The worst case is one
    /// Gaussian charge at `C` per epoch begun, `ceil(T / S)` after `T` steps, at
    /// that epoch's smallest noise multiplier; this equals `ceil(T b / n)` when `b`
    /// divides `n`. A shard of a sharded dataset counts the dataset's `S`
    /// (`epoch_steps`), not its own.
    Shuffle {
        /// Batch size `b`.
        batch_size: u64,
        /// Steps per epoch `S` when it is not `ceil(n / b)`: set only on the
        /// shards of a sharded dataset, to the dataset's
        /// `ceil(n / b)`, because a shard's epochs span the whole dataset, not
        /// its own examples. Refused on any other dataset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch_steps: Option<u64>,
    },
}

/// Who clips gradients at which norm; decides whether per-example numbers are a
/// guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Clipping {
    /// The trainer clips every example at the threshold the ledger gave it
    /// (spec §3): per-example numbers are a guarantee.
    #[default]
    PerExample,
    /// The trainer clips at `C` for everyone (the seed's Algorithm 1 as published):
    /// the same arithmetic, but per-example numbers are only an estimate.
    Global,
}

/// Whether thresholds are predictable, which decides what per-example numbers
/// may claim (spec §3, §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ThresholdMode {
    /// Thresholds change only at refreshes on the public schedule declared at
    /// creation; a step report never moves one. Every example is charged at
    /// its threshold (the threshold ledger), which is predictable from the
    /// released outputs: the individual filter's guarantee and the ex-post
    /// bound hold (spec §7, §10). The default for new datasets.
    Predictable,
    /// The old protocol: a step report moves a sampled example's threshold to
    /// its observed norm. Later charges then depend on the example's hidden
    /// sampling bits and can under-charge (spec §10), so every per-example
    /// number is an estimate and only the worst case is a guarantee. Datasets
    /// created before the predictable mode existed replay in this mode.
    Sampled,
}

/// The order set and weights of the ex-post bound (spec §10), fixed at
/// creation from public information.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExPostOrders {
    /// Rényi orders, a sorted subset of the dataset's orders.
    pub orders: Vec<f64>,
    /// Positive weights summing to 1, one per order.
    pub weights: Vec<f64>,
}

/// Per-example privacy budget for the individual filter (spec §7).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct IndividualBudget {
    /// The epsilon no example may exceed (at `delta`).
    pub epsilon: f64,
    /// The delta at which `epsilon` is promised.
    pub delta: f64,
}

/// Everything fixed when a dataset's ledger is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// Number of examples `n`; ids are `0..n`.
    pub examples: u64,
    /// Maximum clipping norm `C`.
    pub max_grad_norm: f64,
    /// Rounding precision `r` of thresholds (default `C / 100`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounding: Option<f64>,
    /// Default noise multiplier `sigma`; a step may override it.
    pub noise_multiplier: f64,
    /// How batches are drawn.
    pub sampling: Sampling,
    /// Rényi orders (default: the ledger's 64 orders). Sorted and deduplicated
    /// by the ledger; every RDP vector it reports follows the sorted list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orders: Option<Vec<f64>>,
    /// Delta at which epsilons are reported by default.
    pub delta: f64,
    /// Who clips; `global` marks every per-example number as an estimate.
    #[serde(default)]
    pub clipping: Clipping,
    /// Optional individual budget: enables the individual filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub individual_budget: Option<IndividualBudget>,
    /// Budgets of their own for the examples of some labels (spec §7), fixed
    /// at creation with the labels given there: an example whose creation
    /// label is listed has that budget, every other example the
    /// `individual_budget`. Labels then stay as created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_budgets: Option<BTreeMap<String, IndividualBudget>>,
    /// Predictable thresholds (the default when a dataset is created) or the
    /// old sampled protocol. Absent only in configurations stored before the
    /// predictable mode existed, which replay as `sampled`
    /// ([`DatasetConfig::threshold_mode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ThresholdMode>,
    /// The predictable mode's refresh schedule (none: thresholds stay at `C`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshSchedule>,
    /// Steps the run plans (public); the default ex-post order set is aimed at
    /// them. Default: twenty epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_steps: Option<u64>,
    /// The ex-post bound's orders and weights (predictable mode; filled in at
    /// creation when absent: the server's creation defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ex_post: Option<ExPostOrders>,
}

impl DatasetConfig {
    /// A Poisson-sampled, per-example-clipped configuration with the server's
    /// defaults (rounding `C/100`, the 64 ledger orders, no individual
    /// budget, and no threshold mode: the server creates the dataset with
    /// predictable thresholds). A ledger built from it directly, without the
    /// server's creation defaults (as the server's own tests and benches do),
    /// runs the sampled protocol ([`DatasetConfig::threshold_mode`]).
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

    /// The threshold mode in force: `sampled` for a configuration stored
    /// before the predictable mode existed (nothing is relabelled up).
    pub fn threshold_mode(&self) -> ThresholdMode {
        self.thresholds.unwrap_or(ThresholdMode::Sampled)
    }

    /// True when thresholds are predictable and clipping per example: the
    /// threshold ledger then supports the filter's guarantee and the ex-post
    /// bound (spec §7, §10).
    pub fn is_predictable(&self) -> bool {
        self.threshold_mode() == ThresholdMode::Predictable && self.clipping == Clipping::PerExample
    }

    /// The planned steps, or twenty epochs (`20 / q` Poisson steps).
    pub fn planned_steps_or_default(&self) -> u64 {
        self.planned_steps.unwrap_or(match self.sampling {
            Sampling::Poisson { rate } => (20.0 / rate).ceil().min(1e12) as u64,
            Sampling::Shuffle { .. } => 20 * self.steps_per_epoch().unwrap_or(1),
        })
    }

    /// Whether this is the configuration of one shard of a sharded dataset
    /// with shuffled batches (only such a shard sets `epoch_steps`: a
    /// shuffled epoch spans every shard).
    pub fn is_shuffled_shard(&self) -> bool {
        matches!(
            self.sampling,
            Sampling::Shuffle {
                epoch_steps: Some(_),
                ..
            }
        )
    }

    /// Shuffle mode: the steps of one epoch, `epoch_steps` or `ceil(n / b)`
    /// (`None` for Poisson sampling).
    pub fn steps_per_epoch(&self) -> Option<u64> {
        match self.sampling {
            Sampling::Poisson { .. } => None,
            Sampling::Shuffle {
                batch_size,
                epoch_steps,
            } => Some(epoch_steps.unwrap_or_else(|| self.examples.div_ceil(batch_size.max(1)))),
        }
    }

    /// The rounding precision in force: `rounding`, or `C / 100` when absent.
    pub fn effective_rounding(&self) -> f64 {
        self.rounding.unwrap_or(self.max_grad_norm / 100.0)
    }
}

/// The public refresh schedule of the predictable mode (spec §3.2): which
/// examples' unclipped norms the trainer reports, computed at one model state,
/// before which steps. Fixed at creation, independent of the sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RefreshSchedule {
    /// A full pass (every example) before steps `0, E, 2E, ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_every: Option<u64>,
    /// A round-robin block of `m` ids before every step `t`: ids
    /// `(t*m + j) mod n` for `j < m` (covered by a full pass when both are due).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u64>,
    /// Set by the cluster on the shards of a sharded dataset (never by a
    /// user): where this shard's ids sit in the dataset's id space. The
    /// round-robin block is defined over the dataset's ids, so each shard is
    /// due the part of the dataset's block that falls in its range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardSpan>,
}

/// A shard's ids within its dataset's: its id `i` is the dataset's
/// `start + i`, out of the dataset's `dataset_examples`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ShardSpan {
    /// The dataset id of the shard's id 0.
    pub start: u64,
    /// The dataset's number of examples (every shard's together).
    pub dataset_examples: u64,
}

impl RefreshSchedule {
    /// The round-robin block due before step `t` over this dataset's `n` ids:
    /// `(first, count)`, the ids `(first + j) mod n` for `j < count`; `None`
    /// without a block, or for a shard none of whose ids are in the
    /// dataset's block. A shard's part of the dataset's (cyclic) block is
    /// one cyclic range of its own ids: a block that wraps past the
    /// dataset's last id meets a shard in at most its tail and its head.
    pub fn block_before(&self, t: u64, n: u64) -> Option<(u64, u64)> {
        let m = self.block?;
        let (start, total) = self.shard.map_or((0, n), |s| (s.start, s.dataset_examples));
        if total == 0 || n == 0 {
            return None;
        }
        let first = ((t as u128 * m as u128) % total as u128) as u64;
        let count = m.min(total);
        // The dataset's block as up to two plain ranges, cut to this range.
        let end = start + n;
        let cut = |a: u64, b: u64| (a.max(start), b.min(end));
        let tail = cut(first, (first + count).min(total));
        let head = cut(0, (first + count).saturating_sub(total));
        let (tail, head) = (
            (tail.0 < tail.1).then_some(tail),
            (head.0 < head.1).then_some(head),
        );
        match (tail, head) {
            (None, None) => None,
            (Some((a, b)), None) | (None, Some((a, b))) => Some((a - start, b - a)),
            // The tail runs to the end of this range and the head starts at
            // its beginning: one range that wraps around this range's ids.
            (Some((a, b)), Some((c, d))) => Some((a - start, ((b - a) + (d - c)).min(n))),
        }
    }
}

/// Which RDP-to-DP conversion to apply (spec §5): a query parameter of the
/// privacy queries and a field of the stateless accountant's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conversion {
    /// Balle et al. 2020 / Canonne–Kamath–Steinke 2020 (tighter; the default).
    #[default]
    Improved,
    /// Mironov 2017: `rdp + log(1/delta)/(alpha-1)`.
    Classic,
}

impl Conversion {
    /// The spelling in JSON and in query strings.
    pub fn as_str(self) -> &'static str {
        match self {
            Conversion::Improved => "improved",
            Conversion::Classic => "classic",
        }
    }
}

impl std::str::FromStr for Conversion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "improved" => Ok(Self::Improved),
            "classic" => Ok(Self::Classic),
            other => Err(format!("expected improved or classic, got {other:?}")),
        }
    }
}

//! A dataset's ledger configuration.

use crate::accounting::error::{InvalidArgument, Result};
use crate::accounting::grid::BucketGrid;
use crate::accounting::orders::ledger_orders;
use crate::accounting::validate;
use crate::ledger::refresh_schedule::RefreshSchedule;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest number of examples: ids are kept as `u32` in the filter's queue, and
/// at ~530 bytes per example more would not fit in memory anyway.
pub const MAX_EXAMPLES: u64 = u32::MAX as u64;

/// Largest number of Rényi orders: every order costs 8 bytes per example.
pub const MAX_ORDERS: usize = 256;

/// Most labels with a budget of their own: with the dataset's, the classes fit
/// in one byte per example.
pub const MAX_LABEL_BUDGETS: usize = 255;

/// How batches are drawn. The accounting differs fundamentally between the two.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// one epoch is refused ([`LedgerError::EpochViolation`]). The worst case is one
    /// Gaussian charge at `C` per epoch begun, `ceil(T / S)` after `T` steps, at
    /// that epoch's smallest noise multiplier; this equals `ceil(T b / n)` when `b`
    /// divides `n`. A shard of a sharded dataset counts the dataset's `S`
    /// (`epoch_steps`), not its own.
    ///
    /// [`LedgerError::EpochViolation`]: super::LedgerError::EpochViolation
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExPostOrders {
    /// Rényi orders, a sorted subset of the dataset's orders.
    pub orders: Vec<f64>,
    /// Positive weights summing to 1, one per order.
    pub weights: Vec<f64>,
}

/// Per-example privacy budget for the individual filter (spec §7).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IndividualBudget {
    /// The epsilon no example may exceed (at `delta`).
    pub epsilon: f64,
    /// The delta at which `epsilon` is promised.
    pub delta: f64,
}

/// Everything fixed when a dataset's ledger is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// Rényi orders (default [`ledger_orders`], 64 orders). Sorted and deduplicated
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
    /// creation when absent, see [`DatasetConfig::with_creation_defaults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ex_post: Option<ExPostOrders>,
}

impl DatasetConfig {
    /// A Poisson-sampled, per-example-clipped configuration with the defaults
    /// (rounding `C/100`, the 64 ledger orders, no individual budget).
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
            thresholds: Some(ThresholdMode::Sampled),
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

    /// The configuration a new dataset is created with: the threshold mode
    /// made explicit (predictable, unless clipping is global, where only the
    /// sampled protocol exists) and, in the
    /// predictable mode, the ex-post order set aimed at the planned steps.
    /// The result is what the log stores, so a replay never re-derives it.
    pub fn with_creation_defaults(mut self) -> Result<Self> {
        if self.thresholds.is_none() {
            let predictable = self.clipping == Clipping::PerExample;
            self.thresholds = Some(if predictable {
                ThresholdMode::Predictable
            } else {
                ThresholdMode::Sampled
            });
        }
        self.validate()?;
        if self.is_predictable() && self.ex_post.is_none() {
            let orders = self.sorted_orders()?;
            let grid = self.grid()?;
            use crate::accounting::table::StepMechanism;
            // Planned charges: Poisson steps, or shuffled epochs (one
            // Gaussian charge each).
            let sigma = self.noise_multiplier;
            let (mechanism, charges) = match self.sampling {
                Sampling::Poisson { rate } => (
                    StepMechanism::Poisson { q: rate, sigma },
                    self.planned_steps_or_default(),
                ),
                Sampling::Shuffle { .. } => (
                    StepMechanism::Gaussian { sigma },
                    self.planned_steps_or_default()
                        .div_ceil(self.steps_per_epoch().unwrap_or(1).max(1)),
                ),
            };
            let chosen = crate::accounting::ex_post::default_ex_post_orders(
                &orders, mechanism, charges, &grid, self.delta,
            );
            let weights = crate::accounting::ex_post::equal_weights(chosen.len());
            self.ex_post = Some(ExPostOrders {
                orders: chosen,
                weights,
            });
        }
        Ok(self)
    }

    /// The planned steps, or twenty epochs (`20 / q` Poisson steps).
    pub fn planned_steps_or_default(&self) -> u64 {
        self.planned_steps.unwrap_or(match self.sampling {
            Sampling::Poisson { rate } => (20.0 / rate).ceil().min(1e12) as u64,
            Sampling::Shuffle { .. } => 20 * self.steps_per_epoch().unwrap_or(1),
        })
    }

    /// Check every field, naming the first bad one (`sampling.rate`,
    /// `individual_budget.epsilon`, ...).
    pub fn validate(&self) -> Result<()> {
        if self.examples == 0 || self.examples > MAX_EXAMPLES {
            return Err(InvalidArgument::new(
                "examples",
                format!(
                    "must be between 1 and {MAX_EXAMPLES}, got {}",
                    self.examples
                ),
            ));
        }
        self.grid()?;
        validate::positive_noise_multiplier("noise_multiplier", self.noise_multiplier)?;
        match self.sampling {
            Sampling::Poisson { rate } => {
                validate::sampling_rate("sampling.rate", rate)?;
            }
            Sampling::Shuffle {
                batch_size,
                epoch_steps: Some(steps),
            } => {
                // A shard: its batch may be larger than its examples, and
                // its epoch at least as long as a pass over them.
                if batch_size == 0 {
                    return Err(InvalidArgument::new(
                        "sampling.batch_size",
                        format!("must be at least 1, got {batch_size}"),
                    ));
                }
                if steps < self.examples.div_ceil(batch_size) {
                    return Err(InvalidArgument::new(
                        "sampling.epoch_steps",
                        format!(
                            "must be at least ceil(examples / batch_size) = {}, got {steps}",
                            self.examples.div_ceil(batch_size)
                        ),
                    ));
                }
            }
            Sampling::Shuffle {
                batch_size,
                epoch_steps: None,
            } => {
                if batch_size == 0 || batch_size > self.examples {
                    return Err(InvalidArgument::new(
                        "sampling.batch_size",
                        format!(
                            "must be between 1 and examples = {}, got {batch_size}",
                            self.examples
                        ),
                    ));
                }
            }
        }
        self.sorted_orders()?;
        validate::delta("delta", self.delta)?;
        if let Some(budget) = self.individual_budget {
            validate::positive("individual_budget.epsilon", budget.epsilon)?;
            validate::delta("individual_budget.delta", budget.delta)?;
        }
        self.validate_label_budgets()?;
        self.validate_threshold_mode()
    }

    /// Budgets per label: beside a dataset budget (the examples of other
    /// labels need one), fewer than 256 (a byte per example says which), each
    /// label one that a label assignment accepts.
    fn validate_label_budgets(&self) -> Result<()> {
        let Some(budgets) = &self.label_budgets else {
            return Ok(());
        };
        if self.individual_budget.is_none() {
            return Err(InvalidArgument::new(
                "label_budgets",
                "needs individual_budget too: it is the budget of every example whose label has none of its own",
            ));
        }
        if budgets.len() > MAX_LABEL_BUDGETS {
            return Err(InvalidArgument::new(
                "label_budgets",
                format!("at most {MAX_LABEL_BUDGETS} labels, got {}", budgets.len()),
            ));
        }
        for (label, budget) in budgets {
            crate::release::check_label("label_budgets", label)?;
            validate::positive(&format!("label_budgets.{label}.epsilon"), budget.epsilon)?;
            validate::delta(&format!("label_budgets.{label}.delta"), budget.delta)?;
        }
        Ok(())
    }

    /// The predictable mode's settings: per-example clipping, a schedule
    /// with positive periods, ex-post orders a weighted subset of the orders.
    fn validate_threshold_mode(&self) -> Result<()> {
        let mode = self.threshold_mode();
        if mode == ThresholdMode::Predictable && self.clipping == Clipping::Global {
            return Err(InvalidArgument::new(
                "thresholds",
                "global clipping has no per-example thresholds to predict; use \"sampled\" (every per-example number is then an estimate)",
            ));
        }
        if let Some(schedule) = self.refresh {
            if mode != ThresholdMode::Predictable {
                return Err(InvalidArgument::new(
                    "refresh",
                    "a refresh schedule belongs to the predictable mode (\"thresholds\": \"predictable\"); the sampled mode takes refreshes at any time",
                ));
            }
            if schedule.full_every == Some(0) {
                return Err(InvalidArgument::new(
                    "refresh.full_every",
                    "must be at least 1",
                ));
            }
            if let Some(epoch) = self.steps_per_epoch() {
                // Shuffled batches: thresholds change only at epoch
                // boundaries (spec §3.6).
                if schedule.block.is_some() {
                    return Err(InvalidArgument::new(
                        "refresh.block",
                        "with shuffled batches thresholds change only at epoch boundaries: refresh by full passes (refresh.full_every, a multiple of the epoch's steps)",
                    ));
                }
                if let Some(e) = schedule.full_every.filter(|e| e % epoch != 0) {
                    return Err(InvalidArgument::new(
                        "refresh.full_every",
                        format!(
                            "with shuffled batches thresholds change only at epoch boundaries: must be a multiple of the epoch's {epoch} steps, got {e}"
                        ),
                    ));
                }
            }
            let examples = match schedule.shard {
                Some(span) => {
                    if schedule.block.is_none()
                        || span
                            .start
                            .checked_add(self.examples)
                            .is_none_or(|end| end > span.dataset_examples)
                    {
                        return Err(InvalidArgument::new(
                            "refresh.shard",
                            "is set by the cluster on a sharded dataset's shards (a round-robin block over ids that fit the dataset's): leave it out",
                        ));
                    }
                    span.dataset_examples
                }
                None => self.examples,
            };
            match schedule.block {
                Some(0) => return Err(InvalidArgument::new("refresh.block", "must be at least 1")),
                Some(m) if m > examples => {
                    return Err(InvalidArgument::new(
                        "refresh.block",
                        format!(
                            "must be at most examples = {examples}, got {m} (use full_every for full passes)"
                        ),
                    ))
                }
                _ => {}
            }
        }
        if let Some(ex_post) = &self.ex_post {
            if mode != ThresholdMode::Predictable {
                return Err(InvalidArgument::new(
                    "ex_post",
                    "the ex-post bound exists only in the predictable mode",
                ));
            }
            crate::accounting::ex_post::validate_ex_post_orders(&ex_post.orders, &ex_post.weights)?;
            let orders = self.sorted_orders()?;
            if let Some(a) = ex_post.orders.iter().find(|a| !orders.contains(a)) {
                return Err(InvalidArgument::new(
                    "ex_post.orders",
                    format!("{a} is not one of the dataset's orders"),
                ));
            }
        }
        if self.planned_steps == Some(0) {
            return Err(InvalidArgument::new("planned_steps", "must be at least 1"));
        }
        Ok(())
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

    /// The bucket grid of this configuration.
    pub fn grid(&self) -> Result<BucketGrid> {
        validate::positive("max_grad_norm", self.max_grad_norm)?;
        BucketGrid::new(self.max_grad_norm, self.effective_rounding())
    }

    /// The orders the ledger keeps: sorted, without duplicates, all finite (an
    /// infinite order has infinite RDP for every Gaussian step, which would turn the
    /// prefix-sum differences into NaN).
    pub fn sorted_orders(&self) -> Result<Vec<f64>> {
        let orders = match &self.orders {
            Some(list) => validate::orders("orders", list)?,
            None => ledger_orders(),
        };
        if let Some(bad) = orders.iter().find(|a| !a.is_finite()) {
            return Err(InvalidArgument::new(
                "orders",
                format!("every order must be finite, got {bad}"),
            ));
        }
        if orders.len() > MAX_ORDERS {
            return Err(InvalidArgument::new(
                "orders",
                format!(
                    "at most {MAX_ORDERS} orders (8 bytes per example each), got {}",
                    orders.len()
                ),
            ));
        }
        Ok(orders)
    }
}

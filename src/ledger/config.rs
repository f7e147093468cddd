//! A dataset's ledger configuration: the server's limits and rules about it.

use crate::accounting::error::{InvalidArgument, Result};
use crate::accounting::grid::BucketGrid;
use crate::accounting::orders::ledger_orders;
use crate::accounting::validate;

/// The configuration's types, defined once with the Rust client in the
/// workspace crate `dpledger-api`, under their usual paths.
pub use dpledger_api::config::{
    Clipping, DatasetConfig, ExPostOrders, IndividualBudget, Sampling, ThresholdMode,
};

/// Largest number of examples: ids are kept as `u32` in the filter's queue, and
/// at ~530 bytes per example more would not fit in memory anyway.
pub const MAX_EXAMPLES: u64 = u32::MAX as u64;

/// Largest number of Rényi orders: every order costs 8 bytes per example.
pub const MAX_ORDERS: usize = 256;

/// Most labels with a budget of their own: with the dataset's, the classes fit
/// in one byte per example.
pub const MAX_LABEL_BUDGETS: usize = 255;

/// The server's rules about a configuration, beside the type (defined once
/// with the Rust client in `dpledger_api::config`): its validation, which
/// names the field at fault in the accounting layer's error, and what
/// creating a dataset fills in, which needs the accountants. Import it to call
/// them as methods (`config.validate()`).
pub trait DatasetConfigExt: Sized {
    /// The configuration a new dataset is created with: the threshold mode
    /// made explicit (predictable, unless clipping is global, where only the
    /// sampled protocol exists) and, in the
    /// predictable mode, the ex-post order set aimed at the planned steps.
    /// The result is what the log stores, so a replay never re-derives it.
    fn with_creation_defaults(self) -> Result<Self>;

    /// Check every field, naming the first bad one (`sampling.rate`,
    /// `individual_budget.epsilon`, ...).
    fn validate(&self) -> Result<()>;

    /// The bucket grid of this configuration.
    fn grid(&self) -> Result<BucketGrid>;

    /// The orders the ledger keeps: sorted, without duplicates, all finite (an
    /// infinite order has infinite RDP for every Gaussian step, which would turn the
    /// prefix-sum differences into NaN).
    fn sorted_orders(&self) -> Result<Vec<f64>>;
}

impl DatasetConfigExt for DatasetConfig {
    fn with_creation_defaults(mut self) -> Result<Self> {
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

    fn validate(&self) -> Result<()> {
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
        validate_label_budgets(self)?;
        validate_threshold_mode(self)
    }

    fn grid(&self) -> Result<BucketGrid> {
        validate::positive("max_grad_norm", self.max_grad_norm)?;
        BucketGrid::new(self.max_grad_norm, self.effective_rounding())
    }

    fn sorted_orders(&self) -> Result<Vec<f64>> {
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

/// Budgets per label: beside a dataset budget (the examples of other
/// labels need one), fewer than 256 (a byte per example says which), each
/// label one that a label assignment accepts.
fn validate_label_budgets(config: &DatasetConfig) -> Result<()> {
    let Some(budgets) = &config.label_budgets else {
        return Ok(());
    };
    if config.individual_budget.is_none() {
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
fn validate_threshold_mode(config: &DatasetConfig) -> Result<()> {
    let mode = config.threshold_mode();
    if mode == ThresholdMode::Predictable && config.clipping == Clipping::Global {
        return Err(InvalidArgument::new(
            "thresholds",
            "global clipping has no per-example thresholds to predict; use \"sampled\" (every per-example number is then an estimate)",
        ));
    }
    if let Some(schedule) = config.refresh {
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
        if let Some(epoch) = config.steps_per_epoch() {
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
                        .checked_add(config.examples)
                        .is_none_or(|end| end > span.dataset_examples)
                {
                    return Err(InvalidArgument::new(
                        "refresh.shard",
                        "is set by the cluster on a sharded dataset's shards (a round-robin block over ids that fit the dataset's): leave it out",
                    ));
                }
                span.dataset_examples
            }
            None => config.examples,
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
    if let Some(ex_post) = &config.ex_post {
        if mode != ThresholdMode::Predictable {
            return Err(InvalidArgument::new(
                "ex_post",
                "the ex-post bound exists only in the predictable mode",
            ));
        }
        crate::accounting::ex_post::validate_ex_post_orders(&ex_post.orders, &ex_post.weights)?;
        let orders = config.sorted_orders()?;
        if let Some(a) = ex_post.orders.iter().find(|a| !orders.contains(a)) {
            return Err(InvalidArgument::new(
                "ex_post.orders",
                format!("{a} is not one of the dataset's orders"),
            ));
        }
    }
    if config.planned_steps == Some(0) {
        return Err(InvalidArgument::new("planned_steps", "must be at least 1"));
    }
    Ok(())
}

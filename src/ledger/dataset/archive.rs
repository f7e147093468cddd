//! What an archived ledger's queries need once the ledger is out of memory:
//! per example, its final RDP vector, flags, threshold and
//! PLD-estimate input ([`ArchivedExample`], kept in the store); for the dataset,
//! the few kilobytes every answer shares ([`ArchiveSummary`], kept in memory).
//! Answers computed from them go through the same functions as the live
//! ledger's, so they are bit for bit the same.

use super::columns::{ALL_TOP, LEFT_OUT, OVER_BUDGET, RETIRED};
use super::query::worst_case_of;
use super::{Accrual, Ledger};
use crate::accounting::conversion::Conversion;
use crate::accounting::grid::BucketGrid;
use crate::accounting::pld::PldEvent;
use crate::ledger::config::DatasetConfig;
use crate::ledger::error::LedgerError;
use crate::ledger::estimate::{EstimateInput, LevelSteps};
use crate::ledger::protocol::{ExamplePrivacy, WorstCase};
use crate::ledger::served::{example_privacy, ExampleFacts, ExampleLedgers, ServedContext};
use serde::{Deserialize, Serialize};

/// One example of an archived dataset, as its queries need it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchivedExample {
    /// Its RDP at the final step, releases included; `None` when it is exactly
    /// the worst case's (an example only ever charged at the top bucket).
    pub rdp: Option<Vec<f64>>,
    /// Retired by the individual filter.
    pub retired: bool,
    /// Pushed past its individual budget.
    pub over_budget: bool,
    /// Its final clipping threshold.
    pub threshold: f64,
    /// What its PLD estimate composes (steps per segment and level), or why
    /// there is none.
    pub levels: Result<Vec<LevelSteps>, String>,
    /// Its budget class under the individual filter (last, so that archives
    /// written before budgets per label existed, which lack it, read as the
    /// dataset's).
    #[serde(default)]
    pub budget_class: u8,
    /// Its discounted ledger `R`, for its estimate, when it differs from
    /// `rdp` (predictable mode; last, absent in older archives).
    #[serde(default)]
    pub discounted: Option<Vec<f64>>,
}

/// What every answer about an archived dataset shares.
#[derive(Debug, Clone)]
pub struct ArchiveSummary {
    /// Its configuration.
    pub config: DatasetConfig,
    orders: Vec<f64>,
    steps: u64,
    releases: u64,
    worst_rdp: Vec<f64>,
    pld_events: Option<Vec<PldEvent>>,
    release_events: Option<Vec<PldEvent>>,
    grid: BucketGrid,
    /// The individual filter's `(order, RDP budget)` per budget class (empty
    /// without a filter).
    filter: Vec<(f64, f64)>,
}

impl Ledger {
    /// Example `id` as an archived dataset's queries need it.
    pub fn archived_example(&self, id: u64) -> Result<ArchivedExample, LedgerError> {
        let i = self.check_id(id)?;
        let f = self.flags[i];
        let top_only = matches!(self.accrual, Accrual::Poisson(_))
            && f & ALL_TOP != 0
            && f & (RETIRED | LEFT_OUT) == 0;
        // Its RDP, evaluated once: stored unless it is the worst case's, and
        // the base of its discounted ledger when it has one.
        let full = (!top_only || self.has_discounts(i)).then(|| {
            let mut rdp = vec![0.0; self.m];
            self.rdp_into(i, &mut rdp);
            rdp
        });
        let discounted = full.as_deref().and_then(|rdp| self.discounted(i, rdp));
        Ok(ArchivedExample {
            rdp: full.filter(|_| !top_only),
            retired: f & RETIRED != 0,
            over_budget: f & OVER_BUDGET != 0,
            threshold: self.grid.value(self.bucket[i]),
            levels: self.estimate_input(id)?.map(|input| input.levels),
            budget_class: self.budget_class_of(i),
            discounted,
        })
    }

    /// The dataset-level part of an archived dataset's answers.
    pub fn archive_summary(&self) -> ArchiveSummary {
        ArchiveSummary {
            config: self.config.clone(),
            orders: self.orders.clone(),
            steps: self.next_step,
            releases: self.releases,
            worst_rdp: self.worst_case_rdp(),
            pld_events: self.pld_events(),
            release_events: self.pld.release_events(),
            grid: self.grid,
            filter: self
                .filter
                .iter()
                .flat_map(|f| f.classes.iter().map(|c| (c.order, c.budget)))
                .collect(),
        }
    }
}

impl ArchiveSummary {
    /// Examples in the dataset.
    pub fn examples(&self) -> u64 {
        self.config.examples
    }

    /// Steps applied.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Releases charged.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// The PLD events of the worst case (`None`: a release had none).
    pub fn pld_events(&self) -> Option<Vec<PldEvent>> {
        self.pld_events.clone()
    }

    /// Refuse an id the dataset does not have, as the live ledger does.
    pub fn check_id(&self, id: u64) -> Result<(), LedgerError> {
        if id >= self.config.examples {
            return Err(LedgerError::invalid(
                "id",
                format!(
                    "{id} is out of range: the dataset has {} examples",
                    self.config.examples
                ),
            ));
        }
        Ok(())
    }

    /// Example `id`'s privacy, as [`Ledger::privacy`] gave it at the end.
    pub fn privacy(
        &self,
        id: u64,
        example: &ArchivedExample,
        delta: f64,
        conversion: Conversion,
    ) -> Result<ExamplePrivacy, LedgerError> {
        Ledger::check_delta(delta)?;
        self.check_id(id)?;
        let rdp = example
            .rdp
            .clone()
            .unwrap_or_else(|| self.worst_rdp.clone());
        if rdp.len() != self.orders.len() {
            return Err(LedgerError::invalid(
                "rdp",
                "an archived example's RDP does not fit the dataset's orders",
            ));
        }
        Ok(example_privacy(
            id,
            ExampleLedgers {
                rdp,
                discounted: example.discounted.clone(),
            },
            &self.worst_rdp,
            delta,
            conversion,
            ServedContext {
                orders: &self.orders,
                predictable: self.config.is_predictable(),
                filter: self.filter.get(example.budget_class as usize).copied(),
                ex_post: self.config.ex_post.as_ref(),
            },
            ExampleFacts {
                steps: self.steps,
                retired: example.retired,
                over_budget: example.over_budget,
                threshold: example.threshold,
            },
        ))
    }

    /// The worst case, as [`Ledger::worst_case`] gave it at the end.
    pub fn worst_case(&self, delta: f64, conversion: Conversion) -> Result<WorstCase, LedgerError> {
        Ledger::check_delta(delta)?;
        Ok(worst_case_of(
            self.worst_rdp.clone(),
            &self.orders,
            delta,
            conversion,
            self.steps,
        ))
    }

    /// Example's PLD-estimate input, as [`Ledger::estimate_input`] gave it.
    pub fn estimate_input(&self, example: &ArchivedExample) -> Result<EstimateInput, String> {
        let levels = example.levels.clone()?;
        Ok(EstimateInput {
            levels,
            release_events: self.release_events.clone().unwrap_or_default(),
            releases: self.releases,
            dataset_steps: self.steps,
            grid: self.grid,
        })
    }
}

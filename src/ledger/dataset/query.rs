//! Queries (spec §3, §4, §5): one example's privacy, the worst case, thresholds,
//! retirements, every example's epsilon (for releases) and the ledger's status.
//! All read-only: `O(#orders)` per example, `O(n × #orders)` for all of them.

use super::columns::{OVER_BUDGET, RETIRED};
use super::compact::At;
use super::{Accrual, Ledger};
use crate::accounting::conversion::{Conversion, EpsilonAtOrder};
use crate::accounting::pld::PldEvent;
use crate::accounting::validate;
use crate::ledger::convert::Converter;
use crate::ledger::error::LedgerError;
use crate::ledger::estimate::{EstimateInput, LevelSteps};
use crate::ledger::protocol::{
    ExamplePrivacy, FilterStatus, LabelBudgetStatus, LedgerStatus, PendingStatus, WorstCase,
};
use crate::ledger::served::{example_privacy, ExampleFacts, ExampleLedgers, ServedContext};
use std::ops::Range;

impl Ledger {
    /// Write example `i`'s RDP vector (releases included) at the current step.
    pub(super) fn rdp_into(&self, i: usize, out: &mut [f64]) {
        self.eval().own_into(
            i,
            self.bucket[i],
            self.flags[i],
            At::Now(self.next_step),
            out,
        );
        for (o, &r) in out.iter_mut().zip(self.release_of(i)) {
            *o += r;
        }
    }

    pub(super) fn check_delta(delta: f64) -> Result<(), LedgerError> {
        validate::delta("delta", delta)?;
        Ok(())
    }

    pub(super) fn check_id(&self, id: u64) -> Result<usize, LedgerError> {
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
        let discounted = self.discounted(i, &rdp);
        let f = self.flags[i];
        Ok(example_privacy(
            id,
            ExampleLedgers { rdp, discounted },
            &self.worst_case_rdp(),
            delta,
            conversion,
            self.served_context(i),
            ExampleFacts {
                steps: self.next_step,
                retired: f & RETIRED != 0,
                over_budget: f & OVER_BUDGET != 0,
                threshold: self.grid.value(self.bucket[i]),
            },
        ))
    }

    /// What a served answer about example `i` depends on besides its ledger
    /// (`served.rs`).
    pub(crate) fn served_context(&self, i: usize) -> ServedContext<'_> {
        ServedContext {
            orders: &self.orders,
            predictable: self.config.is_predictable(),
            filter: self.filter_budget(i),
            ex_post: self.config.ex_post.as_ref(),
        }
    }

    /// The `(order, RDP budget)` of example `i`'s budget under the
    /// individual filter, if it has one.
    pub(crate) fn filter_budget(&self, i: usize) -> Option<(f64, f64)> {
        self.filter.as_ref().map(|f| {
            let class = f.class(i);
            (class.order, class.budget)
        })
    }

    /// Example `i`'s budget class (0: the dataset's budget; `k > 0`: the
    /// `k`-th label budget of the configuration, in its order).
    pub(crate) fn budget_class_of(&self, i: usize) -> u8 {
        self.filter
            .as_ref()
            .and_then(|f| f.class_of.get(i).copied())
            .unwrap_or(0)
    }

    /// The converter of the values a release reads for every example (spec
    /// §6): the ex-post bound in the predictable mode, the ledger's epsilon
    /// (an estimate) otherwise.
    pub(crate) fn release_converter(&self, delta: f64, conversion: Conversion) -> Converter {
        match (&self.config.ex_post, self.config.is_predictable()) {
            (Some(set), true) => Converter::ex_post(&self.orders, set, delta),
            _ => Converter::new(&self.orders, delta, conversion),
        }
    }

    /// What example `id`'s PLD estimate composes (spec §8): its steps per
    /// (segment, grid level) of its discounted ledger (in the predictable mode
    /// a processed step sits at the level it was charged at, as in the RDP
    /// estimate) and the releases. `O(levels visited)`. The inner
    /// `Err` says why no estimate exists for this dataset (a release without a
    /// PLD description, or too many distinct hyperparameters).
    pub fn estimate_input(&self, id: u64) -> Result<Result<EstimateInput, String>, LedgerError> {
        let i = self.check_id(id)?;
        let Some(release_events) = self.pld.release_events() else {
            return Ok(Err(
                "a release without a PLD description was charged to every example".into(),
            ));
        };
        let now = self.next_step;
        let Some(mut counts) = self.levels.example_counts(i, self.bucket[i], now) else {
            let why = self.levels.unavailable().unwrap_or("no level history");
            return Ok(Err(why.to_string()));
        };
        // The discounted ledger `R` (predictable mode), as the RDP estimate.
        self.discounts.shift_counts(i, &mut counts);
        let segments = self.levels.segments();
        let c = self.grid.max_norm();
        let levels = counts
            .iter()
            .map(|n| {
                let s = segments[n.segment as usize];
                let threshold = self.grid.value(n.level);
                LevelSteps {
                    sampling_rate: s.sampling_rate,
                    noise_multiplier: s.noise_multiplier,
                    threshold,
                    effective_noise_multiplier: s.noise_multiplier * c / threshold,
                    steps: n.steps,
                }
            })
            .collect();
        Ok(Ok(EstimateInput {
            levels,
            release_events,
            releases: self.releases,
            dataset_steps: now,
            grid: self.grid,
        }))
    }

    /// Steps and releases as PLD events for the PLD worst case (spec §8), or
    /// `None` when a release was charged without a PLD description.
    pub fn pld_events(&self) -> Option<Vec<PldEvent>> {
        self.pld.events()
    }

    /// Releases charged so far.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// The worst case's RDP (spec §4) at the current step, releases included.
    pub fn worst_case_rdp(&self) -> Vec<f64> {
        let mut rdp = vec![0.0; self.m];
        match &self.accrual {
            Accrual::Poisson(prefix) => prefix.prefix_into(self.next_step, self.top, &mut rdp),
            Accrual::Shuffle(s) => s.worst_rdp_into(&mut rdp),
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
        Ok(worst_case_of(
            self.worst_case_rdp(),
            &self.orders,
            delta,
            conversion,
            self.next_step,
        ))
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
        let conv = self.release_converter(delta, conversion);
        // Bit for bit `rdp_into` and the conversion, example by example (`pass.rs`).
        Ok(self
            .pass(At::Now(self.next_step), &self.release, &self.shares, &conv)
            .collect(0..self.n, |_| None, |e| e))
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
            guarantee: self.config.is_predictable(),
            retired: self.retired,
            over_budget: self.over_budget,
            filter: self.filter.as_ref().map(|f| {
                let class = &f.classes[0];
                FilterStatus {
                    epsilon: class.epsilon,
                    delta: class.delta,
                    order: class.order,
                    rdp_budget: class.budget,
                    label_budgets: f.classes[1..]
                        .iter()
                        .map(|c| LabelBudgetStatus {
                            label: c.label.clone().unwrap_or_default(),
                            epsilon: c.epsilon,
                            delta: c.delta,
                            order: c.order,
                            rdp_budget: c.budget,
                        })
                        .collect(),
                }
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

/// The worst case from its RDP vector (validated `delta`), live or archived.
pub(crate) fn worst_case_of(
    rdp: Vec<f64>,
    orders: &[f64],
    delta: f64,
    conversion: Conversion,
    steps: u64,
) -> WorstCase {
    let eps = Converter::new(orders, delta, conversion).epsilon(&rdp);
    WorstCase {
        epsilon: eps.epsilon,
        order: eps.order,
        rdp,
        steps,
    }
}

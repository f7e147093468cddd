//! The individual filter applied to examples (spec §7, Feldman & Zrnic 2021):
//! the bound on the next step's charge, each example's next check, retiring
//! examples before a step could push them over budget, and counting those a
//! larger-than-announced step pushed over.

use super::columns::{ALL_TOP, OVER_BUDGET, RETIRED};
use super::view::save_for_view;
use super::{Accrual, Ledger, StepParams};
use crate::accounting::error::Result as ArgResult;
use crate::ledger::config::IndividualBudget;
use crate::ledger::error::LedgerError;
use crate::ledger::filter::{choose_order, next_check, BudgetClass, Filter, NEVER};

impl Ledger {
    /// The budget class of `budget` (of `label`'s examples, or the dataset's):
    /// its order `alpha*` chosen for the default hyperparameters, its RDP
    /// budget there and the per-bucket bound on a step's charge.
    pub(super) fn budget_class(
        &self,
        label: Option<String>,
        budget: IndividualBudget,
    ) -> ArgResult<BudgetClass> {
        let per_step = self.current.table.row(self.top);
        let field = match &label {
            Some(l) => format!("label_budgets.{l}.epsilon"),
            None => "individual_budget.epsilon".to_string(),
        };
        let (index, rdp_budget) =
            choose_order(&self.orders, per_step, budget.epsilon, budget.delta)
                .map_err(|e| e.renamed(field))?;
        let bound = (0..=self.top)
            .map(|k| self.current.table.row(k)[index])
            .collect();
        Ok(BudgetClass::new(
            label,
            budget,
            index,
            self.orders[index],
            rdp_budget,
            bound,
        ))
    }

    /// Whether the dataset has budgets per label that still wait for the
    /// labels given at creation ([`Ledger::assign_budget_labels`]).
    pub fn awaits_budget_labels(&self) -> bool {
        self.filter
            .as_ref()
            .is_some_and(|f| f.classes.len() > 1 && f.class_of.is_empty())
    }

    /// Give examples `0..labels.len()` the budget of their label (spec §7):
    /// the labels given at creation, before any step or refresh, so that every
    /// budget is fixed before the run sees data. An example whose label has no
    /// budget of its own keeps the dataset's.
    pub fn assign_budget_labels(&mut self, labels: &[Option<String>]) -> Result<(), LedgerError> {
        if !self.awaits_budget_labels() {
            return Err(LedgerError::invalid(
                "labels",
                "budgets per label are fixed once, by the labels given when the dataset is created",
            ));
        }
        if self.next_step != 0 {
            return Err(LedgerError::invalid(
                "labels",
                "budgets per label are fixed before the first step",
            ));
        }
        if labels.len() > self.n {
            return Err(LedgerError::invalid(
                "labels",
                format!("{} labels for {} examples", labels.len(), self.n),
            ));
        }
        let Some(mut filter) = self.filter.take() else {
            return Ok(());
        };
        let mut class_of = vec![0u8; self.n];
        for (slot, label) in class_of.iter_mut().zip(labels) {
            if let Some(l) = label {
                if let Some(k) = filter
                    .classes
                    .iter()
                    .position(|c| c.label.as_ref() == Some(l))
                {
                    *slot = k as u8;
                }
            }
        }
        filter.assign(class_of);
        for i in 0..self.n {
            filter.predicted[i] = self.predict(&filter, i, 0);
        }
        filter.rebuild();
        self.filter = Some(filter);
        Ok(())
    }

    /// The latest step's parameters (the defaults before the first step): they
    /// bound what the next step charges, as far as the ledger can know.
    pub(super) fn next_params(&self) -> &StepParams {
        &self.current
    }

    /// What an unreported example accrues per step at charge bound `c`.
    pub(super) fn unsampled_rate(&self, c: f64) -> f64 {
        match self.accrual {
            Accrual::Poisson(_) => c,
            Accrual::Shuffle(_) => 0.0,
        }
    }

    /// RDP of example `i` at order `j` at step `now`, releases included.
    pub(super) fn value_at(&self, i: usize, now: u64, j: usize) -> f64 {
        self.eval().own_at(i, self.bucket[i], self.flags[i], now, j) + self.release_of(i)[j]
    }

    /// When example `i` is next due for a filter check, seen from step `now`.
    pub(super) fn predict(&self, filter: &Filter, i: usize, now: u64) -> u64 {
        if self.flags[i] & RETIRED != 0 {
            return NEVER;
        }
        let class = filter.class(i);
        let value = self.value_at(i, now, class.index);
        let c = class.bound[self.bucket[i] as usize];
        self.at_epoch_boundary(next_check(
            now,
            value,
            c,
            self.unsampled_rate(c),
            class.limit,
        ))
    }

    /// Retire example `i` at step `now`: settle its accrual, threshold 0.
    pub(super) fn retire(&mut self, i: usize, now: u64) {
        if let Accrual::Poisson(prefix) = &self.accrual {
            save_for_view!(self, i, Some(prefix));
            self.levels.close_run(i, self.bucket[i], now);
        } else {
            save_for_view!(self, i, None);
        }
        self.bucket[i] = 0;
        self.flags[i] = (self.flags[i] & !ALL_TOP) | RETIRED;
        if let Some(f) = &mut self.filter {
            f.predicted[i] = NEVER;
        }
        self.retired += 1;
    }

    /// Refresh the filter's bound on the next step's charge at `alpha*`: the larger
    /// of the default hyperparameters' and the latest step's (a schedule may keep the
    /// latest values, or return to the defaults after a cheaper step). Returns true
    /// when it grew for some bucket: then every queued check may be late and all
    /// must be recomputed (`O(n)`, once per such change of hyperparameters).
    pub(super) fn filter_update_bound(&mut self) -> bool {
        let Some(filter) = self.filter.as_mut() else {
            return false;
        };
        let mut increased = false;
        for class in &mut filter.classes {
            let j = class.index;
            for (k, slot) in class.bound.iter_mut().enumerate() {
                let k = k as u32;
                let c = self.default.table.row(k)[j].max(self.current.table.row(k)[j]);
                increased |= c > *slot;
                *slot = c;
            }
        }
        increased
    }

    /// Filter work after a refresh changed the thresholds of `ids`.
    pub(super) fn filter_after_refresh(&mut self, ids: &[u64]) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let now = self.next_step;
        for &id in ids {
            let i = id as usize;
            if self.flags[i] & RETIRED == 0 {
                let at = self.predict(&filter, i, now);
                filter.schedule_by(id as u32, at);
            }
        }
        let retired = self.filter_pop(&mut filter, now);
        self.filter = Some(filter);
        retired
    }

    /// Run the checks that fell due at the current step.
    pub(super) fn filter_pop_due(&mut self) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let retired = self.filter_pop(&mut filter, self.next_step);
        self.filter = Some(filter);
        retired
    }

    /// Recompute every prediction (`O(n)`), counting examples already past their
    /// budget, then retire those due.
    pub(super) fn filter_recompute_all(&mut self) -> Vec<u64> {
        let Some(mut filter) = self.filter.take() else {
            return Vec::new();
        };
        let now = self.next_step;
        for i in 0..self.n {
            if self.flags[i] & RETIRED != 0 {
                continue;
            }
            let class = filter.class(i);
            if self.flags[i] & OVER_BUDGET == 0 && self.value_at(i, now, class.index) > class.budget
            {
                self.flags[i] |= OVER_BUDGET;
                self.over_budget += 1;
            }
            filter.predicted[i] = self.predict(&filter, i, now);
        }
        filter.rebuild();
        let retired = self.filter_pop(&mut filter, now);
        self.filter = Some(filter);
        retired
    }

    /// Check every queued example due at `now`; retire those whose next step could
    /// push them over budget, re-queue the others. Returns the retired ids, sorted.
    pub(super) fn filter_pop(&mut self, filter: &mut Filter, now: u64) -> Vec<u64> {
        let mut retired = Vec::new();
        while let Some((at, ids)) = filter.pop_due(now) {
            for id in ids {
                let i = id as usize;
                if filter.predicted[i] != at || self.flags[i] & RETIRED != 0 {
                    continue; // stale entry
                }
                filter.predicted[i] = NEVER;
                let class = filter.class(i);
                let (limit, value) = (class.limit, self.value_at(i, now, class.index));
                let c = class.bound[self.bucket[i] as usize];
                if value + c > limit {
                    self.retire(i, now);
                    retired.push(id as u64);
                } else {
                    let next = next_check(now, value, c, self.unsampled_rate(c), limit);
                    filter.schedule(
                        id,
                        if next == NEVER {
                            NEVER
                        } else {
                            next.max(now + 1)
                        },
                    );
                }
            }
        }
        retired.sort_unstable();
        retired
    }
}

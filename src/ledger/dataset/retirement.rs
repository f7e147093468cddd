//! The individual filter applied to examples (spec §7, Feldman & Zrnic 2021):
//! the bound on the next step's charge, each example's next check, retiring
//! examples before a step could push them over budget, and counting those a
//! larger-than-announced step pushed over.

use super::columns::{ALL_TOP, OVER_BUDGET, RETIRED};
use super::view::save_for_view;
use super::{Accrual, Ledger, StepParams};
use crate::ledger::filter::{next_check, Filter, NEVER};

impl Ledger {
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
        let value = self.value_at(i, now, filter.index);
        let c = filter.bound[self.bucket[i] as usize];
        next_check(now, value, c, self.unsampled_rate(c), filter.limit)
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
        let j = filter.index;
        let mut increased = false;
        for (k, slot) in filter.bound.iter_mut().enumerate() {
            let k = k as u32;
            let c = self.default.table.row(k)[j].max(self.current.table.row(k)[j]);
            increased |= c > *slot;
            *slot = c;
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
            if self.flags[i] & OVER_BUDGET == 0
                && self.value_at(i, now, filter.index) > filter.budget
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
                let value = self.value_at(i, now, filter.index);
                let c = filter.bound[self.bucket[i] as usize];
                if value + c > filter.limit {
                    self.retire(i, now);
                    retired.push(id as u64);
                } else {
                    let next = next_check(now, value, c, self.unsampled_rate(c), filter.limit);
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

//! The individual filter's arithmetic (spec §7, Feldman & Zrnic 2021).
//!
//! The filter enforces `RDP_i(alpha*) <= B` for every example at one order `alpha*`,
//! fixed when the dataset is created. `B` is the RDP budget that the improved
//! conversion turns into exactly `epsilon*` at `delta*`:
//! `B(alpha) = epsilon* - ln(1 - 1/alpha) + (ln delta* + ln alpha)/(alpha - 1)`.
//! Fixing the order in advance is what makes the filter valid (the stopping rule may
//! not depend on a data-dependent choice of order).
//!
//! To stay `O(batch)` per step, each example carries a *predicted check time*: a
//! step no later than the first at which it could be due for retirement if nothing
//! about it changes. Predictions sit in a calendar queue; a step only looks at the
//! examples it reported and at the checks that fell due.

use super::config::IndividualBudget;
use crate::accounting::error::{InvalidArgument, Result};
use std::collections::BTreeMap;

/// Relative safety margin of the filter's decisions: an example is retired once its
/// next step could take it past `B (1 - FILTER_MARGIN)`, so that floating-point
/// rounding in the accumulators (about 1e-15 relative) can never carry it past `B`.
pub const FILTER_MARGIN: f64 = 1e-10;

/// A prediction meaning "never, under the current hyperparameters".
pub(crate) const NEVER: u64 = u64::MAX;

/// Relative slack by which predictions are made early: the exact check runs when an
/// entry falls due, so an early prediction costs one extra check, a late one could
/// let an example exceed its budget.
const PREDICTION_SLACK: f64 = 1e-9;

/// The RDP budget at `alpha` for `(epsilon, delta)` under the improved conversion.
pub(crate) fn rdp_budget(alpha: f64, epsilon: f64, delta: f64) -> f64 {
    epsilon - (-1.0 / alpha).ln_1p() + (delta.ln() + alpha.ln()) / (alpha - 1.0)
}

/// Choose `alpha*`: the order allowing the most worst-case steps, i.e. maximising
/// `B(alpha) / rho(alpha)` with `rho` the per-step worst-case RDP (ties: largest
/// `B`, then the smallest order). Returns `(index, B(alpha*))`.
pub(crate) fn choose_order(
    orders: &[f64],
    per_step: &[f64],
    epsilon: f64,
    delta: f64,
) -> Result<(usize, f64)> {
    let mut best: Option<(usize, f64, f64)> = None; // (index, ratio, budget)
    for (j, (&alpha, &rho)) in orders.iter().zip(per_step).enumerate() {
        let budget = rdp_budget(alpha, epsilon, delta);
        if budget.is_nan() || budget <= 0.0 || !budget.is_finite() {
            continue;
        }
        let ratio = if rho > 0.0 {
            budget / rho
        } else {
            f64::INFINITY
        };
        let better = match best {
            None => true,
            Some((_, r, b)) => ratio > r || (ratio == r && budget > b),
        };
        if better {
            best = Some((j, ratio, budget));
        }
    }
    match best {
        None => Err(InvalidArgument::new(
            "individual_budget.epsilon",
            format!(
                "{epsilon} is too small for delta = {delta}: no order of the ledger gives a positive RDP budget"
            ),
        )),
        Some((_, ratio, _)) if ratio < 1.0 => Err(InvalidArgument::new(
            "individual_budget.epsilon",
            format!("{epsilon} is exceeded by a single worst-case step at the default hyperparameters"),
        )),
        Some((j, _, budget)) => Ok((j, budget)),
    }
}

/// When to check again an example whose value at `alpha*` is `value` now (at step
/// `now`), whose next step may charge at most `charge`, and which accrues `rate` per
/// step while not reported (the same `charge` under Poisson sampling, 0 under
/// shuffling). Returns `now` when it is due at once, [`NEVER`] when it cannot
/// become due without a report or a change of hyperparameters.
pub(crate) fn next_check(now: u64, value: f64, charge: f64, rate: f64, budget: f64) -> u64 {
    if value + charge > budget {
        return now;
    }
    if rate.is_nan() || rate <= 0.0 {
        return NEVER;
    }
    // Due at now + k for the smallest k with value + (k + 1) rate > budget.
    let steps = ((budget - value) / rate - 1.0) * (1.0 - PREDICTION_SLACK) - 1.0;
    if steps.is_nan() || steps >= 4.0e18 {
        return NEVER;
    }
    let k = if steps >= 1.0 {
        steps.floor() as u64
    } else {
        1
    };
    now.saturating_add(k)
}

/// One budget class's fixed parameters: the dataset's budget, or the budget of
/// one label given at creation (spec §7).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct BudgetClass {
    /// The label whose examples have this budget (`None`: the dataset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) label: Option<String>,
    /// The budget's epsilon.
    pub(crate) epsilon: f64,
    /// The budget's delta.
    pub(crate) delta: f64,
    /// Index of `alpha*` among the ledger's orders.
    pub(crate) index: usize,
    /// `alpha*`.
    pub(crate) order: f64,
    /// RDP budget `B` at `alpha*` (reported).
    pub(crate) budget: f64,
    /// `B (1 - FILTER_MARGIN)`: what decisions compare against.
    pub(crate) limit: f64,
    /// Per bucket: the most the next step can charge at `alpha*`.
    pub(crate) bound: Vec<f64>,
}

impl BudgetClass {
    /// The class of `budget` at order `index` of `orders`, whose RDP budget there
    /// is `rdp_budget`, with the per-bucket bounds `bound`.
    pub(crate) fn new(
        label: Option<String>,
        budget: IndividualBudget,
        index: usize,
        order: f64,
        rdp_budget: f64,
        bound: Vec<f64>,
    ) -> Self {
        Self {
            label,
            epsilon: budget.epsilon,
            delta: budget.delta,
            index,
            order,
            budget: rdp_budget,
            limit: rdp_budget * (1.0 - FILTER_MARGIN),
            bound,
        }
    }
}

/// The filter's mutable state.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(from = "FilterImage")]
pub(crate) struct Filter {
    /// Budget classes: the dataset's first, then one per label with a budget
    /// of its own (in the configuration's order).
    pub(crate) classes: Vec<BudgetClass>,
    /// Per example: its class, fixed before the first step (empty: every
    /// example has the dataset's budget).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) class_of: Vec<u8>,
    /// Per example: the step at which it is next checked ([`NEVER`]: not queued).
    pub(crate) predicted: Vec<u64>,
    /// A calendar of checks: step -> ids. An id listed under a step other than its
    /// `predicted` one is a stale entry and skipped. A queued check is replaced
    /// only by an earlier one (a check that comes early is merely repeated), so
    /// stale entries stay rare and each step pays `O(log #dates)` per report.
    queue: BTreeMap<u64, Vec<u32>>,
    /// Number of ids in `queue`, stale ones included.
    queued: usize,
}

/// A filter as stored: today's form, or the one-budget form of images written
/// before budgets per label existed (the class's fields at the top level).
#[derive(serde::Deserialize)]
struct FilterImage {
    #[serde(default)]
    classes: Vec<BudgetClass>,
    #[serde(default)]
    class_of: Vec<u8>,
    #[serde(default)]
    epsilon: f64,
    #[serde(default)]
    delta: f64,
    #[serde(default)]
    index: usize,
    #[serde(default)]
    order: f64,
    #[serde(default)]
    budget: f64,
    #[serde(default)]
    limit: f64,
    #[serde(default)]
    bound: Vec<f64>,
    predicted: Vec<u64>,
    queue: BTreeMap<u64, Vec<u32>>,
    queued: usize,
}

impl From<FilterImage> for Filter {
    fn from(image: FilterImage) -> Self {
        let classes = if image.classes.is_empty() {
            vec![BudgetClass {
                label: None,
                epsilon: image.epsilon,
                delta: image.delta,
                index: image.index,
                order: image.order,
                budget: image.budget,
                limit: image.limit,
                bound: image.bound,
            }]
        } else {
            image.classes
        };
        Self {
            classes,
            class_of: image.class_of,
            predicted: image.predicted,
            queue: image.queue,
            queued: image.queued,
        }
    }
}

impl Filter {
    /// A filter for `n = predicted.len()` examples, all in the first class
    /// until [`Filter::assign`] says otherwise, each first checked at its
    /// `predicted` step.
    pub(crate) fn new(classes: Vec<BudgetClass>, predicted: Vec<u64>) -> Self {
        let mut filter = Self {
            classes,
            class_of: Vec::new(),
            predicted,
            queue: BTreeMap::new(),
            queued: 0,
        };
        filter.rebuild();
        filter
    }

    /// Example `i`'s budget class.
    #[inline(always)]
    pub(crate) fn class(&self, i: usize) -> &BudgetClass {
        let k = self.class_of.get(i).copied().unwrap_or(0);
        &self.classes[k as usize]
    }

    /// Give the examples their classes (`class_of[i]` indexes `classes`).
    pub(crate) fn assign(&mut self, class_of: Vec<u8>) {
        self.class_of = class_of;
    }

    /// Whether the image agrees with a ledger of `n` examples and `m` orders
    /// whose grid has `buckets` buckets.
    pub(crate) fn fits(&self, n: usize, m: usize, buckets: usize) -> bool {
        !self.classes.is_empty()
            && self.classes.len() <= 256
            && self
                .classes
                .iter()
                .all(|c| c.index < m && c.bound.len() == buckets)
            && self.predicted.len() == n
            && (self.class_of.is_empty()
                || (self.class_of.len() == n
                    && self
                        .class_of
                        .iter()
                        .all(|&k| (k as usize) < self.classes.len())))
    }

    /// Queue `id` for a check at `at`, replacing its current check.
    pub(crate) fn schedule(&mut self, id: u32, at: u64) {
        self.predicted[id as usize] = at;
        if at != NEVER {
            self.queue.entry(at).or_default().push(id);
            self.queued += 1;
        }
    }

    /// Queue `id` for a check at `at` unless an earlier check is already queued.
    pub(crate) fn schedule_by(&mut self, id: u32, at: u64) {
        if at < self.predicted[id as usize] {
            self.schedule(id, at);
            if self.queued > 2 * self.predicted.len() + 1024 {
                self.rebuild();
            }
        }
    }

    /// The ids of the earliest date `<= now`, with that date (stale ones included).
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, Vec<u32>)> {
        let (&at, _) = self.queue.first_key_value()?;
        if at > now {
            return None;
        }
        let (at, ids) = self.queue.pop_first()?;
        self.queued -= ids.len();
        Some((at, ids))
    }

    /// Rebuild the calendar from `predicted` (drops stale entries).
    pub(crate) fn rebuild(&mut self) {
        self.queue.clear();
        self.queued = 0;
        for (i, &at) in self.predicted.iter().enumerate() {
            if at != NEVER {
                self.queue.entry(at).or_default().push(i as u32);
                self.queued += 1;
            }
        }
    }

    /// Heap bytes of the filter.
    pub(crate) fn bytes(&self) -> usize {
        let lists: usize = self
            .queue
            .values()
            .map(|v| v.capacity() * 4 + std::mem::size_of::<(u64, Vec<u32>)>())
            .sum();
        let classes: usize = self.classes.iter().map(|c| c.bound.capacity() * 8).sum();
        self.predicted.capacity() * 8 + self.class_of.capacity() + classes + lists
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_inverts_the_improved_conversion() {
        use crate::accounting::conversion::{epsilon_at, Conversion};
        for &alpha in &[1.5, 2.0, 8.0, 64.0] {
            let b = rdp_budget(alpha, 2.0, 1e-5);
            let eps = epsilon_at(alpha, b, 1e-5, Conversion::Improved);
            assert!((eps - 2.0).abs() < 1e-12, "{alpha}: {eps}");
        }
    }

    #[test]
    fn predictions_are_never_late() {
        for &(value, rate, budget) in &[
            (0.0, 0.1, 1.0),
            (0.3, 0.07, 1.0),
            (0.0, 1e-9, 1.0),
            (0.99, 0.001, 1.0),
        ] {
            let at = next_check(10, value, rate, rate, budget);
            // The first step t at which value + (t - 10) rate + rate > budget.
            let mut t = 10u64;
            while value + (t - 10) as f64 * rate + rate <= budget {
                t += 1;
            }
            assert!(
                at <= t && at >= 10,
                "{value} {rate}: predicted {at}, due {t}"
            );
            // Early by a few steps at most (the relative slack adds 1 per 1e9 steps).
            assert!(
                t - at <= 3 + t / 500_000_000,
                "{value} {rate}: predicted {at}, due {t}"
            );
        }
        assert_eq!(next_check(5, 0.95, 0.1, 0.1, 1.0), 5);
        assert_eq!(next_check(5, 0.5, 0.1, 0.0, 1.0), NEVER);
    }

    #[test]
    fn order_choice_maximises_worst_case_steps() {
        let orders = [2.0, 8.0, 32.0];
        let per_step = [1e-4, 4e-4, 1e-2];
        let (j, b) = choose_order(&orders, &per_step, 1.0, 1e-5).unwrap();
        let ratio = |j: usize| rdp_budget(orders[j], 1.0, 1e-5) / per_step[j];
        assert!((0..3).all(|k| ratio(k) <= ratio(j)));
        assert_eq!(b, rdp_budget(orders[j], 1.0, 1e-5));
        assert!(choose_order(&orders, &per_step, 1e-6, 1e-5).is_err());
        assert!(choose_order(&orders, &[10.0, 10.0, 10.0], 1.0, 1e-5).is_err());
    }
}

//! Examples left out of a release (spec §6). Under the individual filter, an
//! example whose threshold ledger plus a release's cost would pass its budget
//! (or, while it still trains, leave no room for its next step) has its term
//! set to 0 in the release's input, so the release costs it nothing: the
//! filter's guarantee stays true and the release never retires anyone. The
//! rule reads only the threshold ledger `R^thr`, a function of the released
//! outputs and of the example's own data, as the filter's own decisions do.
//!
//! # Representation
//! Every other example bears the dataset-wide release offset. An example left
//! out of at least one release carries the `LEFT_OUT` flag and belongs to a
//! *share class*: the sum of the release charges its members bore. Members of
//! one class were left out of the same releases, so a few classes serve any
//! number of examples (usually one class per release an example first missed);
//! a charge moves whole classes, `O(left out + flagged)`, and classes no
//! example uses any more are dropped. A member's sum is accumulated release by
//! release, never obtained by subtraction, so no rounding can take it below
//! the charges it bore.

use super::columns::{LEFT_OUT, RETIRED};
use super::Ledger;
use crate::ledger::error::LedgerError;
use crate::ledger::filter::Filter;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Relative margin of the rule: an example within this fraction of its
/// budget's limit counts as past it (rounding in the sums is about 1e-15).
const RULE_MARGIN: f64 = 1e-9;

/// The release charges of the examples left out of at least one release.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ReleaseShares {
    /// Each class's release RDP by order.
    classes: Vec<Vec<f64>>,
    /// Each flagged example's class.
    member: BTreeMap<u32, u32>,
}

impl ReleaseShares {
    /// The release charges example `i` bore, when its `flags` say it was
    /// ever left out (the flag spares every other example the lookup): the
    /// one rule the ledger, a step's filter check and the pass read.
    #[inline(always)]
    pub(super) fn own(&self, flags: &[u8], i: usize) -> Option<&[f64]> {
        if flags[i] & LEFT_OUT != 0 {
            self.of(i)
        } else {
            None
        }
    }

    /// The release charges example `i` bore, when it was ever left out.
    pub(super) fn of(&self, i: usize) -> Option<&[f64]> {
        let class = *self.member.get(&(i as u32))?;
        self.classes.get(class as usize).map(Vec::as_slice)
    }

    /// Heap bytes held (an estimate: map nodes at about 24 bytes a member).
    pub(super) fn bytes(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.capacity() * 8 + 24)
            .sum::<usize>()
            + self.member.len() * 24
    }

    /// Whether the image agrees with the ledger: `n` examples, `m` orders,
    /// every member in range and of an existing class.
    pub(super) fn fits(&self, n: usize, m: usize) -> bool {
        self.classes.iter().all(|c| c.len() == m)
            && self
                .member
                .iter()
                .all(|(&i, &c)| (i as usize) < n && (c as usize) < self.classes.len())
    }

    /// The members, for checking the `LEFT_OUT` flags against them.
    pub(super) fn members(&self) -> impl Iterator<Item = usize> + '_ {
        self.member.keys().map(|&i| i as usize)
    }
}

impl Ledger {
    /// The release charges example `i` bore (the dataset-wide offset unless it
    /// was left out of one).
    #[inline]
    pub(super) fn release_of(&self, i: usize) -> &[f64] {
        self.shares.own(&self.flags, i).unwrap_or(&self.release)
    }

    /// Whether charging a release of `rdp` to example `i` keeps it within its
    /// budget (at its class's order), with room for its next step while it
    /// trains.
    fn release_fits(&self, filter: &Filter, i: usize, rdp: &[f64]) -> bool {
        let class = filter.class(i);
        let extra = rdp.get(class.index).copied().unwrap_or(f64::INFINITY);
        let now = self.next_step;
        let next = if self.flags[i] & RETIRED != 0 {
            0.0
        } else {
            class.bound[self.bucket[i] as usize]
        };
        self.value_at(i, now, class.index) + extra + next <= class.limit * (1.0 - RULE_MARGIN)
    }

    /// The examples a release of `rdp` leaves out of its input (sorted): those
    /// under the individual filter that it would push past their budget or
    /// that it would leave no room for their next step. Empty without a filter.
    /// `O(n)`, read-only.
    pub fn release_left_out(&self, rdp: &[f64]) -> Vec<u32> {
        let Some(filter) = &self.filter else {
            return Vec::new();
        };
        (0..self.n)
            .filter(|&i| !self.release_fits(filter, i, rdp))
            .map(|i| i as u32)
            .collect()
    }

    /// How many examples outside `left_out` (sorted) a release of `rdp`
    /// would retire or push past their budget if charged now: a release
    /// computed at an earlier step is refused when steps since made any (the
    /// trainer learns of retirements only from step answers). `O(n)`.
    pub fn release_would_retire(&self, rdp: &[f64], left_out: &[u32]) -> u64 {
        let Some(filter) = &self.filter else {
            return 0;
        };
        (0..self.n)
            .filter(|&i| {
                left_out.binary_search(&(i as u32)).is_err() && !self.release_fits(filter, i, rdp)
            })
            .count() as u64
    }

    /// Book a release of `rdp` that left out `left_out` (sorted, distinct, in
    /// range): every other example bears it. `O(left out + flagged)`.
    pub(super) fn share_release(
        &mut self,
        rdp: &[f64],
        left_out: &[u32],
    ) -> Result<(), LedgerError> {
        if left_out.windows(2).any(|w| w[0] >= w[1])
            || left_out.last().is_some_and(|&i| i as usize >= self.n)
        {
            return Err(LedgerError::invalid(
                "left_out",
                format!(
                    "must be distinct example ids in increasing order, each below {}",
                    self.n
                ),
            ));
        }
        let shares = Arc::make_mut(&mut self.shares);
        // A first-time member joins the class of the charges borne so far.
        let mut fresh_class = None;
        for &id in left_out {
            let i = id as usize;
            if shares.member.contains_key(&id) {
                continue;
            }
            let class = *fresh_class.get_or_insert_with(|| {
                shares.classes.push(self.release.clone());
                (shares.classes.len() - 1) as u32
            });
            shares.member.insert(id, class);
            self.flags[i] |= LEFT_OUT;
        }
        // Members charged by this release move to the class one release on;
        // members left out stay. Classes are renumbered densely.
        let mut moved: HashMap<(u32, bool), u32> = HashMap::new();
        let mut classes: Vec<Vec<f64>> = Vec::new();
        let old = std::mem::take(&mut shares.classes);
        for (&id, class) in shares.member.iter_mut() {
            let charged = left_out.binary_search(&id).is_err();
            *class = *moved.entry((*class, charged)).or_insert_with(|| {
                let mut sum = old[*class as usize].clone();
                if charged {
                    for (s, &r) in sum.iter_mut().zip(rdp) {
                        *s += r;
                    }
                }
                classes.push(sum);
                (classes.len() - 1) as u32
            });
        }
        shares.classes = classes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_what_each_member_bore() {
        let mut s = ReleaseShares::default();
        s.classes.push(vec![1.0, 2.0]);
        s.member.insert(3, 0);
        assert_eq!(s.of(3), Some(&[1.0, 2.0][..]));
        assert_eq!(s.of(4), None);
        assert!(s.fits(4, 2));
        assert!(!s.fits(3, 2));
        assert!(!s.fits(4, 3));
    }
}

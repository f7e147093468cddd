//! A local copy of every example's clipping threshold, kept current from the
//! answers of step reports and refreshes, so the trainer can clip each example at
//! its threshold without asking the server per step.
//!
//! The protocol (spec §3) makes per-example epsilons a guarantee only if each
//! example is clipped at the threshold the ledger holds for it, never at more. The
//! mirror therefore checks every answer before applying it: it must answer the
//! step the mirror expects, name ids that exist, and carry thresholds in
//! `[0, max_grad_norm]`; otherwise it refuses with [`Error::Mirror`] and changes
//! nothing.

use crate::error::{Error, Result};
use crate::types::{RefreshOutcome, StepOutcome};

/// Thresholds of examples `0..n` for the next step.
#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdMirror {
    max_grad_norm: f64,
    thresholds: Vec<f64>,
    retired: Vec<bool>,
    retired_count: usize,
    next_step: u64,
}

impl ThresholdMirror {
    /// The state of a fresh ledger: every example at `C`, step 0 next.
    pub fn new(examples: usize, max_grad_norm: f64) -> Self {
        Self {
            max_grad_norm,
            thresholds: vec![max_grad_norm; examples],
            retired: vec![false; examples],
            retired_count: 0,
            next_step: 0,
        }
    }

    /// Mark `ids` retired (as listed by `GET .../thresholds` when resuming), so the
    /// trainer stops sampling them. Ids out of range are refused.
    pub fn mark_retired(&mut self, ids: &[u64]) -> Result<()> {
        self.check_ids(&[], &[], ids)?;
        self.apply(&[], &[], ids);
        Ok(())
    }

    /// A mirror of thresholds read from the server (`GET .../thresholds`), e.g. to
    /// resume a run. Retirements are marked separately ([`Self::mark_retired`]):
    /// a zero threshold alone may also mean a last norm of 0.
    pub fn from_thresholds(
        max_grad_norm: f64,
        thresholds: Vec<f64>,
        next_step: u64,
    ) -> Result<Self> {
        let n = thresholds.len();
        let mut mirror = Self::new(n, max_grad_norm);
        for (i, &t) in thresholds.iter().enumerate() {
            mirror.check_threshold(i as u64, t)?;
        }
        mirror.thresholds = thresholds;
        mirror.next_step = next_step;
        Ok(mirror)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.thresholds.len()
    }

    /// True for a dataset without examples.
    pub fn is_empty(&self) -> bool {
        self.thresholds.is_empty()
    }

    /// The maximum clipping norm `C`.
    pub fn max_grad_norm(&self) -> f64 {
        self.max_grad_norm
    }

    /// The step these thresholds apply to.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// The threshold example `id` must be clipped at in the next step (0 once
    /// retired). Panics if `id` is out of range.
    pub fn threshold(&self, id: u64) -> f64 {
        self.thresholds[id as usize]
    }

    /// Every threshold, by id.
    pub fn thresholds(&self) -> &[f64] {
        &self.thresholds
    }

    /// Whether an answer retired `id` (the trainer may stop sampling it).
    pub fn is_retired(&self, id: u64) -> bool {
        self.retired[id as usize]
    }

    /// Number of examples known to be retired.
    pub fn retired_count(&self) -> usize {
        self.retired_count
    }

    fn check_threshold(&self, id: u64, t: f64) -> Result<()> {
        if !(t >= 0.0 && t <= self.max_grad_norm) {
            return Err(Error::Mirror(format!(
                "threshold {t} for example {id} is outside [0, max_grad_norm = {}]",
                self.max_grad_norm
            )));
        }
        Ok(())
    }

    fn check_ids(&self, ids: &[u64], thresholds: &[f64], retired: &[u64]) -> Result<()> {
        if ids.len() != thresholds.len() {
            return Err(Error::Mirror(format!(
                "{} thresholds for {} ids",
                thresholds.len(),
                ids.len()
            )));
        }
        let n = self.len() as u64;
        for &id in ids.iter().chain(retired) {
            if id >= n {
                return Err(Error::Mirror(format!(
                    "example {id} is out of range (n = {n})"
                )));
            }
        }
        for (&id, &t) in ids.iter().zip(thresholds) {
            self.check_threshold(id, t)?;
        }
        Ok(())
    }

    fn apply(&mut self, ids: &[u64], thresholds: &[f64], retired: &[u64]) {
        for (&id, &t) in ids.iter().zip(thresholds) {
            self.thresholds[id as usize] = t;
        }
        // Retirements last: a refresh answer carries thresholds computed before the
        // filter retired some of the same ids.
        for &id in retired {
            let i = id as usize;
            self.thresholds[i] = 0.0;
            if !self.retired[i] {
                self.retired[i] = true;
                self.retired_count += 1;
            }
        }
    }

    /// Apply the answer to a report of `ids` (in report order) for the next step,
    /// fresh or `duplicate` (a retry whose first answer was lost). A complete step
    /// advances the mirror to the following step.
    pub fn apply_step(&mut self, ids: &[u64], outcome: &StepOutcome) -> Result<()> {
        if outcome.step != self.next_step {
            return Err(Error::Mirror(format!(
                "answer for step {} but the mirror is at step {}",
                outcome.step, self.next_step
            )));
        }
        self.check_ids(ids, &outcome.thresholds, &outcome.retired)?;
        self.apply(ids, &outcome.thresholds, &outcome.retired);
        if outcome.complete {
            self.next_step += 1;
        }
        Ok(())
    }

    /// Apply the answer to a refresh of `ids` (in report order).
    pub fn apply_refresh(&mut self, ids: &[u64], outcome: &RefreshOutcome) -> Result<()> {
        if outcome.effective_step != self.next_step {
            return Err(Error::Mirror(format!(
                "refresh effective at step {} but the mirror is at step {}",
                outcome.effective_step, self.next_step
            )));
        }
        self.check_ids(ids, &outcome.thresholds, &outcome.retired)?;
        self.apply(ids, &outcome.thresholds, &outcome.retired);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(step: u64, thresholds: Vec<f64>, retired: Vec<u64>) -> StepOutcome {
        StepOutcome {
            step,
            duplicate: false,
            part: None,
            complete: true,
            thresholds,
            retired,
            refresh_due: None,
        }
    }

    #[test]
    fn applies_thresholds_then_retirements() {
        let mut m = ThresholdMirror::new(5, 1.0);
        m.apply_step(&[3, 1], &outcome(0, vec![0.25, 1.0], vec![4]))
            .unwrap();
        assert_eq!(m.thresholds(), &[1.0, 1.0, 1.0, 0.25, 0.0]);
        assert!(m.is_retired(4) && !m.is_retired(3));
        assert_eq!(m.next_step(), 1);
        let r = RefreshOutcome {
            effective_step: 1,
            thresholds: vec![0.5, 0.75],
            retired: vec![0],
            refresh_due: None,
        };
        m.apply_refresh(&[0, 2], &r).unwrap();
        assert_eq!(m.thresholds(), &[0.0, 1.0, 0.75, 0.25, 0.0]);
        assert_eq!(m.retired_count(), 2);
    }

    #[test]
    fn refuses_inconsistent_answers_without_changing() {
        let mut m = ThresholdMirror::new(3, 1.0);
        let before = m.clone();
        assert!(m.apply_step(&[0], &outcome(1, vec![0.5], vec![])).is_err());
        assert!(m.apply_step(&[0], &outcome(0, vec![1.5], vec![])).is_err());
        assert!(m
            .apply_step(&[0], &outcome(0, vec![f64::NAN], vec![]))
            .is_err());
        assert!(m
            .apply_step(&[0, 1], &outcome(0, vec![0.5], vec![]))
            .is_err());
        assert!(m.apply_step(&[7], &outcome(0, vec![0.5], vec![])).is_err());
        assert!(m.apply_step(&[0], &outcome(0, vec![0.5], vec![9])).is_err());
        assert_eq!(m, before);
    }

    #[test]
    fn incomplete_parts_do_not_advance() {
        let mut m = ThresholdMirror::new(3, 1.0);
        let mut o = outcome(0, vec![0.5], vec![]);
        o.complete = false;
        m.apply_step(&[2], &o).unwrap();
        assert_eq!(m.next_step(), 0);
        assert_eq!(m.threshold(2), 0.5);
    }
}

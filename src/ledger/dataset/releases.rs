//! Release charges (spec §6): a release's RDP is added to every example and to
//! the worst case as one dataset-wide offset, `O(#orders)` (one `O(n)` pass with
//! an individual filter, whose predictions all move).

use super::columns::RETIRED;
use super::Ledger;
use crate::accounting::pld::PldEvent;
use crate::ledger::error::LedgerError;

impl Ledger {
    /// How many examples the individual filter would retire if a release of
    /// `rdp` were charged now (0 without a filter), without changing anything:
    /// `O(n)`. The server refuses releases whose retirements could not reach the
    /// trainer before its next step.
    pub fn release_would_retire(&self, rdp: &[f64]) -> u64 {
        let Some(filter) = &self.filter else {
            return 0;
        };
        let j = filter.index;
        let extra = rdp.get(j).copied().unwrap_or(f64::INFINITY);
        (0..self.n)
            .filter(|&i| {
                self.flags[i] & RETIRED == 0
                    && self.value_at(i, self.next_step, j)
                        + extra
                        + filter.bound[self.bucket[i] as usize]
                        > filter.limit * (1.0 - 1e-9)
            })
            .count() as u64
    }

    /// Whether a release could be charged now (no multi-part step is incomplete),
    /// without changing anything: the server checks before it persists.
    pub fn check_release(&self) -> Result<(), LedgerError> {
        self.refuse_if_pending("a release")
    }

    /// Charge the RDP of a DP release (spec §6) to every example and to the worst
    /// case, in `O(#orders)`: it is kept as one dataset-wide offset added at query
    /// time. With an individual filter this costs one `O(n)` pass (every example's
    /// value moved): examples the release pushes past their budget are counted in
    /// `over_budget`, and examples that could no longer afford a step are retired
    /// (returned). Refused while a multi-part step is incomplete.
    ///
    /// A release charged this way has no PLD description, so the ledger no
    /// longer offers a PLD worst case; the server uses
    /// [`Ledger::charge_release_with_pld`].
    pub fn charge_release(&mut self, rdp: &[f64]) -> Result<Vec<u64>, LedgerError> {
        self.charge_release_with_pld(rdp, None)
    }

    /// [`Ledger::charge_release`], with the release's PLD events (spec §8) for
    /// the PLD worst case (`None`: it has none, and the PLD worst case is
    /// withheld from then on rather than leave the release out).
    pub fn charge_release_with_pld(
        &mut self,
        rdp: &[f64],
        pld: Option<&[PldEvent]>,
    ) -> Result<Vec<u64>, LedgerError> {
        self.refuse_if_pending("a release")?;
        if rdp.len() != self.m {
            return Err(LedgerError::invalid(
                "rdp",
                format!(
                    "has {} values but the ledger keeps {} orders",
                    rdp.len(),
                    self.m
                ),
            ));
        }
        if let Some((j, r)) = rdp
            .iter()
            .enumerate()
            .find(|(_, r)| !(r.is_finite() && **r >= 0.0))
        {
            return Err(LedgerError::invalid(
                "rdp",
                format!("rdp[{j}] = {r}: every value must be a finite number >= 0"),
            ));
        }
        for (o, &r) in self.release.iter_mut().zip(rdp) {
            *o += r;
        }
        self.releases += 1;
        self.pld.record_release(pld);
        Ok(self.filter_recompute_all())
    }
}

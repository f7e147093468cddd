//! Release charges (spec §6): a release's RDP is added to every example and to
//! the worst case as one dataset-wide offset, `O(#orders)` (one `O(n)` pass with
//! an individual filter, whose predictions all move).

use super::Ledger;
use crate::accounting::pld::PldEvent;
use crate::ledger::error::LedgerError;

impl Ledger {
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
        self.charge_release_with_pld(rdp, None, &[])
    }

    /// [`Ledger::charge_release`], with the release's PLD events (spec §8) for
    /// the PLD worst case (`None`: it has none, and the PLD worst case is
    /// withheld from then on rather than leave the release out), leaving out
    /// the examples `left_out` (sorted ids, [`Ledger::release_left_out`] at the
    /// step the release read): they bear nothing of it. The worst case and
    /// the PLD history bear every release.
    pub fn charge_release_with_pld(
        &mut self,
        rdp: &[f64],
        pld: Option<&[PldEvent]>,
        left_out: &[u32],
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
        self.share_release(rdp, left_out)?;
        for (o, &r) in self.release.iter_mut().zip(rdp) {
            *o += r;
        }
        self.releases += 1;
        self.pld.record_release(pld);
        Ok(self.filter_recompute_all())
    }
}

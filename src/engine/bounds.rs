//! The PLD worst case of a served dataset (spec §8) and what it bounds: the
//! worst case reported, every example's epsilon, and the releases' bound `B`
//! and statistics (`min(RDP_i, PLD worst)`, never the PLD estimate).
//!
//! The PLD composition costs milliseconds to seconds (FFTs), so it is cached per
//! dataset, keyed by everything it depends on: steps applied, releases charged
//! and delta. It runs where blocking is allowed, off the async runtime's workers.

use super::dataset::Dataset;
use super::error::EngineResult;
use crate::accounting::Conversion;
use crate::ledger::bounds::{combine_worst_case, pld_worst_case, PldWorstCase};
use crate::ledger::{ExamplePrivacy, Ledger, WorstCaseBounds};

/// Cached PLD worst cases kept per dataset (a few deltas at the current step).
const CACHE_ENTRIES: usize = 8;

/// Run `f` where blocking is allowed: a long computation (an `O(n)` pass, a
/// PLD composition) must not stall the runtime's other tasks.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl Dataset {
    /// The PLD worst case at `delta` (validated by the caller), from the cache
    /// or computed once (concurrent askers wait for the one computation).
    fn pld_worst_case(&self, ledger: &Ledger, delta: f64) -> Result<PldWorstCase, String> {
        let at = (ledger.next_step(), ledger.releases());
        self.pld_worst_case_of(at, || ledger.pld_events(), delta)
    }

    /// The PLD worst case after `at = (steps, releases)` at `delta`, if cached.
    pub(super) fn pld_cached(
        &self,
        at: (u64, u64),
        delta: f64,
    ) -> Option<Result<PldWorstCase, String>> {
        let key = (at.0, at.1, delta.to_bits());
        let cache = self.pld_cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    }

    /// The PLD worst case after `at = (steps, releases)` whose events `events`
    /// gives (called only on a cache miss), from the cache or computed once.
    pub(super) fn pld_worst_case_of(
        &self,
        at: (u64, u64),
        events: impl FnOnce() -> Option<Vec<crate::accounting::pld::PldEvent>>,
        delta: f64,
    ) -> Result<PldWorstCase, String> {
        let key = (at.0, at.1, delta.to_bits());
        let mut cache = self.pld_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = cache.entries.iter().find(|(k, _)| *k == key) {
            return v.clone();
        }
        let value = match events() {
            Some(events) => blocking(|| pld_worst_case(&events, delta)),
            None => Err("a release without a PLD description was charged".to_string()),
        };
        // Entries of earlier states are of no more use (a release's view may
        // ask about a state older than the newest entries: those stay).
        cache.entries.retain(|(k, _)| k.0 >= key.0 && k.1 >= key.1);
        if cache.entries.len() >= CACHE_ENTRIES {
            cache.entries.pop_front();
        }
        cache.entries.push_back((key, value.clone()));
        value
    }

    /// The worst case by both accountants at `delta`, the tighter as `epsilon`.
    pub fn worst_case_bounds(
        &self,
        ledger: &Ledger,
        delta: f64,
        conversion: Conversion,
    ) -> EngineResult<WorstCaseBounds> {
        let rdp = ledger.worst_case(delta, conversion)?;
        Ok(combine_worst_case(rdp, self.pld_worst_case(ledger, delta)))
    }

    /// One example's privacy (`min(RDP_i, PLD worst)`) with the worst case.
    pub fn example_privacy(
        &self,
        ledger: &Ledger,
        id: u64,
        delta: f64,
        conversion: Conversion,
    ) -> EngineResult<(ExamplePrivacy, WorstCaseBounds)> {
        let example = ledger.privacy(id, delta, conversion)?;
        let worst = self.worst_case_bounds(ledger, delta, conversion)?;
        let pld = worst.pld.map(|p| p.epsilon);
        Ok((example.bounded_by(pld), worst))
    }

    /// Every example's released value, by id (spec §6): the ex-post bound in
    /// the predictable mode, the ledger's epsilon otherwise, capped by the
    /// public PLD worst case.
    pub fn bounded_epsilons(
        &self,
        ledger: &Ledger,
        worst: &WorstCaseBounds,
        delta: f64,
        conversion: Conversion,
    ) -> EngineResult<Vec<f64>> {
        let pld = worst.pld.map(|p| p.epsilon);
        Ok(blocking(|| ledger.all_epsilons(delta, conversion))?
            .into_iter()
            .map(|e| crate::ledger::bounds::capped_value(e, pld))
            .collect())
    }
}

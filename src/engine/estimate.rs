//! The per-example PLD estimate (spec §8), composed from a
//! process-wide bounded cache of level spectra and answers.
//!
//! The composition itself ([`crate::accounting::pld::estimate`]) picks its grid
//! per query from a relative-accuracy target and plans its FFT domain from the
//! example's own levels; the spectra of each `(q, sigma_eff)` level are built
//! on demand per grid and domain size and kept in [`estimate_cache`] (bounded
//! by `serve --estimate-cache-bytes`, least recently used first out; shown in
//! `GET /v1/admin/storage` and the `dpledger_estimate_cache_*` gauges), so a
//! grid of any size costs only the levels its examples visit. Answers are kept
//! there too, keyed by the example's whole level history, the releases and
//! delta: a dashboard that polls does not recompute, and a history that changed
//! never meets an old answer.
//!
//! **The RDP cap.** The exact composition of the example's levels is never
//! above its RDP epsilon (RDP's conversion is an upper bound on the same
//! composition), but a discretised estimate can be, by its grid error. So the
//! served estimate is `min(composed, example's RDP epsilon)`: never above the
//! RDP epsilon, and never below the exact composition (both are upper bounds of
//! it).
//!
//! The composition runs outside the ledger's lock, on the counts read under it,
//! on tokio's blocking pool (milliseconds of FFTs must not stall the workers),
//! at most one per core at a time, first come first
//! served; answers already cached are served at once, without a slot.
//! Why a gate: compositions are pure CPU, and 16 of them sharing two cores
//! each take 8 times their own time, so the longest (a history whose levels
//! the cache has not seen: tens of milliseconds) set the p99. Queued instead,
//! each waits for the ones before it and then runs at full speed: the same
//! throughput, with a tail of about the queue plus its own time.

use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::accounting::pld::{cached_estimate, estimate_epsilon, EstimateCache, PldEvent};
use crate::ledger::{EstimateInput, PldEstimate};
use std::sync::OnceLock;
use tokio::sync::Semaphore;

/// The process-wide cache of the estimates' level spectra and answers.
pub fn estimate_cache() -> &'static EstimateCache {
    static CACHE: OnceLock<EstimateCache> = OnceLock::new();
    CACHE.get_or_init(EstimateCache::default)
}

/// How many compositions run at once: the cores this process may use.
fn composition_slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The gate compositions queue at (fair: first come, first served).
fn gate() -> &'static Semaphore {
    static GATE: OnceLock<Semaphore> = OnceLock::new();
    GATE.get_or_init(|| Semaphore::new(composition_slots()))
}

fn estimate_error(why: impl std::fmt::Display) -> EngineError {
    EngineError::Conflict {
        detail: format!("no PLD estimate for this example: {why}"),
        field: Some("method"),
    }
}

/// The events an example's estimate composes: its levels, then the releases.
fn events(input: &EstimateInput) -> Vec<PldEvent> {
    input
        .levels
        .iter()
        .map(|l| PldEvent::PoissonGaussian {
            q: l.sampling_rate,
            sigma: l.effective_noise_multiplier,
            count: l.steps,
        })
        .chain(input.release_events.iter().copied())
        .collect()
}

impl Engine {
    /// Example's PLD estimate at `delta` (validated by the caller) from `input`
    /// (read under the ledger's lock by [`crate::ledger::Ledger::estimate_input`]),
    /// capped by the example's RDP epsilon `rdp_epsilon` (module docs).
    /// Not a guarantee: see [`crate::ledger::estimate`].
    pub async fn pld_estimate(
        &self,
        dataset: &str,
        input: EstimateInput,
        delta: f64,
        rdp_epsilon: f64,
    ) -> EngineResult<PldEstimate> {
        self.dataset(dataset)?;
        let steps: u64 = input.levels.iter().map(|l| l.steps).sum();
        let ev = events(&input);
        let (answer, input) =
            match cached_estimate(estimate_cache(), &ev, delta).map_err(estimate_error)? {
                Some(answer) => (answer, input),
                None => {
                    let permit = gate()
                        .acquire()
                        .await
                        .map_err(|e| EngineError::Internal(format!("estimate gate: {e}")))?;
                    let compute = move || {
                        // The slot is held until the composition ends, even if
                        // the request that asked for it goes away meanwhile.
                        let _permit = permit;
                        let answer = estimate_epsilon(estimate_cache(), &ev, delta)
                            .map_err(estimate_error)?;
                        Ok::<_, EngineError>((answer, input))
                    };
                    tokio::task::spawn_blocking(compute).await.map_err(|e| {
                        EngineError::Internal(format!("the PLD estimate failed: {e}"))
                    })??
                }
            };
        Ok(PldEstimate {
            epsilon: answer.epsilon.min(rdp_epsilon),
            guarantee: false,
            value_discretization: answer.value_discretization,
            steps,
            releases: input.releases,
            levels: input.levels,
        })
    }
}

//! The per-example PLD estimate (spec §8, issue 14 item 4), composed from
//! spectra cached per dataset.
//!
//! Building a level's spectrum (its discrete PLD and two FFTs) costs far more
//! than composing: a query is a weighted sum of cached log-spectra per level,
//! raised to the example's counts, and one inverse FFT per direction (Koskela
//! et al.'s individual accounting does the same). The cache ([`EstimateCache`])
//! holds every level queried so far on one FFT domain sized for a step
//! *horizon* (a power of two `>=` the steps applied, so it is rebuilt only when
//! the steps double), and the dataset's releases (composed into every answer).
//! Small grids (`K <=` [`PREBUILD_LEVELS`]) are cached whole per segment at the
//! first query, so that later queries do not rebuild for a level not seen yet.
//!
//! The composition runs outside the ledger's lock, on the counts read under it,
//! on tokio's blocking pool (milliseconds of FFTs must not stall the workers).

use super::error::{EngineError, EngineResult};
use super::Engine;
use crate::accounting::pld::{
    compose_events, LevelCache, PldOptions, DEFAULT_VALUE_DISCRETIZATION,
};
use crate::ledger::{EstimateInput, PldEstimate};
use std::collections::HashMap;
use std::sync::Arc;

/// Smallest step horizon a cache is built for.
const MIN_HORIZON: u64 = 1024;
/// Grids with at most this many levels are cached whole per segment.
pub const PREBUILD_LEVELS: u32 = 256;
/// Wrap-around budget of a composition without cache (releases only).
const TAIL: f64 = 1e-16;

/// Cached level spectra of one dataset (see the module docs).
#[derive(Debug)]
pub struct EstimateCache {
    /// Most steps any example can have composed with this cache.
    horizon: u64,
    /// The number of releases composed into every answer.
    releases: u64,
    /// `(q, sigma_eff)` bits -> index of the level in `cache`.
    index: HashMap<(u64, u64), usize>,
    /// The cached levels, by index.
    levels: Vec<(f64, f64)>,
    cache: LevelCache,
}

fn key((q, s): (f64, f64)) -> (u64, u64) {
    (q.to_bits(), s.to_bits())
}

fn estimate_error(why: impl std::fmt::Display) -> EngineError {
    EngineError::Conflict {
        detail: format!("no PLD estimate for this example: {why}"),
        field: Some("method"),
    }
}

impl EstimateCache {
    fn serves(&self, input: &EstimateInput) -> bool {
        self.horizon >= input.dataset_steps
            && self.releases == input.releases
            && input
                .levels
                .iter()
                .all(|l| self.index.contains_key(&key(l.level())))
    }

    /// A cache for `input`, keeping the levels of `old` (queries will ask again).
    fn build(input: &EstimateInput, old: Option<&EstimateCache>) -> EngineResult<Self> {
        let mut levels: Vec<(f64, f64)> = old.map(|c| c.levels.clone()).unwrap_or_default();
        let mut index: HashMap<(u64, u64), usize> =
            old.map(|c| c.index.clone()).unwrap_or_default();
        let mut add = |l: (f64, f64), levels: &mut Vec<(f64, f64)>| {
            index.entry(key(l)).or_insert_with(|| {
                levels.push(l);
                levels.len() - 1
            });
        };
        let grid = &input.grid;
        for l in &input.levels {
            add(l.level(), &mut levels);
            if grid.top() <= PREBUILD_LEVELS {
                // The same expression as the ledger's, so the keys agree bit for bit.
                for k in 1..=grid.top() {
                    let sigma = l.noise_multiplier * grid.max_norm() / grid.value(k);
                    add((l.sampling_rate, sigma), &mut levels);
                }
            }
        }
        let horizon = input
            .dataset_steps
            .max(MIN_HORIZON)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX);
        let opts = PldOptions::default();
        let cache = LevelCache::with_common(&levels, horizon, &input.release_events, &opts)
            .map_err(estimate_error)?;
        Ok(Self {
            horizon,
            releases: input.releases,
            index,
            levels,
            cache,
        })
    }
}

impl Engine {
    /// Example's PLD estimate at `delta` (validated by the caller) from `input`
    /// (read under the ledger's lock by [`crate::ledger::Ledger::estimate_input`]).
    /// Not a guarantee: see [`crate::ledger::estimate`].
    pub async fn pld_estimate(
        &self,
        dataset: &str,
        input: EstimateInput,
        delta: f64,
    ) -> EngineResult<PldEstimate> {
        let ds = self.dataset(dataset)?;
        let steps: u64 = input.levels.iter().map(|l| l.steps).sum();
        let opts = PldOptions::default();
        let compute = move || -> EngineResult<(f64, EstimateInput)> {
            if input.levels.is_empty() {
                // Nothing but releases (or nothing at all): no cache needed.
                let epsilon = compose_events(&input.release_events, &opts, TAIL)
                    .and_then(|p| p.epsilon(delta))
                    .map_err(estimate_error)?;
                return Ok((epsilon, input));
            }
            let cache = {
                let mut slot = ds.estimate_cache.lock().unwrap_or_else(|e| e.into_inner());
                match slot.as_ref() {
                    Some(c) if c.serves(&input) => c.clone(),
                    old => {
                        let fresh = Arc::new(EstimateCache::build(&input, old.map(|c| &**c))?);
                        *slot = Some(fresh.clone());
                        fresh
                    }
                }
            };
            let counts: Vec<(usize, u64)> = input
                .levels
                .iter()
                .map(|l| (cache.index[&key(l.level())], l.steps))
                .collect();
            let epsilon = cache
                .cache
                .compose(&counts)
                .and_then(|p| p.epsilon(delta))
                .map_err(estimate_error)?;
            Ok((epsilon, input))
        };
        let (epsilon, input) = tokio::task::spawn_blocking(compute)
            .await
            .map_err(|e| EngineError::Internal(format!("the PLD estimate failed: {e}")))??;
        Ok(PldEstimate {
            epsilon,
            guarantee: false,
            value_discretization: DEFAULT_VALUE_DISCRETIZATION,
            steps,
            releases: input.releases,
            levels: input.levels,
        })
    }
}

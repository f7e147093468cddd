//! The per-example PLD estimate (spec §8): what it is made of
//! and how it is served.
//!
//! An example's estimate composes, per hyperparameter segment `(q, sigma)` and
//! grid level `k`, the PLD of the sampled Gaussian at noise multiplier
//! `sigma * C / v_k`, raised to the example's number of steps at that level
//! (`dataset/levels.rs` keeps the counts), and the dataset's releases as the PLD
//! worst case includes them (every example is charged every release).
//!
//! **Not a guarantee.** The thresholds `v_k` are chosen adaptively from the
//! example's own gradients; PLD composition is proven for mechanisms fixed in
//! advance (or for adaptive choices among mechanisms dominated by one pair), not
//! for this. So the estimate is served labelled `"guarantee": false`, beside
//! the example's `epsilon` (a proven bound, spec §8) and never mixed into it,
//! into releases' bound `B` or into their statistics.

use crate::accounting::grid::BucketGrid;
use crate::accounting::pld::PldEvent;
use serde::{Deserialize, Serialize};

/// Steps of one example at one (segment, grid level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LevelSteps {
    /// The segment's sampling rate `q` (1 in shuffle mode: a Gaussian charge).
    pub sampling_rate: f64,
    /// The segment's noise multiplier `sigma` (noise std `sigma * C`).
    pub noise_multiplier: f64,
    /// The grid level's threshold `v_k` the steps were charged at.
    pub threshold: f64,
    /// `sigma * C / v_k`: the noise multiplier of the sampled Gaussian composed.
    pub effective_noise_multiplier: f64,
    /// Number of steps charged at this (segment, level).
    pub steps: u64,
}

/// An example's PLD epsilon over its actual history of thresholds: an
/// estimate, **not** a proven bound (its thresholds were chosen adaptively from
/// its own gradients, and PLD composition is not proven for that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PldEstimate {
    /// The estimate's epsilon at the query's delta.
    pub epsilon: f64,
    /// Always false: PLD composition under adaptively chosen thresholds is not a
    /// proven bound. The example's guarantee is `example.epsilon`.
    pub guarantee: bool,
    /// Grid spacing of the privacy loss (losses rounded up on it).
    pub value_discretization: f64,
    /// Steps composed (the sum over `levels`; steps at threshold 0 cost nothing).
    pub steps: u64,
    /// Releases composed (every example is charged every release).
    pub releases: u64,
    /// The example's steps per (segment, level), by segment then threshold.
    pub levels: Vec<LevelSteps>,
}

/// What the ledger gives for one example's estimate, read under its lock and
/// composed outside it.
#[derive(Debug, Clone)]
pub struct EstimateInput {
    /// The example's steps per (segment, level).
    pub levels: Vec<LevelSteps>,
    /// The dataset's releases as PLD events.
    pub release_events: Vec<PldEvent>,
    /// Number of releases charged.
    pub releases: u64,
    /// Steps applied to the dataset (bounds the example's total).
    pub dataset_steps: u64,
    /// The dataset's grid (a cache may prebuild every level of a segment).
    pub grid: BucketGrid,
}

impl LevelSteps {
    /// The `(q, sigma_eff)` of this level, the key of its cached spectrum.
    pub fn level(&self) -> (f64, f64) {
        (self.sampling_rate, self.effective_noise_multiplier)
    }
}

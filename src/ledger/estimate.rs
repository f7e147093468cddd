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

/// The estimate's views, defined once with the Rust client.
pub use dpledger_api::views::{LevelSteps, PldEstimate};

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

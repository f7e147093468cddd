//! Privacy loss distributions (spec §8): the tightest valid epsilon.
//!
//! Modules, one job each:
//! - [`pmf`]: the discretised PLD and its `delta(eps)` / `eps(delta)` queries;
//! - [`mechanisms`]: connect-the-dots PLDs of the Poisson-subsampled Gaussian
//!   (add and remove), the Gaussian and pure-DP releases;
//! - [`planner`]: Chernoff-bounded FFT windows (wrap-around goes to delta);
//! - [`spectrum`]: FFT composition in polar form (powers and products);
//! - [`accountant`]: the public API;
//! - [`calibrate`]: noise calibration by PLD;
//! - [`estimate`]: per-example estimates on a grid chosen per query, from
//!   [`spectra`], the bounded cache of level spectra and answers;
//! - [`fft`]: FFT plans, made once per size.
//!
//! # Why every number is an upper bound (pessimism)
//! 1. Each mechanism's discrete PLD is a dominating pair of the exact one: its
//!    hockey-stick curve is a chord interpolation of the exact convex curve in
//!    `e^eps` (above it), the line to `(0, 1)` below the grid and the constant
//!    `delta(l_max)` above it, that constant being mass at `+inf`
//!    ([`mechanisms`]). Pure-DP releases use randomized response, the tight
//!    dominating pair of every eps-DP mechanism; an eta-bounded-range
//!    exponential mechanism is eta-DP, so this is valid for the quantile
//!    releases (looser than the bounded-range pair of Dong et al. 2020).
//! 2. Dominating pairs compose (Zhu, Dong, Wang 2022), in each neighbouring
//!    direction separately; the reported epsilon is the max over directions.
//! 3. The composition is computed by circular FFT: the computed mass at every
//!    window point is at least the true one (aliasing only adds), mass from
//!    below the window reappears at higher losses (raises delta), and mass
//!    above it is bounded by a Chernoff bound that is added to the infinity
//!    mass ([`planner`]); infinite mass counts fully to delta.
//! 4. Negative values from floating-point rounding are raised to 0 (adds mass).
//!
//! Hence `delta_computed(eps) >= delta_true(eps)` for every eps, and the
//! epsilon solved from it is never below the truth (up to floating-point
//! rounding of order 1e-15 in delta).

pub mod accountant;
pub mod calibrate;
pub mod estimate;
pub mod fft;
pub mod mechanisms;
pub mod planner;
pub mod pmf;
pub mod spectra;
pub mod spectrum;

pub use accountant::{
    compose_events, worst_case_delta, worst_case_epsilon, ComposedPld, LevelCache, PldError,
    PldEvent, PldOptions, DEFAULT_VALUE_DISCRETIZATION,
};
pub use calibrate::noise_for_epsilon_pld;
pub use estimate::{cached_estimate, estimate_epsilon};
pub use pmf::DiscretePld;
pub use spectra::{EstimateCache, EstimateCacheStats, DEFAULT_ESTIMATE_CACHE_BYTES};

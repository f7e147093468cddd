//! DP quantiles of values in `[0, B]` (ties on a public
//! grid; atoms at `0` and `B` sent whole).
//!
//! Default method: the recursive approximate-quantiles algorithm of Kaplan,
//! Schnapp & Stemmer (ICML 2022) over an exponential mechanism on a public grid,
//! accounted in zCDP. The median level is estimated first, the data split at the
//! estimate, and each side recursively estimates its own levels (rescaled to the
//! side). At each depth the sub-problems see disjoint data, so one example
//! influences one `η`-bounded-range output per depth: with `L` depths
//! (`ceil(log2(m+1))` for `m` levels) the whole release is `L η² / 8`-zCDP
//! (Cesar & Rogers 2021: `η`-BR ⇒ `η²/8`-zCDP), and each depth is `η`-DP for
//! the PLD worst case. The full proof is in `docs/releases-quantiles.md`.
//!
//! One module per job:
//!
//! * [`grid`]: the public per-record map of values to cells (atoms `{0}`,
//!   `{B}` and `G` intervals) and the cells' released values; runs of equal
//!   values share a cell, so a tied run is one output.
//! * [`utility`](mod@utility): the proof-facing part: a level's target `f·n + o` and the
//!   utility `−s(f)·dist(target, ranks of the cell)`, `s(f) = 1/(2 max(f,
//!   1−f))`, whose changes under add/remove span at most 1 (brute-force tests).
//! * [`mechanism`]: the exponential mechanism on the grid's cells.
//! * [`recursion`]: KSS, its depth and cost; an interval cell's values split by
//!   fair coins (a per-record randomisation of data-independent law).
//! * [`atoms`]: a chosen atom sent whole to its side, which releases a noisy
//!   (Laplace, `η`-BR) count that keeps the other side's ranks exact.
//! * [`baselines`]: the seed's gradient method and the per-level alternative
//!   the release is measured against.

pub mod atoms;
pub mod baselines;
pub mod grid;
pub mod mechanism;
pub mod recursion;
pub mod utility;

pub use atoms::{atom_count_scale, AtomMass};
pub use baselines::{gradient_quantiles, gradient_sigma, per_level_quantiles, GRADIENT_STEPS};
pub use grid::{cell_of, cell_value, resolution, Grid, GRID_CELLS};
pub use mechanism::{cell_mechanism, Mechanism};
pub use recursion::{
    kss_depth, kss_eta, kss_quantiles, kss_quantiles_of_cells, kss_quantiles_on, kss_rho,
};
pub use utility::{utility, utility_scale, Target};

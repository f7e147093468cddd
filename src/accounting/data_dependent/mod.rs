//! Data-dependent per-instance RDP of seed 001 (Thudi et al., "Gradients Look
//! Alike"): a whole run is bounded through the *expected* per-step leakage over
//! the randomness of training, estimated from several independent runs with the
//! same configuration (derivation in `docs/data-dependent.md`).
//!
//! For `T` steps, Hölder exponent `p > 1` and order `alpha`, step `t` is charged at
//! order `alpha_j = alpha (p/(p-1))^j` with `j = T-1-t` (steps counted back from the
//! last one) and weight `(p-1)^j / p^(j+1)`:
//!
//! ```text
//! rdp(alpha) = 1/(alpha-1) sum_t (p-1)^j/p^(j+1) log mean_runs exp(p (alpha_j - 1) R_t)
//! R_t = SGM_RDP(q_t, sigma_t C / Delta_t, alpha_j)
//! ```
//!
//! `Delta_t` is the example's clipped gradient norm at its run's last checkpoint
//! before step `t` (a grid value, rounded up; `C` before the first checkpoint).
//! The mean over a finite number of runs is an estimate of an expectation, so
//! every number here is reported with `"guarantee": false`.
//!
//! Layout: [`trace`] reads one run from a JSON-lines trace; [`runs`] checks that
//! several runs can be compared and buckets their norms; [`compose()`] is the
//! numerical core; [`report`] adds epsilons, baselines and summaries.

pub mod compose;
pub mod report;
pub mod runs;
pub mod trace;

pub use compose::{compose, compose_rounded, Composition, Rounding};
pub use report::{analyze, Analysis, ExampleResult, ExampleView, Options};
pub use runs::{Checkpoint, RunSet, StepParams};
pub use trace::{read_run, RunTrace, TraceConfig};

/// Why a data-dependent analysis was refused. Each variant is a client error
/// (the inputs cannot be analysed), never a partial number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DataDependentError {
    /// An argument (order, Hölder exponent, delta) is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A trace line could not be read or parsed.
    #[error("run {run}, line {line}: {message}")]
    Trace {
        /// 0-based index of the run among the inputs.
        run: usize,
        /// 1-based line of its trace.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// Fewer than two runs: an expectation needs several samples.
    #[error("at least 2 runs are needed for an expectation over runs, got {0}")]
    TooFewRuns(usize),
    /// The runs do not share one configuration (dataset, steps or per-step noise).
    #[error("runs differ in configuration: {0}")]
    ConfigMismatch(String),
    /// A checkpoint does not give the sensitivity of every example.
    #[error("incomplete checkpoint: {0}")]
    IncompleteCheckpoint(String),
    /// A norm is NaN, infinite or negative.
    #[error("invalid norm: {0}")]
    InvalidNorm(String),
}

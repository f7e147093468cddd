//! Several runs of one configuration, with every example's sensitivity level at
//! every checkpoint: the input of [`super::compose()`]. Construction refuses
//! anything the expectation over runs cannot be taken over.

use super::trace::RunTrace;
use super::DataDependentError;
use crate::accounting::{validate, BucketGrid};

/// One step's Poisson sampling rate and noise multiplier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepParams {
    /// Sampling rate `q_t`.
    pub sampling_rate: f64,
    /// Noise multiplier `sigma_t` (noise std `sigma_t * C`).
    pub noise_multiplier: f64,
}

/// Every example's sensitivity level (grid bucket of its clipped norm) from
/// step `before_step` until the run's next checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The first step at which these levels hold.
    pub before_step: u64,
    /// Bucket `k` of example `i` at index `i`.
    pub levels: Vec<u32>,
}

/// Validated runs: same grid, same steps, each checkpoint covers every example.
#[derive(Debug, Clone)]
pub struct RunSet {
    pub(super) grid: BucketGrid,
    pub(super) steps: Vec<StepParams>,
    pub(super) examples: usize,
    pub(super) runs: Vec<Vec<Checkpoint>>,
}

impl RunSet {
    /// Runs already reduced to levels. Checkpoints must be in step order, at most
    /// one per position, each with one level in `0..=K` per example. Before a
    /// run's first checkpoint every example is at level `K` (sensitivity `C`).
    pub fn new(
        grid: BucketGrid,
        steps: Vec<StepParams>,
        examples: usize,
        runs: Vec<Vec<Checkpoint>>,
    ) -> Result<Self, DataDependentError> {
        let bad = |m: String| DataDependentError::InvalidArgument(m);
        for (t, s) in steps.iter().enumerate() {
            validate::sampling_rate("sampling_rate", s.sampling_rate)
                .and_then(|_| validate::noise_multiplier("noise_multiplier", s.noise_multiplier))
                .map_err(|e| bad(format!("step {t}: {e}")))?;
        }
        for (r, run) in runs.iter().enumerate() {
            let mut last: Option<u64> = None;
            for c in run {
                if c.before_step > steps.len() as u64 || last.is_some_and(|l| c.before_step <= l) {
                    return Err(bad(format!(
                        "run {r}: checkpoint before step {} is out of order or past the last step",
                        c.before_step
                    )));
                }
                last = Some(c.before_step);
                if c.levels.len() != examples {
                    return Err(DataDependentError::IncompleteCheckpoint(format!(
                        "run {r}, checkpoint before step {}: {} levels for {examples} examples",
                        c.before_step,
                        c.levels.len()
                    )));
                }
                if let Some(k) = c.levels.iter().find(|&&k| k > grid.top()) {
                    return Err(bad(format!("run {r}: level {k} above the top bucket")));
                }
            }
        }
        Ok(Self {
            grid,
            steps,
            examples,
            runs,
        })
    }

    /// Runs from parsed traces: refuses differing configurations, checkpoints that
    /// miss an example (or name one twice or out of range), and norms that are not
    /// finite and non-negative. Norms are clipped at `C` and rounded up to the grid.
    pub fn from_traces(traces: &[RunTrace]) -> Result<Self, DataDependentError> {
        let Some(first) = traces.first() else {
            return Err(DataDependentError::TooFewRuns(0));
        };
        let cfg = &first.config;
        for (r, t) in traces.iter().enumerate().skip(1) {
            let c = &t.config;
            let same = c.examples == cfg.examples
                && c.max_grad_norm == cfg.max_grad_norm
                && c.rounding.unwrap_or(c.max_grad_norm / 100.0)
                    == cfg.rounding.unwrap_or(cfg.max_grad_norm / 100.0)
                && c.noise_multiplier == cfg.noise_multiplier
                && c.sampling_rate == cfg.sampling_rate;
            if !same {
                return Err(DataDependentError::ConfigMismatch(format!(
                    "run {r}'s dataset line differs from run 0's"
                )));
            }
            if t.steps.len() != first.steps.len() {
                return Err(DataDependentError::ConfigMismatch(format!(
                    "run {r} has {} steps, run 0 has {}",
                    t.steps.len(),
                    first.steps.len()
                )));
            }
            if let Some(s) = t.steps.iter().zip(&first.steps).position(|(a, b)| a != b) {
                return Err(DataDependentError::ConfigMismatch(format!(
                    "run {r}'s step {s} has a different sampling rate or noise multiplier"
                )));
            }
        }
        let grid = BucketGrid::new(
            cfg.max_grad_norm,
            cfg.rounding.unwrap_or(cfg.max_grad_norm / 100.0),
        )
        .map_err(|e| DataDependentError::InvalidArgument(e.to_string()))?;
        let n = usize::try_from(cfg.examples)
            .map_err(|_| DataDependentError::InvalidArgument("too many examples".into()))?;
        let mut runs = Vec::with_capacity(traces.len());
        for (r, t) in traces.iter().enumerate() {
            let mut checkpoints = Vec::with_capacity(t.checkpoints.len());
            for c in &t.checkpoints {
                let at = c.before_step;
                let mut levels = vec![u32::MAX; n];
                for &(id, norm) in &c.entries {
                    if !norm.is_finite() || norm < 0.0 {
                        return Err(DataDependentError::InvalidNorm(format!(
                            "run {r}, checkpoint before step {at}: example {id} has norm {norm}"
                        )));
                    }
                    let slot = usize::try_from(id).ok().and_then(|i| levels.get_mut(i));
                    let Some(slot) = slot else {
                        return Err(DataDependentError::IncompleteCheckpoint(format!(
                            "run {r}, checkpoint before step {at}: id {id} is not below {n}"
                        )));
                    };
                    if *slot != u32::MAX {
                        return Err(DataDependentError::IncompleteCheckpoint(format!(
                            "run {r}, checkpoint before step {at}: example {id} appears twice"
                        )));
                    }
                    *slot = grid.bucket_of(norm);
                }
                if let Some(missing) = levels.iter().position(|&k| k == u32::MAX) {
                    return Err(DataDependentError::IncompleteCheckpoint(format!(
                        "run {r}, checkpoint before step {at}: example {missing} is missing \
                         (a checkpoint must give every example's norm)"
                    )));
                }
                checkpoints.push(Checkpoint {
                    before_step: at,
                    levels,
                });
            }
            runs.push(checkpoints);
        }
        let steps = first
            .steps
            .iter()
            .map(|&(q, s)| StepParams {
                sampling_rate: q,
                noise_multiplier: s,
            })
            .collect();
        Self::new(grid, steps, n, runs)
    }

    /// Number of runs.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Number of steps `T`.
    pub fn steps(&self) -> &[StepParams] {
        &self.steps
    }

    /// Number of examples.
    pub fn examples(&self) -> usize {
        self.examples
    }

    /// The sensitivity grid.
    pub fn grid(&self) -> &BucketGrid {
        &self.grid
    }

    /// Step boundaries where any run's levels may change: `0`, every checkpoint
    /// position, and `T`, sorted and distinct. Interval `i` is `[b[i], b[i+1])`.
    pub fn boundaries(&self) -> Vec<u64> {
        let t = self.steps.len() as u64;
        let mut b: Vec<u64> = vec![0, t];
        b.extend(self.runs.iter().flatten().map(|c| c.before_step));
        b.sort_unstable();
        b.dedup();
        b
    }

    /// Level of `example` in run `run` at step `step` (`K` before any checkpoint).
    pub fn level(&self, run: usize, example: usize, step: u64) -> u32 {
        let cps = &self.runs[run];
        let idx = cps.partition_point(|c| c.before_step <= step);
        if idx == 0 {
            self.grid.top()
        } else {
            cps[idx - 1].levels[example]
        }
    }
}

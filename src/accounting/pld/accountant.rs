//! The public PLD accountant: worst-case epsilon/delta of a list of events, and
//! a per-level spectrum cache for per-example estimates.

use super::mechanisms::{pure_dp_pld, sgm_pld, sgm_pld_cut, Direction, Precision, Z_CUT};
use super::planner::{plan, LogMgf};
use super::pmf::DiscretePld;
use super::spectrum::{compose, Spectrum};
use crate::accounting::error::{InvalidArgument, Result};
use crate::accounting::validate;

/// Errors of the PLD accountant name the argument at fault (a 400 / exit 2).
pub type PldError = InvalidArgument;

/// Default grid spacing of the privacy loss. Connect-the-dots error is second
/// order in the spacing; at 1e-3 the epsilons stay within the 0.5% budget over
/// dp-accounting at 1e-4 on the oracle settings (tests/pld_oracles.rs).
pub const DEFAULT_VALUE_DISCRETIZATION: f64 = 1e-3;
/// Coarsest spacing accepted: beyond it the chord error of a single step is no
/// longer small against typical per-step losses.
pub const MAX_VALUE_DISCRETIZATION: f64 = 0.05;
/// Finest spacing accepted (memory and time).
pub const MIN_VALUE_DISCRETIZATION: f64 = 1e-6;
/// Wrap-around budget of a per-example cache, relative to nothing: an absolute
/// mass, added to delta, far below any delta a ledger reports.
pub const CACHE_TAIL: f64 = 1e-16;

/// One mechanism, self-composed `count` times.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PldEvent {
    /// Poisson-subsampled Gaussian: rate `q`, noise multiplier `sigma` (std / sensitivity).
    PoissonGaussian {
        /// Sampling rate in [0, 1].
        q: f64,
        /// Noise multiplier > 0.
        sigma: f64,
        /// Number of steps.
        count: u64,
    },
    /// A Gaussian release with noise std / sensitivity `sigma` (exact PLD).
    Gaussian {
        /// Noise multiplier > 0.
        sigma: f64,
        /// Number of releases.
        count: u64,
    },
    /// An `epsilon`-DP release (e.g. an eta-bounded-range exponential mechanism
    /// is eta-DP), accounted through randomized response, its tight dominating pair.
    PureDp {
        /// Epsilon > 0.
        epsilon: f64,
        /// Number of releases.
        count: u64,
    },
}

/// Discretisation settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PldOptions {
    /// Grid spacing of the privacy loss.
    pub value_discretization: f64,
}

impl Default for PldOptions {
    fn default() -> Self {
        Self {
            value_discretization: DEFAULT_VALUE_DISCRETIZATION,
        }
    }
}

impl PldOptions {
    fn checked_step(&self) -> Result<f64> {
        let h = self.value_discretization;
        if !(h.is_finite() && (MIN_VALUE_DISCRETIZATION..=MAX_VALUE_DISCRETIZATION).contains(&h)) {
            return Err(InvalidArgument::new(
                "value_discretization",
                format!(
                    "must be in [{MIN_VALUE_DISCRETIZATION}, {MAX_VALUE_DISCRETIZATION}] (coarser grids are too loose for an accurate epsilon), got {h}"
                ),
            ));
        }
        Ok(h)
    }
}

/// The composed PLD in both neighbouring directions; queries take the max.
#[derive(Debug, Clone)]
pub struct ComposedPld {
    /// With-example-as-upper direction.
    pub remove: DiscretePld,
    /// Without-example-as-upper direction.
    pub add: DiscretePld,
}

impl ComposedPld {
    /// Smallest epsilon whose delta is at most `delta` in both directions.
    pub fn epsilon(&self, delta: f64) -> Result<f64> {
        let delta = validate::delta("delta", delta)?;
        Ok(self
            .remove
            .epsilon_for_delta(delta)?
            .max(self.add.epsilon_for_delta(delta)?))
    }

    /// Delta at `epsilon` (max over directions).
    pub fn delta(&self, epsilon: f64) -> f64 {
        self.remove
            .delta_for_epsilon(epsilon)
            .max(self.add.delta_for_epsilon(epsilon))
    }
}

/// Whether `e` releases anything (validating it: an error names the bad field).
pub(super) fn releases_something(e: &PldEvent) -> Result<bool> {
    Ok(match *e {
        PldEvent::PoissonGaussian { q, sigma, count } => {
            validate::sampling_rate("sampling_rate", q)?;
            if q == 0.0 || count == 0 {
                return Ok(false);
            }
            validate::positive_noise_multiplier("noise_multiplier", sigma)?;
            true
        }
        PldEvent::Gaussian { sigma, count } => {
            if count == 0 {
                return Ok(false);
            }
            validate::positive_noise_multiplier("noise_multiplier", sigma)?;
            true
        }
        PldEvent::PureDp { epsilon, count } => {
            if count == 0 {
                return Ok(false);
            }
            validate::positive("epsilon", epsilon)?;
            true
        }
    })
}

/// The two per-mechanism PLDs of an event (`None`: it releases nothing).
pub(super) fn event_plds(e: &PldEvent, h: f64) -> Result<Option<(DiscretePld, DiscretePld, u64)>> {
    event_plds_cut(e, h, Z_CUT, Precision::Guarantee)
}

/// As [`event_plds`], Gaussian supports cut at `z_cut` (see
/// [`super::mechanisms::sgm_pld_cut`]: pessimistic, costs accuracy only), with
/// the `erfc` that `precision` asks for.
pub(super) fn event_plds_cut(
    e: &PldEvent,
    h: f64,
    z_cut: f64,
    precision: Precision,
) -> Result<Option<(DiscretePld, DiscretePld, u64)>> {
    if !releases_something(e)? {
        return Ok(None);
    }
    Ok(Some(match *e {
        PldEvent::PoissonGaussian { q, sigma, count } => {
            let r = sgm_pld_cut(q, sigma, Direction::Remove, h, z_cut, precision)?;
            let a = sgm_pld_cut(q, sigma, Direction::Add, h, z_cut, precision)?;
            (r, a, count)
        }
        PldEvent::Gaussian { sigma, count } => {
            let p = sgm_pld_cut(1.0, sigma, Direction::Remove, h, z_cut, precision)?;
            (p.clone(), p, count)
        }
        PldEvent::PureDp { epsilon, count } => {
            let p = pure_dp_pld(epsilon, h)?;
            (p.clone(), p, count)
        }
    }))
}

fn compose_direction(plds: &[(&DiscretePld, u64)], h: f64, tail: f64) -> Result<DiscretePld> {
    let mgfs: Vec<LogMgf> = plds.iter().map(|(p, _)| LogMgf::of(p)).collect();
    let weighted: Vec<(&LogMgf, u64)> = mgfs.iter().zip(plds).map(|(m, (_, c))| (m, *c)).collect();
    let window = plan(&weighted, h, tail, None)?;
    let spectra: Vec<Spectrum> = plds
        .iter()
        .map(|(p, _)| Spectrum::of(p, window.size))
        .collect();
    let parts: Vec<(&Spectrum, u64)> = spectra
        .iter()
        .zip(plds)
        .map(|(s, (_, c))| (s, *c))
        .collect();
    Ok(compose(&parts, &window, h))
}

/// Compose `events` in both directions; wrap-around is bounded by `tail` per side.
pub fn compose_events(events: &[PldEvent], opts: &PldOptions, tail: f64) -> Result<ComposedPld> {
    let h = opts.checked_step()?;
    let mut built = Vec::new();
    for e in events {
        if let Some(x) = event_plds(e, h)? {
            built.push(x);
        }
    }
    if built.is_empty() {
        let none = DiscretePld {
            step: h,
            first: 0,
            probs: vec![1.0],
            infinity_mass: 0.0,
        };
        return Ok(ComposedPld {
            remove: none.clone(),
            add: none,
        });
    }
    let rem: Vec<(&DiscretePld, u64)> = built.iter().map(|(r, _, c)| (r, *c)).collect();
    let add: Vec<(&DiscretePld, u64)> = built.iter().map(|(_, a, c)| (a, *c)).collect();
    Ok(ComposedPld {
        remove: compose_direction(&rem, h, tail)?,
        add: compose_direction(&add, h, tail)?,
    })
}

/// Wrap-around budget for a query at `delta`: small against it.
fn tail_for(delta: f64) -> f64 {
    (delta * 1e-4).clamp(1e-30, 1e-12)
}

/// Grid points per unit of epsilon below which a result is recomputed on a
/// finer grid: the chord error is relative to the grid, so a small epsilon
/// needs a finer one to stay within 0.5% of the exact value.
const REFINE_POINTS: f64 = 100.0;
/// Finest grid the automatic refinement uses.
const REFINE_FLOOR: f64 = 1e-5;
/// Grid points per per-step loss scale: a grid coarse against one step's loss
/// accumulates chord error over many steps.
const STEPS_PER_SCALE: f64 = 10.0;

/// Smallest per-step privacy-loss spread among the events (`q sqrt(e^{1/s^2} - 1)`,
/// the standard deviation of the subsampled Gaussian's likelihood ratio).
pub(super) fn loss_scale(events: &[PldEvent]) -> f64 {
    events
        .iter()
        .map(|e| match *e {
            PldEvent::PoissonGaussian { q, sigma, count } if count > 0 && q > 0.0 => {
                q * (1.0 / (sigma * sigma)).exp_m1().sqrt()
            }
            PldEvent::Gaussian { sigma, count } if count > 0 => {
                (1.0 / (sigma * sigma)).exp_m1().sqrt()
            }
            PldEvent::PureDp { epsilon, count } if count > 0 => epsilon,
            _ => f64::INFINITY,
        })
        .fold(f64::INFINITY, f64::min)
}

/// Worst-case epsilon at `delta` of the composition of `events` (a valid upper bound).
///
/// When the answer spans fewer than `REFINE_POINTS` grid steps it is recomputed
/// on a grid `epsilon / REFINE_POINTS` (not below `REFINE_FLOOR`) and the
/// smaller of the two is returned: both are valid upper bounds, so their
/// minimum is one too. A refinement the grid cannot hold keeps the first answer.
pub fn worst_case_epsilon(events: &[PldEvent], delta: f64, opts: &PldOptions) -> Result<f64> {
    let delta = validate::delta("delta", delta)?;
    opts.checked_step()?;
    let tail = tail_for(delta);
    let scaled = PldOptions {
        value_discretization: (opts
            .value_discretization
            .min(loss_scale(events) / STEPS_PER_SCALE))
        .max(REFINE_FLOOR),
    };
    let first = if scaled.value_discretization < opts.value_discretization {
        compose_events(events, &scaled, tail)
            .and_then(|p| p.epsilon(delta))
            .or_else(|_| compose_events(events, opts, tail)?.epsilon(delta))?
    } else {
        compose_events(events, opts, tail)?.epsilon(delta)?
    };
    let finer = (first / REFINE_POINTS).max(REFINE_FLOOR);
    if finer >= opts.value_discretization.min(scaled.value_discretization) {
        return Ok(first);
    }
    let refined = PldOptions {
        value_discretization: finer,
    };
    match compose_events(events, &refined, tail).and_then(|p| p.epsilon(delta)) {
        Ok(second) => Ok(first.min(second)),
        Err(_) => Ok(first),
    }
}

/// Worst-case delta at `epsilon` of the composition of `events` (a valid upper bound).
pub fn worst_case_delta(events: &[PldEvent], epsilon: f64, opts: &PldOptions) -> Result<f64> {
    validate::non_negative("epsilon", epsilon)?;
    Ok(compose_events(events, opts, 1e-30)?.delta(epsilon))
}

/// One cached level: its spectrum and MGFs in both directions.
#[derive(Debug, Clone)]
struct CachedLevel {
    spectra: [Spectrum; 2],
    mgfs: [LogMgf; 2],
}

/// Spectra of `(q, sigma)` levels on one grid and domain, for per-example
/// estimates: composing an example is a weighted sum of cached log-spectra and
/// one inverse FFT per direction.
#[derive(Debug, Clone)]
pub struct LevelCache {
    step: f64,
    size: usize,
    levels: Vec<CachedLevel>,
    /// Events composed into every result (a dataset's releases), with counts.
    common: Vec<(CachedLevel, u64)>,
}

impl LevelCache {
    /// Build the cache for `levels` (each `(q, sigma)`, e.g. `(q, sigma*C/v_k)`),
    /// with a domain large enough for any split of `max_steps` steps among them.
    pub fn new(levels: &[(f64, f64)], max_steps: u64, opts: &PldOptions) -> Result<Self> {
        Self::with_common(levels, max_steps, &[], opts)
    }

    /// As [`LevelCache::new`], plus `common` events (each at its own count)
    /// composed into every result: the releases every example of a dataset is
    /// charged. The domain holds any split of `max_steps` among the levels
    /// together with all of `common` (their counts are fixed, so they are not
    /// bounded by the worst level as the steps are).
    pub fn with_common(
        levels: &[(f64, f64)],
        max_steps: u64,
        common: &[PldEvent],
        opts: &PldOptions,
    ) -> Result<Self> {
        let h = opts.checked_step()?;
        let mut common_plds = Vec::with_capacity(common.len());
        for e in common {
            if let Some((r, a, c)) = event_plds(e, h)? {
                common_plds.push(([r, a], c));
            }
        }
        let common_mgfs: Vec<[LogMgf; 2]> = common_plds
            .iter()
            .map(|([r, a], _)| [LogMgf::of(r), LogMgf::of(a)])
            .collect();
        let mut plds = Vec::with_capacity(levels.len());
        for &(q, sigma) in levels {
            validate::sampling_rate("sampling_rate", q)?;
            if q == 0.0 {
                return Err(InvalidArgument::new(
                    "sampling_rate",
                    "a cached level needs q > 0",
                ));
            }
            validate::positive_noise_multiplier("noise_multiplier", sigma)?;
            plds.push([
                sgm_pld(q, sigma, Direction::Remove, h)?,
                sgm_pld(q, sigma, Direction::Add, h)?,
            ]);
        }
        let mgfs: Vec<[LogMgf; 2]> = plds
            .iter()
            .map(|[r, a]| [LogMgf::of(r), LogMgf::of(a)])
            .collect();
        // Domain: per lambda, the worst level bounds any split of max_steps.
        let mut size = 2;
        for d in 0..2 {
            let worst = LogMgf {
                upper: pointwise_max(mgfs.iter().map(|m| &m[d].upper)),
                lower: pointwise_max(mgfs.iter().map(|m| &m[d].lower)),
            };
            let mut parts = vec![(&worst, max_steps)];
            parts.extend(
                common_mgfs
                    .iter()
                    .zip(&common_plds)
                    .map(|(m, (_, c))| (&m[d], *c)),
            );
            size = size.max(plan(&parts, h, CACHE_TAIL, None)?.size);
        }
        let levels = plds
            .iter()
            .zip(mgfs)
            .map(|([r, a], m)| CachedLevel {
                spectra: [Spectrum::of(r, size), Spectrum::of(a, size)],
                mgfs: m,
            })
            .collect();
        let common = common_plds
            .iter()
            .zip(common_mgfs)
            .map(|(([r, a], c), m)| {
                let level = CachedLevel {
                    spectra: [Spectrum::of(r, size), Spectrum::of(a, size)],
                    mgfs: m,
                };
                (level, *c)
            })
            .collect();
        Ok(Self {
            step: h,
            size,
            levels,
            common,
        })
    }

    /// Number of cached levels.
    pub fn len(&self) -> usize {
        self.levels.len()
    }

    /// Whether no level is cached.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// FFT domain size of the cache.
    pub fn domain_size(&self) -> usize {
        self.size
    }

    /// Grid spacing of the privacy loss the cache was built with.
    pub fn value_discretization(&self) -> f64 {
        self.step
    }

    /// The composed PLD of `count` steps at each listed level (and of the
    /// common events, if any). A split of more steps than the cache was built
    /// for may not fit its domain: that is an error, never a wrapped result.
    pub fn compose(&self, counts: &[(usize, u64)]) -> Result<ComposedPld> {
        for &(i, _) in counts {
            if i >= self.levels.len() {
                return Err(InvalidArgument::new(
                    "level",
                    format!("no cached level {i}"),
                ));
            }
        }
        let mut out = Vec::with_capacity(2);
        for d in 0..2 {
            let all = counts
                .iter()
                .map(|&(i, c)| (&self.levels[i], c))
                .chain(self.common.iter().map(|(l, c)| (l, *c)));
            let mgfs: Vec<(&LogMgf, u64)> = all.clone().map(|(l, c)| (&l.mgfs[d], c)).collect();
            let window = plan(&mgfs, self.step, CACHE_TAIL, Some(self.size))?;
            let parts: Vec<(&Spectrum, u64)> = all.map(|(l, c)| (&l.spectra[d], c)).collect();
            out.push(compose(&parts, &window, self.step));
        }
        let add = out.pop().expect("two directions");
        let remove = out.pop().expect("two directions");
        Ok(ComposedPld { remove, add })
    }
}

fn pointwise_max<'a>(rows: impl Iterator<Item = &'a Vec<f64>>) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for r in rows {
        if out.is_empty() {
            out = r.clone();
        } else {
            for (o, v) in out.iter_mut().zip(r) {
                *o = o.max(*v);
            }
        }
    }
    out
}

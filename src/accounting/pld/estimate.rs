//! Per-example PLD estimates composed from cached spectra, on a grid chosen per
//! query from a relative-accuracy target.
//!
//! # The grid
//! Connect-the-dots error is relative to the grid spacing `h`: an epsilon that
//! spans few grid steps is loose (at the old fixed `h = 1e-3` an epsilon of 0.02
//! came out 30% high). As the worst case does ([`super::worst_case_epsilon`]), an
//! answer is first composed on the coarsest grid `1e-3 / 2^j` (`j <`
//! [`ESTIMATE_GRIDS`], so at finest `1e-3 / 128`) spanning [`STEPS_PER_SCALE`]
//! steps of one step's loss spread (its root mean square over the example's
//! steps: a few steps at a tiny spread do not force a fine grid on an example
//! whose loss comes from its other levels); when the answer spans fewer than
//! [`REFINE_POINTS`] grid steps it is composed again on the coarsest grid that
//! it does, and the smaller answer is kept: both are pessimistic
//! discretisations of the same composition, so their minimum is too. Grids are
//! powers of two apart so that a few grids serve every query and their spectra
//! are shared.
//!
//! # The domain
//! Each answer's FFT domain is planned from its own events (Chernoff bounds on
//! their cached MGFs, wrap-around tail [`estimate_tail`] per side: a fraction
//! [`TAIL_FRACTION`] of the query's delta, added to it) and rounded up to a
//! power of two (at least [`MIN_DOMAIN`]): similar histories share a size, and
//! so the spectra cached at it ([`EstimateCache`]). The single-step PLDs are
//! built on supports cut at [`Z_CUTS`] noise deviations, the narrowest whose
//! cost is within the same fraction of delta ([`cut_for`]); mass beyond a cut
//! goes to `+inf` or onto the support's first point, both pessimistic. A fixed
//! `1e-16` tail and the worst case's 11.5-deviation supports made domains of
//! 32k-64k points at the refined grids (the far tails of `sigma_eff ~ 1`
//! levels, not the bulk, set the span) and about 1 MB per level's spectra; with
//! both relative to delta the same loadgen histories need a quarter of that.
//!
//! # The spectra
//! A level's spectra are cached once per grid, at the largest domain asked
//! for (smaller powers of two read every `s`-th frequency, [`super::spectra`]),
//! and keep only [`KEEP_SLACK`] times the frequencies the composition that
//! built them needs, with a bound on the rest ([`super::spectrum`]): beyond
//! them every composed modulus underflows to exactly 0, so the answer is the
//! one whole spectra give. A later composition that needs more rebuilds the
//! level, keeping what it needs (counted as a miss).
//!
//! All three budgets together cost at most `3 * TAIL_FRACTION * delta` of
//! delta, and only ever raise it: the answer is the exact composition's
//! epsilon at a delta at most 0.03% smaller, never below the truth of the
//! discretised composition.

use super::accountant::{
    event_plds_cut, loss_scale, releases_something, PldEvent, DEFAULT_VALUE_DISCRETIZATION,
};
use super::mechanisms::{normal_sf, Precision, Z_CUT};

use super::planner::{plan, LogMgf};
use super::spectra::{answer_key, Answer, EstimateCache, MechanismKey};
use super::spectrum::{compose, live_bins, LogView, Spectrum, Transform};
use super::{ComposedPld, DiscretePld};
use crate::accounting::error::Result;
use crate::accounting::validate;
use std::collections::HashMap;
use std::sync::Arc;

/// Number of grids: `1e-3 / 2^j`, `j = 0 .. ESTIMATE_GRIDS`.
pub const ESTIMATE_GRIDS: u8 = 8;
/// Grid steps an epsilon must span before it is not refined (0.5% accuracy).
pub const REFINE_POINTS: f64 = 100.0;
/// Grid steps per per-step loss spread (see [`super::worst_case_epsilon`]).
pub const STEPS_PER_SCALE: f64 = 10.0;
/// Wrap-around budget per side of a composition, relative to its delta.
pub const TAIL_FRACTION: f64 = 1e-4;

/// Wrap-around budget per side of a composition at `delta`: the Chernoff bound
/// on the mass above the window is added to the mass at infinity (so to every
/// delta), and mass wrapped up from below only raises losses (at most this much
/// more delta), so the answer is that of a delta at most `2 * TAIL_FRACTION`
/// relatively smaller, never below the truth.
pub fn estimate_tail(delta: f64) -> f64 {
    (delta * TAIL_FRACTION).max(f64::MIN_POSITIVE)
}

/// Support cuts (noise standard deviations either side) the single-step PLDs
/// of an estimate are built with, narrowest first; the last is the worst
/// case's own. `Phi^c` of them: 6.2e-16, 1.1e-19, 7.6e-24, 6.2e-31.
pub const Z_CUTS: [f64; 4] = [8.0, 9.0, 10.0, Z_CUT];

/// The narrowest cut (index into [`Z_CUTS`]) whose accuracy cost for `steps`
/// composed steps, at most `2 steps Phi^c(z)` of delta (see
/// [`super::mechanisms::sgm_pld_cut`]), is within `TAIL_FRACTION * delta`.
/// Every cut is pessimistic; a narrower one only builds fewer grid points.
pub fn cut_for(steps: u64, delta: f64) -> u8 {
    let budget = delta * TAIL_FRACTION;
    (0..Z_CUTS.len() - 1)
        .find(|&i| 2.0 * steps as f64 * normal_sf(Z_CUTS[i]) <= budget)
        .unwrap_or(Z_CUTS.len() - 1) as u8
}

/// How many times the frequencies a composition needs a new spectrum keeps
/// (rounded up to a power of two, at least [`MIN_KEEP`]).
pub const KEEP_SLACK: usize = 4;
/// Fewest frequencies a new spectrum keeps.
pub const MIN_KEEP: usize = 64;

/// Smallest FFT domain (sizes below it save nothing measurable).
pub const MIN_DOMAIN: usize = 1 << 10;
/// Bytes of single-mechanism PLDs a query keeps between planning and
/// transforming; beyond it a PLD is rebuilt for its spectrum instead.
const KEEP_PLD_BYTES: usize = 64 << 20;

/// Grid spacing of grid `j`.
pub fn grid_step(j: u8) -> f64 {
    DEFAULT_VALUE_DISCRETIZATION / (1u64 << j) as f64
}

/// The coarsest grid whose spacing is at most `target` (the finest if none).
fn grid_for(target: f64) -> u8 {
    (0..ESTIMATE_GRIDS)
        .find(|&j| grid_step(j) <= target)
        .unwrap_or(ESTIMATE_GRIDS - 1)
}

fn count(e: &PldEvent) -> u64 {
    match *e {
        PldEvent::PoissonGaussian { count, .. }
        | PldEvent::Gaussian { count, .. }
        | PldEvent::PureDp { count, .. } => count,
    }
}

/// The per-step loss spread of `events` as their steps see it: the root mean
/// square over steps of each mechanism's spread. A grid coarse against it
/// accumulates chord error over many steps; unlike the smallest spread (the
/// worst case's rule), a few steps at a tiny spread do not force the finest
/// grid on an example whose loss comes from its other levels.
fn rms_loss_scale(events: &[PldEvent]) -> f64 {
    let (mut sum, mut steps) = (0.0, 0.0);
    for e in events {
        let c = count(e) as f64;
        let s = loss_scale(std::slice::from_ref(e));
        if s.is_finite() {
            sum += c * s * s;
            steps += c;
        }
    }
    if steps > 0.0 {
        (sum / steps).sqrt()
    } else {
        f64::INFINITY
    }
}

/// A query after validation: the events that release something, its delta and
/// the key of its answer (`None` when nothing is released: epsilon 0).
struct Query {
    live: Vec<PldEvent>,
    delta: f64,
    key: Box<[u64]>,
}

fn prepare(events: &[PldEvent], delta: f64) -> Result<Option<Query>> {
    let delta = validate::delta("delta", delta)?;
    let mut live = Vec::with_capacity(events.len());
    for e in events {
        // Validates every event; drops those that release nothing.
        if releases_something(e)? {
            live.push(*e);
        }
    }
    if live.is_empty() {
        return Ok(None);
    }
    let key = answer_key(&live, delta);
    Ok(Some(Query { live, delta, key }))
}

const NOTHING_RELEASED: Answer = Answer {
    epsilon: 0.0,
    value_discretization: DEFAULT_VALUE_DISCRETIZATION,
};

/// The answer [`estimate_epsilon`] would give when it needs no composition
/// (nothing released, or the same events and delta answered before and still
/// cached), else `None`. Microseconds: callers answer from it before they queue
/// for a composition slot.
pub fn cached_estimate(
    cache: &EstimateCache,
    events: &[PldEvent],
    delta: f64,
) -> Result<Option<Answer>> {
    Ok(match prepare(events, delta)? {
        None => Some(NOTHING_RELEASED),
        Some(q) => cache.peek_answer(&q.key),
    })
}

/// The estimate of the composition of `events` at `delta`: a pessimistic
/// discretisation on the grid the target asks for (module docs), answered from
/// `cache` when the same events and delta were asked before.
pub fn estimate_epsilon(cache: &EstimateCache, events: &[PldEvent], delta: f64) -> Result<Answer> {
    let Some(Query { live, delta, key }) = prepare(events, delta)? else {
        return Ok(NOTHING_RELEASED);
    };
    if let Some(a) = cache.answer(&key) {
        return Ok(a);
    }
    // The step-spread rule needs no first answer: when it already asks for a
    // finer grid, the default grid is skipped (its spectra are not built).
    let tail = estimate_tail(delta);
    let cut = cut_for(live.iter().map(count).sum(), delta);
    let by_scale = grid_for(rms_loss_scale(&live) / STEPS_PER_SCALE);
    let first = compose_on(cache, &live, by_scale, cut, tail)?.epsilon(delta)?;
    let mut answer = Answer {
        epsilon: first,
        value_discretization: grid_step(by_scale),
    };
    let j = grid_for(first / REFINE_POINTS).max(by_scale);
    if j > by_scale {
        // A refinement the domain cannot hold keeps the first answer.
        if let Ok(second) = compose_on(cache, &live, j, cut, tail).and_then(|p| p.epsilon(delta)) {
            if second < first {
                answer = Answer {
                    epsilon: second,
                    value_discretization: grid_step(j),
                };
            }
        }
    }
    cache.put_answer(key, answer);
    Ok(answer)
}

/// The composition of `events` (each releasing something) on grid `j`, their
/// single-step PLDs cut at [`Z_CUTS`]`[cut]`.
pub fn compose_on(
    cache: &EstimateCache,
    events: &[PldEvent],
    j: u8,
    cut: u8,
    tail: f64,
) -> Result<ComposedPld> {
    let h = grid_step(j);
    let z = Z_CUTS[cut as usize];
    // What the cache keys a mechanism's MGFs and spectra by besides it.
    let variant = j | (cut << 4);
    // Single-mechanism PLDs built for an MGF, kept (within a budget) for the
    // spectrum that follows.
    let mut built: HashMap<MechanismKey, [DiscretePld; 2]> = HashMap::new();
    let mut kept = 0usize;
    let mut mgfs = Vec::with_capacity(events.len());
    for e in events {
        let key = MechanismKey::of(e);
        let m = cache.mgfs(key, variant, || {
            let [r, a] = plds(e, h, z)?;
            let m = [LogMgf::of(&r), LogMgf::of(&a)];
            let bytes = (r.probs.len() + a.probs.len()) * 8;
            if kept + bytes <= KEEP_PLD_BYTES {
                kept += bytes;
                built.insert(key, [r, a]);
            }
            Ok(m)
        })?;
        mgfs.push(m);
    }
    let mut size = MIN_DOMAIN;
    for d in 0..2 {
        let parts: Vec<(&LogMgf, u64)> = mgfs
            .iter()
            .zip(events)
            .map(|(m, e)| (&m[d], count(e)))
            .collect();
        let w = plan(&parts, h, tail, None)?;
        size = size.max(w.size.next_power_of_two());
    }
    // Spectra: those held, and transforms of the levels not held (or held
    // keeping fewer frequencies than this composition needs: rebuilt).
    let keys: Vec<MechanismKey> = events.iter().map(MechanismKey::of).collect();
    let mut held: Vec<Option<Arc<[Spectrum; 2]>>> = keys
        .iter()
        .map(|k| cache.held_spectra(*k, variant, size))
        .collect();
    let mut fresh: Vec<Option<[Transform; 2]>> = keys.iter().map(|_| None).collect();
    let mut live = [0usize; 2];
    loop {
        for (i, e) in events.iter().enumerate() {
            if held[i].is_none() && fresh[i].is_none() {
                let [r, a] = match built.remove(&keys[i]) {
                    Some(p) => p,
                    None => plds(e, h, z)?,
                };
                fresh[i] = Some([Transform::of(&r, size), Transform::of(&a, size)]);
            }
        }
        for (d, live) in live.iter_mut().enumerate() {
            let views: Vec<(LogView<'_>, f64)> = events
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let v = match (&held[i], &fresh[i]) {
                        (Some(s), _) => s[d].view(size),
                        (None, Some(t)) => t[d].view(),
                        (None, None) => unreachable!("every level is held or built"),
                    };
                    (v, count(e) as f64)
                })
                .collect();
            *live = live_bins(&views, size).1;
        }
        // Exact values only lower the bounds: one more pass at most.
        let mut short = false;
        for slot in held.iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|s| s[0].kept_for(size) < live[0] || s[1].kept_for(size) < live[1])
            {
                *slot = None;
                cache.note_short();
                short = true;
            }
        }
        if !short {
            break;
        }
    }
    let mut spectra = Vec::with_capacity(events.len());
    for (i, key) in keys.iter().enumerate() {
        let s = match held[i].take() {
            Some(s) => s,
            None => {
                let [r, a] = fresh[i].take().expect("built above");
                let s = Arc::new([r.spectrum(keep(live[0])), a.spectrum(keep(live[1]))]);
                cache.put_spectra(*key, variant, s.clone());
                s
            }
        };
        spectra.push(s);
    }
    let mut out = Vec::with_capacity(2);
    for d in 0..2 {
        let parts: Vec<(&LogMgf, u64)> = mgfs
            .iter()
            .zip(events)
            .map(|(m, e)| (&m[d], count(e)))
            .collect();
        let window = plan(&parts, h, tail, Some(size))?;
        let parts: Vec<(&Spectrum, u64)> = spectra
            .iter()
            .zip(events)
            .map(|(s, e)| (&s[d], count(e)))
            .collect();
        out.push(compose(&parts, &window, h));
    }
    let add = out.pop().expect("two directions");
    let remove = out.pop().expect("two directions");
    Ok(ComposedPld { remove, add })
}

/// Frequencies a new spectrum keeps for a composition that needs `live`:
/// [`KEEP_SLACK`] times as many (a power of two, at least [`MIN_KEEP`]), so
/// that histories needing a few more still find them.
fn keep(live: usize) -> usize {
    (KEEP_SLACK * live).next_power_of_two().max(MIN_KEEP)
}

/// Both directions' PLDs of one mechanism on grid spacing `h`.
fn plds(e: &PldEvent, h: f64, z_cut: f64) -> Result<[DiscretePld; 2]> {
    match event_plds_cut(e, h, z_cut, Precision::Estimate)? {
        Some((r, a, _)) => Ok([r, a]),
        None => unreachable!("events that release nothing were dropped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::pld::{compose_events, PldOptions};

    #[test]
    fn the_cut_is_the_narrowest_within_the_delta_budget() {
        // 2 * 300 * Phi^c(8) = 3.7e-13 <= 1e-10: the narrowest.
        assert_eq!(cut_for(300, 1e-6), 0);
        // 2 * 1e6 * Phi^c(8) = 1.2e-9 > 1e-10 >= 2 * 1e6 * Phi^c(9).
        assert_eq!(cut_for(1_000_000, 1e-6), 1);
        assert_eq!(cut_for(1_000, 1e-14), 2);
        // Nothing narrower fits: the worst case's own support.
        assert_eq!(cut_for(u64::MAX, 1e-15) as usize, Z_CUTS.len() - 1);
    }

    #[test]
    fn grids_are_powers_of_two_apart_and_chosen_coarsest_first() {
        assert_eq!(grid_step(0), 1e-3);
        assert_eq!(grid_step(3), 1.25e-4);
        assert_eq!(grid_for(2e-3), 0);
        assert_eq!(grid_for(1e-4), 4);
        assert_eq!(grid_for(1e-9), ESTIMATE_GRIDS - 1);
    }

    #[test]
    fn a_cached_answer_is_the_composition_on_the_grid_it_names() {
        let cache = EstimateCache::default();
        let ev = [
            PldEvent::PoissonGaussian {
                q: 0.01,
                sigma: 6.0,
                count: 130,
            },
            PldEvent::PoissonGaussian {
                q: 0.01,
                sigma: 9.0,
                count: 131,
            },
        ];
        let a = estimate_epsilon(&cache, &ev, 1e-5).unwrap();
        assert!(a.value_discretization < 1e-3, "{a:?}");
        let opts = PldOptions {
            value_discretization: a.value_discretization,
        };
        // The same composition at the accountant's own cut and a 1e-16 tail:
        // the estimate's narrower cut and delta-relative tail cost at most
        // 2 TAIL_FRACTION of delta, never lower it.
        let direct = compose_events(&ev, &opts, 1e-16)
            .unwrap()
            .epsilon(1e-5)
            .unwrap();
        assert!(
            a.epsilon >= direct * (1.0 - 1e-12) && a.epsilon <= direct * (1.0 + 1e-4),
            "{a:?} vs {direct}"
        );
        let misses = cache.stats().misses;
        assert_eq!(cached_estimate(&cache, &ev, 1e-5).unwrap(), Some(a));
        assert_eq!(cached_estimate(&cache, &ev, 2e-5).unwrap(), None);
        assert_eq!(
            cached_estimate(&cache, &ev[..0], 1e-5).unwrap(),
            Some(NOTHING_RELEASED)
        );
        assert_eq!(estimate_epsilon(&cache, &ev, 1e-5).unwrap(), a);
        assert_eq!(cache.stats().misses, misses, "the second ask is one hit");
        assert!(estimate_epsilon(&cache, &ev, 0.0).is_err());
        assert!(cached_estimate(&cache, &ev, 0.0).is_err());
    }
}

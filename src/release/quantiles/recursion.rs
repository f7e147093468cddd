//! The KSS recursion (Kaplan, Schnapp & Stemmer, ICML 2022): the middle level
//! first, the data split at its estimate, each side's levels rescaled to the
//! side. At each depth the sub-problems see disjoint data, so one example meets
//! one mechanism per depth: `L = ceil(log2(m+1))` depths of `η²/8` each.

use super::atoms::{beside_atom, Atom, AtomMass, SubProblem};
use super::grid::Grid;
use super::mechanism::Mechanism;
use super::utility::Target;
use rand::Rng;
use rand_distr::{Binomial, Distribution};

/// Number of recursion depths of the KSS algorithm for `m` levels (the number of
/// exponential mechanisms any one example takes part in).
pub fn kss_depth(m: usize) -> usize {
    if m == 0 {
        0
    } else {
        let p = m / 2;
        1 + kss_depth(p).max(kss_depth(m - p - 1))
    }
}

/// The per-mechanism parameter `η` that makes `m` levels cost `rho` in total.
pub fn kss_eta(m: usize, rho: f64) -> f64 {
    (8.0 * rho / kss_depth(m) as f64).sqrt()
}

/// The zCDP cost of KSS with `m` levels and per-mechanism parameter `eta`.
pub fn kss_rho(m: usize, eta: f64) -> f64 {
    kss_depth(m) as f64 * eta * eta / 8.0
}

/// Release the quantiles at `levels` (each in (0, 1), strictly increasing) of
/// `values` in `[0, bound]` with KSS at total zCDP cost `rho`, on the served
/// grid. The estimates are non-decreasing in the level and lie on the grid.
///
/// A chosen atom (`0` or `B`) is not split: all its values go to its own side,
/// whose domain is then the atom alone (every level there is the atom, with no
/// data used), and that side releases a noisy count of the atom instead, with
/// which the other side's targets are set exactly (see
/// `docs/releases-quantiles.md`).
pub fn kss_quantiles<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    kss_quantiles_on(Grid::SERVED, rng, values, bound, levels, rho)
}

/// [`kss_quantiles`] on any public grid (the benchmark compares grids in the
/// same run; the privacy proof holds for every grid).
pub fn kss_quantiles_on<R: Rng + ?Sized>(
    grid: Grid,
    rng: &mut R,
    values: &[f64],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    let cells = grid.sorted_cells(values, bound);
    kss_quantiles_of_cells(grid, rng, &cells, bound, levels, rho)
}

/// [`kss_quantiles_on`] from the values' sorted cells: what the mechanism
/// consumes (a shard's counts per cell, merged and expanded, give the same
/// vector as one ledger's sorted cells).
pub fn kss_quantiles_of_cells<R: Rng + ?Sized>(
    grid: Grid,
    rng: &mut R,
    cells: &[u32],
    bound: f64,
    levels: &[f64],
    rho: f64,
) -> Vec<f64> {
    let mech = Mechanism {
        grid,
        eta: kss_eta(levels.len(), rho),
    };
    let targets: Vec<Target> = levels
        .iter()
        .map(|&q| Target {
            frac: q,
            offset: 0.0,
        })
        .collect();
    let mut out = vec![0u32; levels.len()];
    let root = SubProblem {
        cells,
        lo: 0,
        hi: grid.top(),
        atoms: AtomMass::default(),
    };
    recurse(rng, mech, root, &targets, &mut out);
    out.iter().map(|&c| grid.cell_value(c, bound)).collect()
}

fn recurse<R: Rng + ?Sized>(
    rng: &mut R,
    mech: Mechanism,
    sub: SubProblem<'_>,
    targets: &[Target],
    out: &mut [u32],
) {
    if targets.is_empty() {
        return;
    }
    if sub.lo == sub.hi {
        // A one-cell domain: every level is that cell, whatever the data.
        out.fill(sub.lo);
        return;
    }
    let p = targets.len() / 2;
    let t = targets[p];
    let (c, below, tied) = mech.sample(rng, sub.cells, (sub.lo, sub.hi), t, sub.atoms);
    out[p] = c;
    let (out_left, rest) = out.split_at_mut(p);
    let out_right = &mut rest[1..];
    let (left_targets, right_targets) = (&targets[..p], &targets[p + 1..]);
    let (eta, top) = (mech.eta, mech.grid.top());
    if c == 0 {
        // The atom {0}: its side (left) has the domain {0}.
        out_left.fill(0);
        if !right_targets.is_empty() {
            let at = (below, tied);
            let (right, moved) = beside_atom(rng, sub, Atom::Zero, at, right_targets, eta);
            recurse(rng, mech, right, &moved, out_right);
        }
    } else if c == top {
        // The atom {B}: its side (right) has the domain {B}.
        out_right.fill(c);
        if !left_targets.is_empty() {
            let at = (below, tied);
            let (left, moved) = beside_atom(rng, sub, Atom::Top, at, left_targets, eta);
            recurse(rng, mech, left, &moved, out_left);
        }
    } else {
        let (left, right, left_t, right_t) =
            split_interval(rng, sub, (c, below, tied), t, left_targets, right_targets);
        recurse(rng, mech, left, &left_t, out_left);
        recurse(rng, mech, right, &right_t, out_right);
    }
}

/// An interval cell `c` was chosen for the target `t`: its values go left or
/// right by fair coins (per-record randomness of a data-independent law), and
/// each side's targets assume the split was at the target rank (KSS): the left
/// holds the ranks below it (with the mass at `{0}`), the right those above
/// (with the mass at `{B}`).
#[allow(clippy::type_complexity)]
fn split_interval<'a, R: Rng + ?Sized>(
    rng: &mut R,
    sub: SubProblem<'a>,
    (c, below, tied): (u32, usize, usize),
    t: Target,
    left_targets: &[Target],
    right_targets: &[Target],
) -> (SubProblem<'a>, SubProblem<'a>, Vec<Target>, Vec<Target>) {
    let to_left = if tied == 0 {
        0
    } else {
        Binomial::new(tied as u64, 0.5).map_or(0, |b| b.sample(rng) as usize)
    };
    let split = below + to_left;
    let w0 = sub.atoms.zero_mass();
    let left: Vec<Target> = left_targets
        .iter()
        .map(|l| Target {
            frac: l.frac / t.frac,
            offset: l.offset + l.frac * (w0 - t.offset) / t.frac,
        })
        .collect();
    let right: Vec<Target> = right_targets
        .iter()
        .map(|r| {
            let frac = (r.frac - t.frac) / (1.0 - t.frac);
            Target {
                frac,
                offset: r.offset - t.offset + frac * (t.offset - w0),
            }
        })
        .collect();
    let left_sub = SubProblem {
        cells: &sub.cells[..split],
        lo: sub.lo,
        hi: c,
        atoms: AtomMass {
            zero: sub.atoms.zero,
            top: Some(0.0),
        },
    };
    let right_sub = SubProblem {
        cells: &sub.cells[split..],
        lo: c,
        hi: sub.hi,
        atoms: AtomMass {
            zero: Some(0.0),
            top: sub.atoms.top,
        },
    };
    (left_sub, right_sub, left, right)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn depth_is_ceil_log2_of_m_plus_one() {
        for m in 1..200usize {
            let expect = ((m + 1) as f64).log2().ceil() as usize;
            assert_eq!(kss_depth(m), expect, "m = {m}");
        }
    }

    #[test]
    fn cost_formula_round_trips() {
        for m in [1usize, 5, 9, 31] {
            let eta = kss_eta(m, 0.00125);
            assert!((kss_rho(m, eta) - 0.00125).abs() < 1e-17);
        }
        // Five levels take three depths: η = sqrt(8 ρ / 3).
        assert!((kss_eta(5, 0.00125) - (0.01f64 / 3.0).sqrt()).abs() < 1e-15);
    }

    #[test]
    fn estimates_are_monotone_and_on_the_grid() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
        let values: Vec<f64> = (0..5000)
            .map(|i| ((i * 7919) % 5000) as f64 / 1000.0)
            .collect();
        let levels = [0.05, 0.25, 0.5, 0.75, 0.95];
        for grid in [Grid::SERVED, Grid::new(1 << 10)] {
            let est = kss_quantiles_on(grid, &mut rng, &values, 5.0, &levels, 0.01);
            assert!(est.windows(2).all(|w| w[0] <= w[1]), "{est:?}");
            for v in &est {
                assert_eq!(grid.cell_value(grid.cell_of(*v, 5.0), 5.0), *v, "{grid:?}");
            }
        }
    }
}

//! Chosen atoms (`{0}`, `{B}`) are never split: their values all go
//! to the atom's own side, whose levels are then the atom without looking at
//! the data, and that side releases a noisy count of the atom instead, with
//! which the other side's targets keep the parent's ranks
//! (`docs/releases-quantiles.md`, "Why atoms are not split").

use super::utility::Target;
use crate::release::noise::add_laplace;
use rand::Rng;

/// One node of the recursion: its sorted values, its domain `lo..=hi` and the
/// public masses standing on its atoms.
#[derive(Clone, Copy)]
pub(super) struct SubProblem<'a> {
    pub(super) cells: &'a [u32],
    pub(super) lo: u32,
    pub(super) hi: u32,
    pub(super) atoms: AtomMass,
}

/// Public masses that a sub-problem places on the atoms `{0}` and `{B}` of its
/// domain in place of values it no longer holds: after a chosen atom's values
/// were sent to the atom's own side, the other side keeps the atom cell in its
/// domain with their released (noisy) count, so a level that falls inside the
/// atom can still choose it. `None`: the atom's values, if any, are the
/// sub-problem's own.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AtomMass {
    /// Released count standing at `{0}` (below every value).
    pub zero: Option<f64>,
    /// Released count standing at `{B}` (above every value).
    pub top: Option<f64>,
}

impl AtomMass {
    pub(super) fn zero_mass(&self) -> f64 {
        self.zero.unwrap_or(0.0)
    }

    pub(super) fn top_mass(&self) -> f64 {
        self.top.unwrap_or(0.0)
    }
}

/// The Laplace scale `b = 2/η` of the noisy atom count that a sub-problem
/// holding only an atom releases in place of its exponential mechanism. A count
/// has sensitivity 1, so its privacy loss lies in `[−1/b, 1/b]`: `η`-bounded-
/// range, hence `η²/8`-zCDP, the same as the mechanism it replaces, and
/// `η/2`-DP, within the pure-DP event of parameter `η` that the PLD worst case
/// composes per depth (`crate::release::pld`). A Gaussian count of the same
/// zCDP cost (`σ = 2/η`, as first merged) is not pure DP, so its depth would
/// not be dominated by that event.
pub fn atom_count_scale(eta: f64) -> f64 {
    2.0 / eta
}

/// Which atom a mechanism chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Atom {
    /// `{0}`: its values go left.
    Zero,
    /// `{B}`: its values go right.
    Top,
}

/// The sub-problem on the other side of a chosen atom, and its `targets`
/// moved to the parent's ranks. `below` and `tied` are the parent's values
/// below the atom's cell and in it. The atom's released count `n̂` (drawn here,
/// once per atom) stands on the atom's cell in the child's domain: at `{B}` a
/// left level `(f, o)` wants the rank `f·(n_L + n_B) + o` and becomes `(f, o +
/// f·n̂)`; at `{0}` a right level likewise. An atom whose values were already
/// sent away (its mass is `Some`) splits off nothing and moves no target.
pub(super) fn beside_atom<'a, R: Rng + ?Sized>(
    rng: &mut R,
    sub: SubProblem<'a>,
    atom: Atom,
    (below, tied): (usize, usize),
    targets: &[Target],
    eta: f64,
) -> (SubProblem<'a>, Vec<Target>) {
    let mut release = |mass: Option<f64>| match mass {
        Some(_) => (targets.to_vec(), mass),
        None => {
            // Clamped at 0: post-processing.
            let n = add_laplace(rng, tied as f64, atom_count_scale(eta)).max(0.0);
            let moved = targets
                .iter()
                .map(|t| Target {
                    frac: t.frac,
                    offset: t.offset + t.frac * n,
                })
                .collect();
            (moved, Some(n))
        }
    };
    match atom {
        Atom::Zero => {
            let (moved, zero) = release(sub.atoms.zero);
            let child = SubProblem {
                cells: &sub.cells[below + tied..],
                atoms: AtomMass { zero, ..sub.atoms },
                ..sub
            };
            (child, moved)
        }
        Atom::Top => {
            let (moved, top) = release(sub.atoms.top);
            let child = SubProblem {
                cells: &sub.cells[..below],
                atoms: AtomMass { top, ..sub.atoms },
                ..sub
            };
            (child, moved)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kss_quantiles;
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn an_atom_count_costs_what_the_mechanism_it_replaces_costs() {
        // The Laplace count's privacy loss under a change of 1 spans 2/b = η
        // (η-bounded-range, η²/8-zCDP) and its pure-DP epsilon 1/b = η/2 is
        // within the PLD's per-depth event of epsilon η. Checked on the
        // log-density ratio itself, over outputs on both sides.
        for eta in [0.01, 0.0577, 1.0] {
            let b = atom_count_scale(eta);
            let log_density = |z: f64, x: f64| -(z - x).abs() / b;
            let losses: Vec<f64> = (-400..=400)
                .map(|k| k as f64 * 0.05 / eta)
                .map(|z| log_density(z, 10.0) - log_density(z, 11.0))
                .collect();
            let (lo, hi) = losses
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(
                (hi - lo - eta).abs() <= 1e-12 * eta.max(1.0),
                "{eta}: span {}",
                hi - lo
            );
            assert!(hi.max(-lo) <= eta / 2.0 + 1e-12, "{eta}");
        }
    }

    #[test]
    fn levels_below_an_atom_at_the_bound_are_not_shifted() {
        // 30% of the values at B. The old fair-coin split of the B
        // cell gave the 0.7 level half the atom and a rescaled level that
        // assumed 0.9·n values: about 1,000 ranks low. With the atom sent
        // whole and its noisy count (Laplace, b = 2/η ≈ 35) setting the
        // target, the error is the mechanism's (tens of ranks).
        let n = 20_000usize;
        let interior = 14_000usize;
        let mut values: Vec<f64> = (0..interior)
            .map(|i| 0.5 + 0.5 * i as f64 / interior as f64)
            .collect();
        values.extend(std::iter::repeat_n(1.0, n - interior));
        let levels = [0.1, 0.3, 0.5, 0.65, 0.9];
        let mut rng = rand_pcg::Pcg64::seed_from_u64(29);
        let trials = 40;
        let mut err = [0.0f64; 5];
        for _ in 0..trials {
            let est = kss_quantiles(&mut rng, &values, 1.0, &levels, 0.00125);
            assert_eq!(est[4], 1.0, "{est:?}");
            for (j, (&q, &v)) in levels.iter().zip(&est).enumerate() {
                // Values are evenly spaced, so the rank of v is linear in v;
                // B holds the ranks [interior, n].
                let target = q * n as f64;
                err[j] += if v == 1.0 {
                    (interior as f64 - target).max(0.0)
                } else {
                    ((v - 0.5) * 2.0 * interior as f64 - target).abs()
                } / trials as f64;
            }
        }
        // The mechanism's own error is ≈ 1/(η s) ≈ 17-28 ranks, plus the
        // ln(#cells) of the grid cells between values and, for 0.65, the
        // count's noise (E|z| = b ≈ 35, times the level's fraction 0.72);
        // 60 is an order of magnitude below the coin split's error.
        for (j, e) in err.iter().enumerate() {
            assert!(
                *e <= 60.0,
                "level {}: mean rank error {e} ({err:?})",
                levels[j]
            );
        }
    }

    #[test]
    fn atoms_at_zero_are_sent_whole_too() {
        // 40% of the values at 0: the levels above the atom keep their ranks.
        let n = 20_000usize;
        let zeros = 8_000usize;
        let mut values: Vec<f64> = vec![0.0; zeros];
        values.extend((0..n - zeros).map(|i| 0.5 * i as f64 / (n - zeros) as f64));
        let levels = [0.2, 0.45, 0.6, 0.8];
        let mut rng = rand_pcg::Pcg64::seed_from_u64(30);
        let trials = 40;
        let mut err = [0.0f64; 4];
        for _ in 0..trials {
            let est = kss_quantiles(&mut rng, &values, 1.0, &levels, 0.00125);
            assert_eq!(est[0], 0.0, "{est:?}");
            for (j, (&q, &v)) in levels.iter().zip(&est).enumerate() {
                let rank = if v == 0.0 {
                    zeros as f64
                } else {
                    zeros as f64 + v / 0.5 * (n - zeros) as f64
                };
                err[j] += (rank - q * n as f64).abs() / trials as f64;
            }
        }
        // Level 0.2 is inside the atom (asserted above); the others as in the
        // previous test.
        for (j, e) in err.iter().enumerate().skip(1) {
            assert!(
                *e <= 60.0,
                "level {}: mean rank error {e} ({err:?})",
                levels[j]
            );
        }
    }

    #[test]
    fn ties_at_the_bound_are_found() {
        // Half the values exactly at B: the 0.75-quantile is B.
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        let mut values: Vec<f64> = (0..5000).map(|i| i as f64 / 5000.0).collect();
        values.extend(std::iter::repeat_n(2.0, 5000));
        let est = kss_quantiles(&mut rng, &values, 2.0, &[0.25, 0.75], 0.01);
        assert_eq!(est[1], 2.0, "{est:?}");
        assert!((est[0] - 0.5).abs() < 0.05, "{est:?}");
    }
}

//! The proof-facing part of the mechanism: a level's target and the utility
//! whose changes under adding or removing one value span at most 1, which
//! makes `exp(η u)` `η`-bounded-range (`docs/releases-quantiles.md`, "Privacy
//! proof"). The brute-force tests below check that span over every added
//! value, fraction, offset and atom mass the recursion can produce.

/// The utility scale `s(q) = 1 / (2 max(q, 1−q))` that bounds the span of the
/// utilities' changes by 1 under add/remove.
pub fn utility_scale(q: f64) -> f64 {
    0.5 / q.max(1.0 - q)
}

/// A level's target inside a sub-problem of `n` values: the rank `frac · n +
/// offset`, with `frac` in (0, 1) and `offset` public (earlier outputs only).
/// Adding a value to the sub-problem moves the target by `frac`, which is all the
/// privacy proof uses (`docs/releases-quantiles.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// The share of the sub-problem's own values below the target.
    pub frac: f64,
    /// A public offset, in ranks.
    pub offset: f64,
}

impl Target {
    /// The target rank among `n` values.
    pub fn rank(&self, n: usize) -> f64 {
        self.frac * n as f64 + self.offset
    }
}

/// The utility of a cell whose rank interval is `[a, b]` in a sub-problem of
/// `n` values, for the target `t`: `−s(t.frac) · dist(t.rank(n), [a, b])`. Its
/// changes under adding or removing one value span at most 1
/// (`utility_changes_span_at_most_one`).
pub fn utility(t: Target, n: usize, a: f64, b: f64) -> f64 {
    let target = t.rank(n);
    -utility_scale(t.frac) * (a - target).max(target - b).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::super::{cell_mechanism, AtomMass, GRID_CELLS};
    use super::*;
    use rand::SeedableRng;

    /// The rank interval of cell `c` as `cell_mechanism` computes it, by brute
    /// force: the values below it shifted up by the public mass at `{0}`, that
    /// mass widening `{0}` below, and the mass at `{B}` widening `{B}` above
    /// (cells `0..=9`, `9` playing `{B}`).
    fn interval(cells: &[u32], c: u32, w0: f64, w1: f64) -> (f64, f64) {
        let below = cells.iter().filter(|&&x| x < c).count() as f64;
        let at = cells.iter().filter(|&&x| x == c).count() as f64;
        let a = if c == 0 { 0.0 } else { w0 + below };
        (a, w0 + below + at + if c == 9 { w1 } else { 0.0 })
    }

    #[test]
    fn utility_changes_span_at_most_one() {
        // Brute force over small data: add one value anywhere (atoms 0 and 9
        // included), every fraction, offsets of either sign (the targets of
        // sub-problems after an atom split or a KSS rescale), and public
        // masses standing on the atoms (after an atom was sent away).
        let util = |cells: &[u32], c: u32, t: Target, w: (f64, f64)| {
            let (a, b) = interval(cells, c, w.0, w.1);
            utility(t, cells.len(), a, b)
        };
        let base: Vec<u32> = vec![0, 1, 2, 2, 4, 4, 4, 5, 7, 7, 8, 9, 9, 9];
        let mut worst: f64 = 0.0;
        for frac in [0.05, 0.1, 1.0 / 3.0, 0.5, 0.6, 0.8, 0.95] {
            for offset in [-6.5, -2.0, 0.0, 1.0, 3.25, 9.0] {
                for w in [(0.0, 0.0), (3.5, 0.0), (0.0, 6.0), (2.0, 11.25)] {
                    let t = Target { frac, offset };
                    for z in 0..10u32 {
                        let mut added = base.clone();
                        added.push(z);
                        added.sort_unstable();
                        let diffs: Vec<f64> = (0..10u32)
                            .map(|c| util(&added, c, t, w) - util(&base, c, t, w))
                            .collect();
                        let span = diffs.iter().cloned().fold(f64::MIN, f64::max)
                            - diffs.iter().cloned().fold(f64::MAX, f64::min);
                        assert!(span <= 1.0 + 1e-12, "{t:?}, {w:?}, z {z}: span {span}");
                        worst = worst.max(span);
                    }
                }
            }
        }
        // The bound is attained, so the test would catch a looser utility.
        assert!(worst > 0.99, "{worst}");
    }

    #[test]
    fn cell_mechanism_uses_the_brute_force_intervals() {
        // With η huge the mechanism returns a cell of utility 0 (the target
        // inside its interval) whenever one exists: check on the cells of the
        // brute force above, with masses at the atoms, mapped onto the grid.
        let mut rng = rand_pcg::Pcg64::seed_from_u64(17);
        let map = |c: u32| if c == 9 { GRID_CELLS + 1 } else { c * 1000 };
        let base: Vec<u32> = vec![1, 2, 2, 4, 4, 4, 5, 7, 7, 8];
        let cells: Vec<u32> = base.iter().map(|&c| map(c)).collect();
        for (w0, w1) in [(3.5, 6.0), (0.0, 20.0)] {
            let atoms = AtomMass {
                zero: Some(w0),
                top: Some(w1),
            };
            // Off every interval end, and within the total mass 10 + w0 + w1.
            for rank in [1.2, 4.2, 9.2, 12.2, 15.0, 25.0] {
                if rank > 10.0 + w0 + w1 {
                    continue;
                }
                let t = Target {
                    frac: 0.5,
                    offset: rank - 5.0,
                };
                let (c, _, _) = cell_mechanism(&mut rng, &cells, 0, GRID_CELLS + 1, t, 1e6, atoms);
                let want = (0..10u32)
                    .filter(|&k| {
                        let (a, b) = interval(&base, k, w0, w1);
                        a <= rank && rank <= b && (k == 0 || k == 9 || base.contains(&k))
                    })
                    .map(map)
                    .collect::<Vec<_>>();
                assert!(
                    want.contains(&c),
                    "rank {rank}, w {w0}/{w1}: {c} not in {want:?}"
                );
            }
        }
    }

    #[test]
    fn the_unscaled_utility_would_overspend() {
        // Without s(f) the span reaches 2·max(f, 1−f): the brute force above
        // would see it (so its bound is not vacuous).
        let base: Vec<u32> = (0..20).collect();
        let t = Target {
            frac: 0.9,
            offset: 0.0,
        };
        let raw = |cells: &[u32], c: u32| {
            let (a, b) = interval(cells, c, 0.0, 0.0);
            utility(t, cells.len(), a, b) / utility_scale(t.frac)
        };
        let mut worst: f64 = 0.0;
        for z in 0..20u32 {
            let mut added = base.clone();
            added.push(z);
            added.sort_unstable();
            let diffs: Vec<f64> = (0..20u32).map(|c| raw(&added, c) - raw(&base, c)).collect();
            worst = worst.max(
                diffs.iter().cloned().fold(f64::MIN, f64::max)
                    - diffs.iter().cloned().fold(f64::MAX, f64::min),
            );
        }
        assert!(worst > 1.5, "{worst}");
    }
}

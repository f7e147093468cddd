//! The exponential mechanism on the grid's cells, sampled exactly with the
//! Gumbel-max trick over runs of cells of equal utility (a run of `k` empty
//! cells is one candidate of log-weight `ln k + η u`, then a cell uniformly in
//! it: the same law as sampling every cell).

use super::atoms::AtomMass;
use super::grid::Grid;
use super::utility::{utility, Target};
use crate::release::noise::gumbel;
use rand::Rng;

/// The exponential mechanism with parameter `η` on a public grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mechanism {
    /// The grid its outputs live on.
    pub grid: Grid,
    /// `η`: each sample is `η`-bounded-range, hence `η²/8`-zCDP.
    pub eta: f64,
}

impl Mechanism {
    /// Choose a cell of `lo..=hi` for the target `t` from the sorted `cells`
    /// (all within `lo..=hi`): cell `c` with probability proportional to
    /// `exp(η u(c))` ([`utility`]), `c`'s rank interval being `[#{x < c},
    /// #{x ≤ c}]` shifted up by the public mass at `{0}` (which widens the
    /// `{0}` cell below) and, for `{B}`, widened above by the public mass
    /// there. Returns the cell, the number of values below it and the number
    /// in it.
    pub fn sample<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        cells: &[u32],
        (lo, hi): (u32, u32),
        t: Target,
        atoms: AtomMass,
    ) -> (u32, usize, usize) {
        let (grid, eta) = (self.grid, self.eta);
        let n = cells.len();
        let top = grid.top();
        let w0 = if lo == 0 { atoms.zero_mass() } else { 0.0 };
        let w1 = if hi == top { atoms.top_mass() } else { 0.0 };
        // Best (score, first cell, cells in the run, values below, values in the cell).
        let mut best = (f64::NEG_INFINITY, lo, 1u32, 0usize, 0usize);
        let mut consider = |rng: &mut R, first: u32, count: u32, below: usize, tied: usize| {
            let last = first + (count - 1);
            let a = if first == 0 { 0.0 } else { w0 + below as f64 };
            let b = w0 + (below + tied) as f64 + if last == top { w1 } else { 0.0 };
            let score = f64::from(count).ln() + eta * utility(t, n, a, b) + gumbel(rng);
            if score > best.0 {
                best = (score, first, count, below, tied);
            }
        };
        let (mut next, mut below) = (lo, 0usize);
        while below < cells.len() {
            let c = cells[below];
            let tied = cells[below..].partition_point(|&x| x == c);
            for (first, count) in grid.gap_blocks(next, c) {
                consider(rng, first, count, below, 0);
            }
            consider(rng, c, 1, below, tied);
            below += tied;
            next = c + 1;
        }
        for (first, count) in grid.gap_blocks(next, hi + 1) {
            consider(rng, first, count, below, 0);
        }
        let (_, first, count, below, tied) = best;
        (first + rng.random_range(0..count), below, tied)
    }
}

/// [`Mechanism::sample`] on the served grid ([`Grid::SERVED`]).
pub fn cell_mechanism<R: Rng + ?Sized>(
    rng: &mut R,
    cells: &[u32],
    lo: u32,
    hi: u32,
    t: Target,
    eta: f64,
    atoms: AtomMass,
) -> (u32, usize, usize) {
    let grid = Grid::SERVED;
    Mechanism { grid, eta }.sample(rng, cells, (lo, hi), t, atoms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The sampler's tests use a grid of `2^16` cells whatever the served one.
    const FINE: Grid = Grid::new(1 << 16);
    const TOP: u32 = (1 << 16) + 1;

    fn sample(
        cells: &[u32],
        t: Target,
        eta: f64,
        rng: &mut rand_pcg::Pcg64,
    ) -> (u32, usize, usize) {
        Mechanism { grid: FINE, eta }.sample(rng, cells, (0, TOP), t, NONE)
    }

    const NONE: AtomMass = AtomMass {
        zero: None,
        top: None,
    };

    fn at(q: f64) -> Target {
        Target {
            frac: q,
            offset: 0.0,
        }
    }

    #[test]
    fn cell_mechanism_concentrates_on_the_target_rank() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
        let cells: Vec<u32> = (1..=1000).map(|i| i * 50).collect();
        let mut total = 0usize;
        for _ in 0..200 {
            let (c, below, tied) = sample(&cells, at(0.5), 1.0, &mut rng);
            assert!(c <= TOP);
            assert_eq!(below, cells.partition_point(|&x| x < c));
            assert_eq!(below + tied, cells.partition_point(|&x| x <= c));
            total += below.abs_diff(500).min((below + tied).abs_diff(500));
        }
        // With η s = 1 the rank error is Laplace-like with scale 1, plus
        // log(50)/η for the 49 empty cells of each gap.
        let mean = total as f64 / 200.0;
        assert!(mean < 8.0, "mean error {mean}");
    }

    #[test]
    fn an_offset_moves_the_target() {
        // Target rank 0.25·1000 + 500 = 750: the same as level 0.75 without
        // an offset, but at the scale s(0.25).
        let mut rng = rand_pcg::Pcg64::seed_from_u64(13);
        let cells: Vec<u32> = (1..=1000).map(|i| i * 50).collect();
        let t = Target {
            frac: 0.25,
            offset: 500.0,
        };
        let mut total = 0usize;
        for _ in 0..200 {
            let (_, below, tied) = sample(&cells, t, 1.0, &mut rng);
            total += below.abs_diff(750).min((below + tied).abs_diff(750));
        }
        // η s = 2/3: Laplace-like scale 1.5 plus log(50)/(2/3) ≈ 6 ranks.
        let mean = total as f64 / 200.0;
        assert!(mean < 10.0, "mean error {mean}");
    }

    #[test]
    fn a_tied_run_covering_the_target_is_chosen() {
        // 300 distinct values 1,000 cells apart, the middle one repeated 2,000
        // times: the median is that value, with utility 0 over 2,000 ranks.
        let mut rng = rand_pcg::Pcg64::seed_from_u64(4);
        let mut cells: Vec<u32> = (1..=300).map(|i| i * 200).collect();
        cells.extend(std::iter::repeat_n(150 * 200, 2000));
        cells.sort_unstable();
        let hits = (0..200)
            .filter(|_| sample(&cells, at(0.5), 0.05, &mut rng).0 == 30_000)
            .count();
        assert!(hits >= 190, "{hits} of 200");
    }

    #[test]
    fn a_coarser_grid_samples_its_own_cells() {
        // On a grid of 100 cells, values 0.005, 0.015, …: cell k holds one
        // value; the median's cell is 50 (rank interval [49, 50]) or 51.
        let grid = Grid::new(100);
        let values: Vec<f64> = (0..100).map(|i| (i as f64 + 0.5) / 100.0).collect();
        let cells = grid.sorted_cells(&values, 1.0);
        let mut rng = rand_pcg::Pcg64::seed_from_u64(8);
        let m = Mechanism { grid, eta: 50.0 };
        for _ in 0..20 {
            let (c, below, tied) = m.sample(&mut rng, &cells, (0, grid.top()), at(0.5), NONE);
            assert!((50..=51).contains(&c), "{c}");
            assert_eq!((below, tied), (c as usize - 1, 1));
        }
    }
}

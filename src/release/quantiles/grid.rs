//! The public grid (a per-record map that depends on `B` and the cell count
//! only): the atoms `{0}` and `{B}` and `cells` intervals of width `h = B /
//! cells` between them. The mechanism samples a cell with the counting measure
//! on the cells as its data-independent base measure and releases the cell's
//! public representative (post-processing), so the grid's resolution is the
//! release's: see `docs/releases-quantiles.md` ("Choice of `G`").

/// Number of interval cells of the served grid: the release resolution is
/// `B / GRID_CELLS` (measured choice; see `docs/releases-quantiles.md`).
pub const GRID_CELLS: u32 = 1 << 13;

/// A public grid of `cells` interval cells between the atoms `{0}` (cell 0)
/// and `{B}` (cell `cells + 1`). Benchmarks compare grids in the same run; the
/// release serves [`Grid::SERVED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    cells: u32,
}

impl Grid {
    /// The grid every release uses.
    pub const SERVED: Grid = Grid { cells: GRID_CELLS };

    /// A grid of `cells` interval cells (at least 1, at most `2^30`).
    pub const fn new(cells: u32) -> Grid {
        let cells = if cells == 0 {
            1
        } else if cells > 1 << 30 {
            1 << 30
        } else {
            cells
        };
        Grid { cells }
    }

    /// Its number of interval cells.
    pub fn cells(&self) -> u32 {
        self.cells
    }

    /// The cell of the atom `{B}` (the last cell).
    pub fn top(&self) -> u32 {
        self.cells + 1
    }

    /// The resolution `h = B / cells`, in units of `B`.
    pub fn resolution(&self) -> f64 {
        1.0 / f64::from(self.cells)
    }

    /// The cell of `x` (clamped into `[0, bound]`): `0` for the atom `{0}`,
    /// [`Grid::top`] for the atom `{bound}`, else `ceil(x / h)` in `1..=cells`.
    pub fn cell_of(&self, x: f64, bound: f64) -> u32 {
        if x.is_nan() || x <= 0.0 {
            0
        } else if x >= bound {
            self.top()
        } else {
            ((x / bound * f64::from(self.cells)).ceil() as u32).clamp(1, self.cells)
        }
    }

    /// The public value released for a cell: `0`, `bound`, or the midpoint.
    pub fn cell_value(&self, c: u32, bound: f64) -> f64 {
        match c {
            0 => 0.0,
            c if c > self.cells => bound,
            c => (f64::from(c) - 0.5) / f64::from(self.cells) * bound,
        }
    }

    /// The sorted cells of `values`.
    pub fn sorted_cells(&self, values: &[f64], bound: f64) -> Vec<u32> {
        let mut cells: Vec<u32> = values.iter().map(|&x| self.cell_of(x, bound)).collect();
        cells.sort_unstable();
        cells
    }

    /// The empty cells `from..end` as runs `(first, count)`, the atoms `{0}`
    /// and `{B}` split off as runs of their own (their rank intervals can
    /// differ from their neighbours').
    pub(super) fn gap_blocks(&self, from: u32, end: u32) -> impl Iterator<Item = (u32, u32)> {
        let top = self.top();
        let zero = (from == 0 && end > 0).then_some((0, 1));
        let inner_from = from.max(1);
        let inner_end = end.min(top);
        let inner = (inner_from < inner_end).then(|| (inner_from, inner_end - inner_from));
        let atom = (end > top && from <= top).then_some((top, 1));
        zero.into_iter().chain(inner).chain(atom)
    }
}

/// The served release's public value resolution `h = B / GRID_CELLS`, in
/// units of `B`.
pub fn resolution() -> f64 {
    Grid::SERVED.resolution()
}

/// The served grid's cell of `x` ([`Grid::cell_of`]).
pub fn cell_of(x: f64, bound: f64) -> u32 {
    Grid::SERVED.cell_of(x, bound)
}

/// The served grid's public value of cell `c` ([`Grid::cell_value`]).
pub fn cell_value(c: u32, bound: f64) -> f64 {
    Grid::SERVED.cell_value(c, bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip_within_the_resolution() {
        for grid in [Grid::SERVED, Grid::new(1 << 12), Grid::new(7)] {
            for x in [0.0, 1e-12, 0.3, 0.5, 0.999_999_9, 1.0] {
                let v = grid.cell_value(grid.cell_of(x, 1.0), 1.0);
                assert!(
                    (v - x).abs() <= grid.resolution() / 2.0 + 1e-15,
                    "{grid:?}: {x} -> {v}"
                );
            }
            assert_eq!(grid.cell_value(grid.cell_of(0.0, 2.0), 2.0), 0.0);
            assert_eq!(grid.cell_value(grid.cell_of(2.0, 2.0), 2.0), 2.0);
        }
        assert_eq!(cell_of(0.5, 1.0), Grid::SERVED.cell_of(0.5, 1.0));
        assert_eq!(resolution(), 1.0 / f64::from(GRID_CELLS));
    }

    #[test]
    fn gap_blocks_split_off_the_atoms() {
        let g = Grid::new(10);
        let all: Vec<_> = g.gap_blocks(0, 12).collect();
        assert_eq!(all, vec![(0, 1), (1, 10), (11, 1)]);
        assert_eq!(g.gap_blocks(3, 5).collect::<Vec<_>>(), vec![(3, 2)]);
        assert_eq!(g.gap_blocks(5, 5).count(), 0);
        assert_eq!(g.gap_blocks(11, 12).collect::<Vec<_>>(), vec![(11, 1)]);
    }
}

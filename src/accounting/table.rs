//! Per-bucket RDP tables: the hot precomputation of the service (spec §3, "Cost").
//!
//! For one step configuration (a sampling rate and noise multiplier, or a shuffled
//! Gaussian charge) the table holds the RDP of every bucket value at every order.
//! Tables are immutable and shared through [`TableCache`], keyed by everything
//! that determines them.

use super::grid::BucketGrid;
use super::sgm::{gaussian_rdp, sgm_rdp_orders};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What one step charges an example whose clipped norm is `v_k`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepMechanism {
    /// Poisson sampling at rate `q`, Gaussian noise `sigma · C`.
    Poisson {
        /// Sampling rate.
        q: f64,
        /// Noise multiplier.
        sigma: f64,
    },
    /// The plain Gaussian mechanism (a shuffled batch's once-per-epoch charge).
    Gaussian {
        /// Noise multiplier.
        sigma: f64,
    },
}

impl StepMechanism {
    /// RDP at every order for an example with effective noise multiplier `sigma_eff`.
    fn rdp_orders(&self, sigma_eff: f64, orders: &[f64], out: &mut [f64]) {
        match *self {
            StepMechanism::Poisson { q, .. } => {
                out.copy_from_slice(&sgm_rdp_orders(q, sigma_eff, orders))
            }
            StepMechanism::Gaussian { .. } => {
                for (slot, &a) in out.iter_mut().zip(orders) {
                    *slot = gaussian_rdp(sigma_eff, a);
                }
            }
        }
    }

    fn sigma(&self) -> f64 {
        match *self {
            StepMechanism::Poisson { sigma, .. } | StepMechanism::Gaussian { sigma } => sigma,
        }
    }
}

/// RDP of every bucket (rows) at every order (columns), row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct RdpTable {
    orders: usize,
    values: Vec<f64>,
}

impl RdpTable {
    /// Compute the table for `mechanism` over `grid` at `orders` on one thread.
    pub fn compute(grid: &BucketGrid, mechanism: StepMechanism, orders: &[f64]) -> Self {
        Self::compute_with_threads(grid, mechanism, orders, 1)
    }

    /// Compute the table with up to `threads` threads, each taking a contiguous
    /// share of the buckets. Rows are independent, so the result is bit-identical
    /// to the single-threaded one.
    pub fn compute_with_threads(
        grid: &BucketGrid,
        mechanism: StepMechanism,
        orders: &[f64],
        threads: usize,
    ) -> Self {
        let m = orders.len().max(1);
        let mut values = vec![0.0; grid.len() * orders.len()];
        let rows_per_thread = grid.len().div_ceil(threads.max(1));
        std::thread::scope(|scope| {
            for (chunk_index, chunk) in values.chunks_mut(rows_per_thread * m).enumerate() {
                scope.spawn(move || {
                    for (offset, row) in chunk.chunks_mut(m).enumerate() {
                        let k = (chunk_index * rows_per_thread + offset) as u32;
                        if k > 0 {
                            let sigma_eff = grid.effective_sigma(mechanism.sigma(), k);
                            mechanism.rdp_orders(sigma_eff, orders, row);
                        }
                    }
                });
            }
        });
        Self {
            orders: orders.len(),
            values,
        }
    }

    /// The RDP vector of bucket `k`.
    pub fn row(&self, k: u32) -> &[f64] {
        let start = k as usize * self.orders;
        &self.values[start..start + self.orders]
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.values.len() / self.orders.max(1)
    }
}

/// Everything that determines a table, as exact bit patterns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TableKey {
    max_norm: u64,
    rounding: u64,
    kind: u8,
    q: u64,
    sigma: u64,
    orders: Vec<u64>,
}

impl TableKey {
    fn new(grid: &BucketGrid, mechanism: StepMechanism, orders: &[f64]) -> Self {
        let (kind, q, sigma) = match mechanism {
            StepMechanism::Poisson { q, sigma } => (0, q, sigma),
            StepMechanism::Gaussian { sigma } => (1, 1.0, sigma),
        };
        Self {
            max_norm: grid.max_norm().to_bits(),
            rounding: grid.rounding().to_bits(),
            kind,
            q: q.to_bits(),
            sigma: sigma.to_bits(),
            orders: orders.iter().map(|a| a.to_bits()).collect(),
        }
    }
}

/// A process-wide cache of tables, so each configuration is computed once.
#[derive(Debug, Default)]
pub struct TableCache {
    tables: Mutex<HashMap<TableKey, Arc<RdpTable>>>,
}

impl TableCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table for this configuration, computing it on first use.
    ///
    /// The lock is not held while computing, so two threads may compute the same
    /// table once each; both results are identical and the first one is kept.
    pub fn get(
        &self,
        grid: &BucketGrid,
        mechanism: StepMechanism,
        orders: &[f64],
    ) -> Arc<RdpTable> {
        let key = TableKey::new(grid, mechanism, orders);
        if let Some(t) = self.lock().get(&key) {
            return t.clone();
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let table = Arc::new(RdpTable::compute_with_threads(
            grid, mechanism, orders, threads,
        ));
        self.lock().entry(key).or_insert(table).clone()
    }

    /// Number of cached tables.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TableKey, Arc<RdpTable>>> {
        // A panic while holding the lock cannot leave the map inconsistent (inserts
        // are single operations), so a poisoned lock is safe to keep using.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::sgm::sgm_rdp;

    #[test]
    fn top_row_is_the_worst_case_and_rows_are_monotone() {
        let grid = BucketGrid::new(1.0, 0.01).unwrap();
        let orders = [1.5, 2.0, 8.0, 64.0];
        let mech = StepMechanism::Poisson {
            q: 0.01,
            sigma: 1.1,
        };
        let table = RdpTable::compute(&grid, mech, &orders);
        assert_eq!(table.buckets(), 101);
        assert!(table.row(0).iter().all(|&v| v == 0.0));
        for (j, &a) in orders.iter().enumerate() {
            assert_eq!(table.row(100)[j], sgm_rdp(0.01, 1.1, a));
            for k in 1..=100 {
                assert!(table.row(k)[j] >= table.row(k - 1)[j]);
            }
        }
    }

    #[test]
    fn threaded_table_is_bit_identical() {
        let grid = BucketGrid::new(1.0, 0.05).unwrap();
        let mech = StepMechanism::Poisson {
            q: 0.02,
            sigma: 0.9,
        };
        let orders = [1.5, 2.0, 7.0, 12.5];
        assert_eq!(
            RdpTable::compute(&grid, mech, &orders),
            RdpTable::compute_with_threads(&grid, mech, &orders, 3)
        );
    }

    #[test]
    fn cache_returns_the_same_table() {
        let cache = TableCache::new();
        let grid = BucketGrid::new(1.0, 0.1).unwrap();
        let mech = StepMechanism::Gaussian { sigma: 2.0 };
        let a = cache.get(&grid, mech, &[2.0, 4.0]);
        let b = cache.get(&grid, mech, &[2.0, 4.0]);
        assert!(Arc::ptr_eq(&a, &b));
        let _ = cache.get(&grid, mech, &[2.0, 5.0]);
        assert_eq!(cache.len(), 2);
        // Gaussian rows are exactly alpha v_k^2 / (2 sigma^2 C^2) (up to rounding-up).
        let v = 0.5f64;
        let expected = 4.0 * v * v / (2.0 * 4.0);
        assert!((a.row(5)[1] - expected).abs() <= 1e-11 * expected);
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
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

    /// The noise multiplier.
    pub fn sigma(&self) -> f64 {
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

    /// Bytes the table's values take on the heap.
    pub fn bytes(&self) -> usize {
        self.values.len() * std::mem::size_of::<f64>() + std::mem::size_of::<Self>()
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
    /// Bytes the key takes (the orders on the heap included).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.orders.len() * std::mem::size_of::<u64>()
    }

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

/// Default bound of a [`TableCache`]: 64 MiB, e.g. 128 tables of 1001 buckets at 64
/// orders or 1280 of 101 buckets. A ledger keeps its own tables alive, so the
/// bound only decides how often a configuration seen before is recomputed.
pub const DEFAULT_TABLE_CACHE_BYTES: usize = 64 << 20;

/// What a [`TableCache`] holds and has done, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCacheStats {
    /// Tables held.
    pub tables: usize,
    /// Bytes they take (values and keys), never above `bound`.
    pub bytes: usize,
    /// The bound in bytes.
    pub bound: usize,
    /// Tables dropped to stay within the bound, since the cache was created.
    pub evictions: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that computed a table.
    pub misses: u64,
}

#[derive(Debug)]
struct Entry {
    table: Arc<RdpTable>,
    bytes: usize,
    /// Tick of the latest lookup: the least recently used entry goes first.
    used: u64,
}

#[derive(Debug)]
struct Inner {
    tables: HashMap<TableKey, Entry>,
    bound: usize,
    bytes: usize,
    tick: u64,
    evictions: u64,
    hits: u64,
    misses: u64,
}

impl Inner {
    /// Drop least recently used tables until `extra` more bytes fit the bound.
    /// `O(entries)` per eviction, paid only on a miss (which computes a table,
    /// far more work than the scan).
    fn make_room(&mut self, extra: usize) {
        while self.bytes + extra > self.bound {
            let Some(oldest) = self
                .tables
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.tables.remove(&oldest) {
                self.bytes -= e.bytes;
                self.evictions += 1;
            }
        }
    }
}

/// A process-wide cache of tables, so each configuration is computed once while
/// it is in use, bounded in bytes with least-recently-used eviction.
///
/// Why a bound: a schedule that changes the noise multiplier at every step asks
/// for a new table at every step, and an unbounded cache would grow for ever.
/// Evicting never invalidates a ledger: ledgers hold their own `Arc<RdpTable>`
/// (in their prefix-sum segments), and a table computed again is bit-identical
/// (its computation is deterministic), so eviction changes only speed.
#[derive(Debug)]
pub struct TableCache {
    inner: Mutex<Inner>,
}

impl Default for TableCache {
    fn default() -> Self {
        Self::with_bound(DEFAULT_TABLE_CACHE_BYTES)
    }
}

impl TableCache {
    /// An empty cache with the default bound.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache holding at most `bound` bytes of tables.
    pub fn with_bound(bound: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                tables: HashMap::new(),
                bound,
                bytes: 0,
                tick: 0,
                evictions: 0,
                hits: 0,
                misses: 0,
            }),
        }
    }

    /// Change the bound, evicting at once what no longer fits.
    pub fn set_bound(&self, bound: usize) {
        let mut inner = self.lock();
        inner.bound = bound;
        inner.make_room(0);
    }

    /// The table for this configuration, computing it on first use (or after it
    /// was evicted). A table larger than the whole bound is computed and
    /// returned but not kept.
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
        {
            let mut inner = self.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some(e) = inner.tables.get_mut(&key) {
                e.used = tick;
                let table = e.table.clone();
                inner.hits += 1;
                return table;
            }
            inner.misses += 1;
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let table = Arc::new(RdpTable::compute_with_threads(
            grid, mechanism, orders, threads,
        ));
        let bytes = table.bytes() + key.bytes();
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(e) = inner.tables.get_mut(&key) {
            e.used = tick;
            return e.table.clone();
        }
        if bytes > inner.bound {
            return table;
        }
        inner.make_room(bytes);
        inner.bytes += bytes;
        inner.tables.insert(
            key,
            Entry {
                table: table.clone(),
                bytes,
                used: tick,
            },
        );
        table
    }

    /// Number of cached tables.
    pub fn len(&self) -> usize {
        self.lock().tables.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size, bound and counters.
    pub fn stats(&self) -> TableCacheStats {
        let inner = self.lock();
        TableCacheStats {
            tables: inner.tables.len(),
            bytes: inner.bytes,
            bound: inner.bound,
            evictions: inner.evictions,
            hits: inner.hits,
            misses: inner.misses,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change under the lock keeps `bytes` equal to the entries' sum
        // before it can panic (allocation failures abort), so a poisoned lock is
        // safe to keep using.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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

    fn gaussian(sigma: f64) -> StepMechanism {
        StepMechanism::Gaussian { sigma }
    }

    #[test]
    fn cache_evicts_the_least_recently_used_table() {
        let grid = BucketGrid::new(1.0, 0.1).unwrap();
        let orders = [2.0, 4.0];
        // Room for exactly three tables of this shape.
        let one = {
            let probe = TableCache::with_bound(usize::MAX);
            probe.get(&grid, gaussian(1.0), &orders);
            probe.stats().bytes
        };
        let cache = TableCache::with_bound(3 * one);
        let a = cache.get(&grid, gaussian(1.0), &orders);
        let _b = cache.get(&grid, gaussian(2.0), &orders);
        let _c = cache.get(&grid, gaussian(3.0), &orders);
        assert_eq!(cache.stats().bytes, 3 * one);
        // Touch a: b is now the least recently used.
        assert!(Arc::ptr_eq(&a, &cache.get(&grid, gaussian(1.0), &orders)));
        let _d = cache.get(&grid, gaussian(4.0), &orders);
        let stats = cache.stats();
        assert_eq!(
            (stats.tables, stats.bytes, stats.evictions),
            (3, 3 * one, 1)
        );
        // a and c stayed (same Arc), b was evicted (a new computation, equal values).
        assert!(Arc::ptr_eq(&a, &cache.get(&grid, gaussian(1.0), &orders)));
        let misses = cache.stats().misses;
        let _c2 = cache.get(&grid, gaussian(3.0), &orders);
        assert_eq!(cache.stats().misses, misses, "c was evicted");
        let b2 = cache.get(&grid, gaussian(2.0), &orders);
        assert_eq!(cache.stats().misses, misses + 1, "b was not evicted");
        assert_eq!(*b2, RdpTable::compute(&grid, gaussian(2.0), &orders));
        // Bringing b back evicted the least recently used: d.
        assert_eq!(cache.stats().evictions, 2);
        let _d2 = cache.get(&grid, gaussian(4.0), &orders);
        assert_eq!(cache.stats().misses, misses + 2, "d was evicted");
    }

    #[test]
    fn cache_never_exceeds_its_bound() {
        let grid = BucketGrid::new(1.0, 0.05).unwrap();
        let orders = [1.5, 2.0, 8.0];
        let cache = TableCache::with_bound(10_000);
        for i in 0..200 {
            let t = cache.get(&grid, gaussian(0.5 + i as f64 / 100.0), &orders);
            assert_eq!(t.buckets(), grid.len());
            let s = cache.stats();
            assert!(s.bytes <= s.bound, "{s:?}");
            assert!(s.tables >= 1);
        }
        assert!(cache.stats().evictions > 150);
        // Shrinking the bound evicts at once; a table over the bound is not kept.
        cache.set_bound(1);
        assert_eq!(cache.stats().bytes, 0);
        let t = cache.get(&grid, gaussian(1.0), &orders);
        assert_eq!(*t, RdpTable::compute(&grid, gaussian(1.0), &orders));
        assert!(cache.is_empty());
    }
}

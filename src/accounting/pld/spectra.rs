//! The bounded cache behind per-example PLD estimates ([`super::estimate`]):
//! per mechanism and grid, its MGFs (for planning windows) and its spectra at
//! the largest FFT size asked for, plus finished answers keyed by everything
//! they depend on. A spectrum of size `N` serves every power-of-two size
//! `n = N / s` below it: folding a PLD modulo `n` keeps every `s`-th frequency
//! of its size-`N` transform (`X_n[k] = X_N[s k]`), so one entry per level
//! serves histories of any length (the same value up to the transforms'
//! rounding, about 1e-16 of the largest modulus). One cache serves every
//! dataset: a level's spectrum depends only on `(q, sigma_eff)`, the grid and
//! the domain size, never on whose example asks.
//!
//! Bounded in bytes (`serve --estimate-cache-bytes`, default 128 MiB) with
//! least-recently-used eviction over all entries together (a linked hash map:
//! `O(1)` per lookup, insert and eviction). Evicting changes only speed: every
//! entry is recomputed on demand, and gives the same answers (up to the
//! rounding of the domain size it is built at). An answer is keyed by the
//! example's whole level history (each level's `(q, sigma_eff, steps)`), the
//! dataset's releases and delta, so a history that changes never meets an
//! answer computed before the change (invalidation by construction); answers of
//! histories that moved on age out.

use super::accountant::PldEvent;
use super::planner::LogMgf;
use super::spectrum::Spectrum;
use hashlink::LinkedHashMap;
use std::sync::{Arc, Mutex};

/// Default bound of the estimate cache (spectra, MGFs and answers together).
pub const DEFAULT_ESTIMATE_CACHE_BYTES: usize = 128 << 20;
/// Bytes counted per entry besides its payload (map node, key, `Arc` header).
const ENTRY_OVERHEAD: usize = 96;
/// Bytes of a [`Spectrum`] besides its vectors' contents.
const SPECTRUM_HEADER: usize = std::mem::size_of::<Spectrum>();

/// A mechanism without its count: what a cached spectrum is a spectrum of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MechanismKey {
    kind: u8,
    a: u64,
    b: u64,
}

impl MechanismKey {
    /// The key of `event`'s mechanism (its count left out).
    pub fn of(event: &PldEvent) -> Self {
        match *event {
            PldEvent::PoissonGaussian { q, sigma, .. } => Self {
                kind: 0,
                a: q.to_bits(),
                b: sigma.to_bits(),
            },
            PldEvent::Gaussian { sigma, .. } => Self {
                kind: 1,
                a: sigma.to_bits(),
                b: 0,
            },
            PldEvent::PureDp { epsilon, .. } => Self {
                kind: 2,
                a: epsilon.to_bits(),
                b: 0,
            },
        }
    }

    fn push_bits(&self, out: &mut Vec<u64>) {
        out.extend([self.kind as u64, self.a, self.b]);
    }
}

/// The key of a finished answer: delta and every event with its count.
pub fn answer_key(events: &[PldEvent], delta: f64) -> Box<[u64]> {
    let mut bits = Vec::with_capacity(1 + 4 * events.len());
    bits.push(delta.to_bits());
    for e in events {
        MechanismKey::of(e).push_bits(&mut bits);
        bits.push(match *e {
            PldEvent::PoissonGaussian { count, .. }
            | PldEvent::Gaussian { count, .. }
            | PldEvent::PureDp { count, .. } => count,
        });
    }
    bits.into_boxed_slice()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Mgfs(MechanismKey, u8),
    Spectra(MechanismKey, u8),
    Answer(Box<[u64]>),
}

/// A finished estimate: its epsilon and the grid it was composed on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    /// Epsilon at the key's delta.
    pub epsilon: f64,
    /// Grid spacing of the composition that gave it.
    pub value_discretization: f64,
}

#[derive(Debug, Clone)]
enum Value {
    Mgfs(Arc<[LogMgf; 2]>),
    Spectra(Arc<[Spectrum; 2]>),
    Answer(Answer),
}

#[derive(Debug)]
struct Entry {
    value: Value,
    bytes: usize,
}

/// What an [`EstimateCache`] holds and has done (the storage report and gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EstimateCacheStats {
    /// Spectrum pairs held (one per mechanism and grid, at the largest domain
    /// size asked for).
    pub spectra: usize,
    /// MGF pairs held (one per mechanism and grid).
    pub mgfs: usize,
    /// Finished answers held.
    pub answers: usize,
    /// Bytes held, never above `bound`.
    pub bytes: usize,
    /// The bound in bytes.
    pub bound: usize,
    /// Entries dropped to stay within the bound.
    pub evictions: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that computed their value.
    pub misses: u64,
}

#[derive(Debug)]
struct Inner {
    map: LinkedHashMap<Key, Entry>,
    stats: EstimateCacheStats,
}

impl Inner {
    fn make_room(&mut self, extra: usize) {
        while self.stats.bytes + extra > self.stats.bound {
            let Some((k, e)) = self.map.pop_front() else {
                break;
            };
            self.forget(&k, e.bytes);
            self.stats.evictions += 1;
        }
    }

    fn forget(&mut self, k: &Key, bytes: usize) {
        self.stats.bytes -= bytes;
        match k {
            Key::Mgfs(..) => self.stats.mgfs -= 1,
            Key::Spectra(..) => self.stats.spectra -= 1,
            Key::Answer(_) => self.stats.answers -= 1,
        }
    }

    fn insert(&mut self, key: Key, value: Value, bytes: usize) {
        if bytes > self.stats.bound {
            return; // larger than the whole bound: used once, not kept
        }
        if let Some(old) = self.map.remove(&key) {
            self.forget(&key, old.bytes);
        }
        self.make_room(bytes);
        self.stats.bytes += bytes;
        match key {
            Key::Mgfs(..) => self.stats.mgfs += 1,
            Key::Spectra(..) => self.stats.spectra += 1,
            Key::Answer(_) => self.stats.answers += 1,
        }
        self.map.insert(key, Entry { value, bytes });
    }
}

/// The cache; see the module docs. Computations run outside its lock (two
/// threads may compute the same entry once each; both are identical).
#[derive(Debug)]
pub struct EstimateCache {
    inner: Mutex<Inner>,
}

impl Default for EstimateCache {
    fn default() -> Self {
        Self::with_bound(DEFAULT_ESTIMATE_CACHE_BYTES)
    }
}

fn mgf_bytes(m: &[LogMgf; 2]) -> usize {
    m.iter()
        .map(|m| (m.upper.capacity() + m.lower.capacity()) * 8 + 48)
        .sum::<usize>()
        + ENTRY_OVERHEAD
}

fn spectra_bytes(s: &[Spectrum; 2]) -> usize {
    s.iter()
        .map(|s| (s.log_modulus.capacity() + s.phase.capacity()) * 8 + SPECTRUM_HEADER)
        .sum::<usize>()
        + ENTRY_OVERHEAD
}

impl EstimateCache {
    /// An empty cache holding at most `bound` bytes.
    pub fn with_bound(bound: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                map: LinkedHashMap::new(),
                stats: EstimateCacheStats {
                    bound,
                    ..EstimateCacheStats::default()
                },
            }),
        }
    }

    /// Change the bound, evicting at once what no longer fits.
    pub fn set_bound(&self, bound: usize) {
        let mut inner = self.lock();
        inner.stats.bound = bound;
        inner.make_room(0);
    }

    /// Drop every entry (tests and benchmarks measuring a cold cache).
    pub fn clear(&self) {
        let mut inner = self.lock();
        let bound = inner.stats.bound;
        inner.map.clear();
        inner.stats = EstimateCacheStats {
            bound,
            evictions: inner.stats.evictions,
            hits: inner.stats.hits,
            misses: inner.stats.misses,
            ..EstimateCacheStats::default()
        };
    }

    /// Size, bound and counters.
    pub fn stats(&self) -> EstimateCacheStats {
        self.lock().stats
    }

    /// The value at `key` if `usable`, counted as a hit; else `None`, counted
    /// as a miss when `count_miss`.
    fn lookup(
        &self,
        key: &Key,
        usable: impl FnOnce(&Value) -> bool,
        count_miss: bool,
    ) -> Option<Value> {
        let mut inner = self.lock();
        match inner.map.to_back(key).map(|e| e.value.clone()) {
            Some(v) if usable(&v) => {
                inner.stats.hits += 1;
                Some(v)
            }
            _ => {
                inner.stats.misses += u64::from(count_miss);
                None
            }
        }
    }

    /// A finished answer, if held.
    pub fn answer(&self, key: &[u64]) -> Option<Answer> {
        self.answer_counted(key, true)
    }

    /// As [`Self::answer`], a miss not counted: for a first look by a caller
    /// that computes through [`Self::answer`] next (one query, one miss).
    pub fn peek_answer(&self, key: &[u64]) -> Option<Answer> {
        self.answer_counted(key, false)
    }

    fn answer_counted(&self, key: &[u64], count_miss: bool) -> Option<Answer> {
        match self.lookup(&Key::Answer(key.into()), |_| true, count_miss) {
            Some(Value::Answer(a)) => Some(a),
            _ => None,
        }
    }

    /// Keep a finished answer.
    pub fn put_answer(&self, key: Box<[u64]>, answer: Answer) {
        let bytes = key.len() * 8 + ENTRY_OVERHEAD;
        self.lock()
            .insert(Key::Answer(key), Value::Answer(answer), bytes);
    }

    /// The MGFs of `mechanism` on grid `grid`, computed by `make` on a miss.
    pub fn mgfs<E>(
        &self,
        mechanism: MechanismKey,
        grid: u8,
        make: impl FnOnce() -> Result<[LogMgf; 2], E>,
    ) -> Result<Arc<[LogMgf; 2]>, E> {
        let key = Key::Mgfs(mechanism, grid);
        if let Some(Value::Mgfs(m)) = self.lookup(&key, |_| true, true) {
            return Ok(m);
        }
        let m = Arc::new(make()?);
        let bytes = mgf_bytes(&m);
        self.lock().insert(key, Value::Mgfs(m.clone()), bytes);
        Ok(m)
    }

    /// The spectra of `mechanism` on grid `grid` held at a domain size that is
    /// a power-of-two multiple of `n`, if any (a miss otherwise). They may keep
    /// fewer frequencies than a composition needs (see
    /// [`super::spectrum::live_bins`]); the caller then builds and
    /// [`Self::put_spectra`]s more.
    pub fn held_spectra(
        &self,
        mechanism: MechanismKey,
        grid: u8,
        n: usize,
    ) -> Option<Arc<[Spectrum; 2]>> {
        let serves = |v: &Value| match v {
            Value::Spectra(s) => s[0].size() >= n && s[0].size() % n == 0,
            _ => false,
        };
        match self.lookup(&Key::Spectra(mechanism, grid), serves, true) {
            Some(Value::Spectra(s)) => Some(s),
            _ => None,
        }
    }

    /// Count a held entry that could not serve its lookup (it kept too few
    /// frequencies) as a miss, not the hit it was counted as.
    pub fn note_short(&self) {
        let mut inner = self.lock();
        inner.stats.hits = inner.stats.hits.saturating_sub(1);
        inner.stats.misses += 1;
    }

    /// Keep `spectra` for `mechanism` on grid `grid`, replacing what was held.
    pub fn put_spectra(&self, mechanism: MechanismKey, grid: u8, spectra: Arc<[Spectrum; 2]>) {
        let bytes = spectra_bytes(&spectra);
        self.lock().insert(
            Key::Spectra(mechanism, grid),
            Value::Spectra(spectra),
            bytes,
        );
    }

    /// [`Self::held_spectra`], else the spectra `make` computes (kept).
    pub fn spectra<E>(
        &self,
        mechanism: MechanismKey,
        grid: u8,
        n: usize,
        make: impl FnOnce() -> Result<[Spectrum; 2], E>,
    ) -> Result<Arc<[Spectrum; 2]>, E> {
        if let Some(s) = self.held_spectra(mechanism, grid, n) {
            return Ok(s);
        }
        let s = Arc::new(make()?);
        self.put_spectra(mechanism, grid, s.clone());
        Ok(s)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change keeps `stats` equal to the entries before it can panic
        // (allocation failures abort), so a poisoned lock is safe to reuse.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(e: f64) -> Answer {
        Answer {
            epsilon: e,
            value_discretization: 1e-3,
        }
    }

    #[test]
    fn answers_are_evicted_least_recently_used_first_within_the_bound() {
        let one = 3 * 8 + ENTRY_OVERHEAD;
        let cache = EstimateCache::with_bound(3 * one);
        let key = |i: u64| vec![i, 1, 2].into_boxed_slice();
        for i in 0..3 {
            cache.put_answer(key(i), answer(i as f64));
        }
        assert_eq!(cache.answer(&key(0)), Some(answer(0.0))); // 0 is now the newest
        cache.put_answer(key(3), answer(3.0));
        let s = cache.stats();
        assert_eq!((s.answers, s.bytes, s.evictions), (3, 3 * one, 1));
        assert_eq!(cache.answer(&key(1)), None, "1 was the least recently used");
        assert!(cache.answer(&key(0)).is_some() && cache.answer(&key(3)).is_some());
        cache.set_bound(one);
        let s = cache.stats();
        assert_eq!((s.answers, s.bytes), (1, one));
        assert!(cache.answer(&key(0)).is_none());
    }

    #[test]
    fn one_spectrum_per_level_serves_every_smaller_size() {
        use crate::accounting::pld::DiscretePld;
        let pld = DiscretePld {
            step: 0.1,
            first: -1,
            probs: vec![0.5, 0.25, 0.25],
            infinity_mass: 0.0,
        };
        let pld = &pld;
        let make = |n: usize| move || Ok::<_, ()>([Spectrum::of(pld, n), Spectrum::of(pld, n)]);
        let key = MechanismKey {
            kind: 0,
            a: 1,
            b: 2,
        };
        let cache = EstimateCache::default();
        assert_eq!(cache.spectra(key, 0, 64, make(64)).unwrap()[0].size(), 64);
        // Smaller sizes: the held one, nothing built.
        let never = || -> Result<[Spectrum; 2], ()> { panic!("built again") };
        assert_eq!(cache.spectra(key, 0, 16, never).unwrap()[0].size(), 64);
        // Another grid is another level; a larger size replaces the entry.
        assert_eq!(cache.spectra(key, 1, 16, make(16)).unwrap()[0].size(), 16);
        assert_eq!(
            cache.spectra(key, 0, 128, make(128)).unwrap()[0].size(),
            128
        );
        let s = cache.stats();
        assert_eq!((s.spectra, s.hits, s.misses), (2, 1, 3));
        let held = 2 * ENTRY_OVERHEAD + 2 * 2 * (8 * (65 + 9) + SPECTRUM_HEADER);
        assert_eq!(s.bytes, held, "the replaced entry's bytes are released");
    }

    #[test]
    fn answer_keys_separate_counts_deltas_and_mechanisms() {
        let e = |q: f64, count| PldEvent::PoissonGaussian {
            q,
            sigma: 1.0,
            count,
        };
        let k = answer_key(&[e(0.1, 5)], 1e-5);
        assert_ne!(k, answer_key(&[e(0.1, 6)], 1e-5));
        assert_ne!(k, answer_key(&[e(0.1, 5)], 1e-6));
        assert_ne!(k, answer_key(&[e(0.2, 5)], 1e-5));
        assert_eq!(k, answer_key(&[e(0.1, 5)], 1e-5));
    }
}

//! The all-epsilons pass: every example's epsilon evaluated from its
//! compact form, for releases (through a view, `view.rs`) and
//! [`Ledger::epsilons`](super::Ledger::epsilons).
//!
//! # Bit for bit the per-example evaluation
//! The pass computes what [`Eval::own_into`] and [`Converter::epsilon`] compute
//! for one example, with the same floating-point operations in the same order for
//! every order `alpha`: the closed counts' products summed entry by entry from
//! zero and rounded up by the same factor, then the open run's prefix difference
//! (the same function), the release offset, and the conversion. Only the shape
//! of the code differs, so that it runs at memory speed:
//! - each run looks up every distinct `(segment, level)` pair's table row once
//!   (a few thousand references, indexed by pair id), so an entry costs one
//!   load instead of a pair lookup, a table pointer and a bounds check;
//! - the examples' lists (each its own allocation) are prefetched a few
//!   examples ahead;
//! - at the ledger's usual 64 orders the row is a fixed-size array held in
//!   registers (`[f64; 64]`) and the loops over the orders vectorise;
//! - on x86-64 processors with AVX-512 (or AVX2) the pass is compiled a second
//!   time for them and picked at run time. Rust never fuses a multiply and an
//!   add, so wider vectors change how many orders one instruction handles, not
//!   any value (`tests/ledger_memory.rs` compares the pass with the per-example
//!   query bit for bit).
//!
//! Any other number of orders, and shuffle mode's top-only examples (summed charge by charge) take the
//! per-example evaluation itself.

use super::columns::{ALL_TOP, RETIRED};
use super::compact::{At, Eval};
use super::levels::{entries, round_up_factor};
use crate::accounting::conversion::EpsilonAtOrder;
use crate::ledger::convert::Converter;
use std::ops::Range;

/// One pass's fixed inputs: the evaluation, the step it reads at, the release
/// offset and the conversion.
pub(super) struct Pass<'a> {
    pub(super) eval: Eval<'a>,
    pub(super) at: At,
    pub(super) release: &'a [f64],
    /// The release charges of examples left out of a release (`left_out.rs`),
    /// read instead of `release` for those.
    pub(super) shares: &'a super::left_out::ReleaseShares,
    pub(super) conv: &'a Converter,
    pub(super) bucket: &'a [u32],
    pub(super) flags: &'a [u8],
}

/// Examples ahead whose closed counts the pass prefetches (measured: 8 did
/// better than 4, 16, 32 or none on the training-like trace).
const PREFETCH_AHEAD: usize = 8;

/// Fewest examples a pass splits over threads (about 20 ms of work: a thread
/// costs tens of microseconds to start).
const PARALLEL_MIN: usize = 1 << 16;

/// Most threads one pass uses.
const MAX_THREADS: usize = 8;

/// The ledger's usual number of orders (`ledger_orders`), the one the pass is
/// specialised for.
const ORDERS: usize = 64;

impl Pass<'_> {
    /// Call `emit` with the epsilon of every example in `ids`, in order; `saved`
    /// gives the RDP row (releases not included) of an example that a view
    /// saved, which is used instead of its live state.
    pub(super) fn run<'s>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]>,
        emit: impl FnMut(EpsilonAtOrder),
    ) {
        let m = self.release.len();
        if m != ORDERS {
            return self.run_general(ids, saved, emit);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the processor supports AVX-512F (checked just above).
                return unsafe { self.run_avx512(ids, saved, emit) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the processor supports AVX2 (checked just above).
                return unsafe { self.run_avx2(ids, saved, emit) };
            }
        }
        self.run_fixed(ids, saved, emit)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_avx512<'s>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]>,
        emit: impl FnMut(EpsilonAtOrder),
    ) {
        self.run_fixed(ids, saved, emit)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2<'s>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]>,
        emit: impl FnMut(EpsilonAtOrder),
    ) {
        self.run_fixed(ids, saved, emit)
    }

    /// [`Pass::run`] over `ids`, each epsilon mapped by `map`, collected in
    /// order. A range of at least [`PARALLEL_MIN`] examples is split into
    /// contiguous shares over the machine's cores (at most [`MAX_THREADS`]):
    /// examples are independent, so the values are those of one thread. A
    /// release's chunks (a few hundred examples under the read lock) stay on
    /// their thread.
    pub(super) fn collect<'s, T: Send>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]> + Sync,
        map: impl Fn(EpsilonAtOrder) -> T + Sync,
    ) -> Vec<T> {
        let len = ids.len();
        let threads = if len < PARALLEL_MIN {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
        };
        if threads <= 1 {
            let mut out = Vec::with_capacity(len);
            self.run(ids, saved, |e| out.push(map(e)));
            return out;
        }
        let share = len.div_ceil(threads);
        let (saved, map) = (&saved, &map);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|k| {
                    let start = ids.start + (k * share).min(len);
                    let end = ids.start + ((k + 1) * share).min(len);
                    scope.spawn(move || {
                        let mut part = Vec::with_capacity(end - start);
                        self.run(start..end, saved, |e| part.push(map(e)));
                        part
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(len);
            for worker in workers {
                match worker.join() {
                    Ok(part) => out.extend(part),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            out
        })
    }

    /// The pass at exactly [`ORDERS`] orders, with every pair's row cached.
    #[inline(always)]
    fn run_fixed<'s>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]>,
        mut emit: impl FnMut(EpsilonAtOrder),
    ) {
        const M: usize = ORDERS;
        let release: &[f64; M] = self.release.try_into().expect("M orders");
        let levels = self.eval.levels;
        // Every pair's row, by pair id (its segment's table is there: the
        // ledger syncs its tables before a step numbers a pair of it).
        let rows: Vec<&[f64; M]> = (0..levels.pair_count() as u32)
            .map(|pid| {
                let (segment, level) = levels.pair(pid);
                let row = self.eval.tables[segment as usize].row(level);
                row.try_into().expect("M orders")
            })
            .collect();
        let (st, now) = match (self.eval.prefix, self.at) {
            (Some(p), At::Now(t)) => (p.index_of(t), t),
            (Some(p), At::Before(t)) => (p.index_before(t), t),
            (None, At::Now(t) | At::Before(t)) => (0, t),
        };
        for i in ids {
            levels.prefetch_list(i + PREFETCH_AHEAD);
            let mut acc = [0.0f64; M];
            if let Some(row) = saved(i) {
                acc.copy_from_slice(row);
            } else {
                let (b, f) = (self.bucket[i], self.flags[i]);
                match self.eval.prefix {
                    Some(prefix) if f & ALL_TOP != 0 && f & RETIRED == 0 => {
                        prefix.prefix_in(st, now, self.eval.top, &mut acc);
                    }
                    Some(prefix) => {
                        settle(levels.list(i), &rows, &mut acc);
                        if f & RETIRED == 0 {
                            prefix.difference_in(st, levels.run_start(i), now, b, &mut acc);
                        }
                    }
                    None if self.eval.shuffled_top_only(i).is_some() => {
                        self.eval.own_into(i, b, f, self.at, &mut acc);
                    }
                    None => settle(levels.list(i), &rows, &mut acc),
                }
            }
            match self.release_of(i) {
                None => {
                    for (a, &r) in acc.iter_mut().zip(release) {
                        *a += r;
                    }
                }
                Some(own) => {
                    for (a, &r) in acc.iter_mut().zip(own) {
                        *a += r;
                    }
                }
            }
            emit(self.conv.epsilon_fixed(&acc));
        }
    }

    /// The pass at any number of orders: the per-example evaluation.
    fn run_general<'s>(
        &self,
        ids: Range<usize>,
        saved: impl Fn(usize) -> Option<&'s [f64]>,
        mut emit: impl FnMut(EpsilonAtOrder),
    ) {
        let mut rdp = vec![0.0; self.release.len()];
        for i in ids {
            match saved(i) {
                Some(row) => rdp.copy_from_slice(row),
                None => self
                    .eval
                    .own_into(i, self.bucket[i], self.flags[i], self.at, &mut rdp),
            }
            for (o, &r) in rdp
                .iter_mut()
                .zip(self.release_of(i).unwrap_or(self.release))
            {
                *o += r;
            }
            emit(self.conv.epsilon(&rdp));
        }
    }
}

impl<'a> Pass<'a> {
    /// Example `i`'s own release charges, when it was left out of a release.
    #[inline(always)]
    fn release_of(&self, i: usize) -> Option<&'a [f64]> {
        self.shares.own(self.flags, i)
    }
}

/// `acc =` the closed counts of `list` as RDP, rounded up: bit for bit
/// `LevelHistory::settled_into` (the same products, summed in the same order
/// from zero, times the same factor), with pair `p`'s row at `rows[p]`.
/// The sum is a local array that nothing else sees, so that it stays in
/// registers over the entries (`acc` is passed on by reference afterwards).
#[inline(always)]
fn settle<const M: usize>(list: &[u32], rows: &[&[f64; M]], acc: &mut [f64; M]) {
    let mut sum = [0.0f64; M];
    for (pid, count) in entries(list) {
        let row = rows[pid as usize];
        let c = count as f64;
        for (a, &r) in sum.iter_mut().zip(row) {
            *a += c * r;
        }
    }
    if !list.is_empty() {
        let up = round_up_factor(list.len());
        for a in sum.iter_mut() {
            *a *= up;
        }
    }
    *acc = sum;
}

//! Per-example state as columns indexed by id (see the parent module's note on
//! storage): the flag bits, allocating the columns (refusing, not aborting, when
//! memory is short), backing them with huge pages, prefetching a report's rows,
//! and accounting for the memory held.

use super::{Accrual, Ledger};
use crate::ledger::error::LedgerError;
use crate::ledger::protocol::StepOutcome;

// Bits of `flags`.
/// Every charge so far was at the top bucket: the example's RDP is exactly the
/// worst case's `P(T)[K]` and its accumulator is not maintained.
pub(super) const ALL_TOP: u8 = 1;
/// Retired by the individual filter: bucket 0, accrues nothing.
pub(super) const RETIRED: u8 = 2;
/// Counted once in `over_budget`.
pub(super) const OVER_BUDGET: u8 = 4;
/// Scratch bit of batch validation (duplicate detection); always cleared again.
pub(super) const SEEN: u8 = 8;
/// In a received part of the step in progress.
pub(super) const PENDING: u8 = 16;
/// Left out of at least one release: its release charges are its share
/// class's (`left_out.rs`), not the dataset-wide offset.
pub(super) const LEFT_OUT: u8 = 32;

/// How many reports ahead the accrual loop prefetches per-example state. A report
/// touches a few small columns (flags, bucket, the level history's run start and
/// list header); at a million examples these are cache and TLB misses, so the
/// loop is bound by memory latency unless several examples' loads are in flight
/// at once.
pub(crate) const PREFETCH_AHEAD: usize = 16;

/// Ask the CPU to start loading `slice[index]` into cache (no effect if out of
/// range, or on targets other than x86_64).
#[inline(always)]
pub(super) fn prefetch<T>(slice: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(index) {
        // SAFETY: a prefetch is a hint without architectural effect (it cannot
        // fault); the pointer is to a live element of `slice`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (x as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, index);
}

/// A vector of `len` copies of `value`, or an error naming `examples` when the
/// allocation fails (a huge `n` must be refused, not abort the process).
pub(super) fn try_filled<T: Clone>(len: usize, value: T) -> Result<Vec<T>, LedgerError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        LedgerError::invalid(
            "examples",
            format!(
                "cannot allocate {} bytes of per-example state",
                len.saturating_mul(std::mem::size_of::<T>())
            ),
        )
    })?;
    advise_huge_pages(&mut v);
    v.resize(len, value);
    Ok(v)
}

/// Ask Linux to back a large, not yet touched buffer with transparent huge pages.
///
/// A step touches a few thousand random rows spread over hundreds of megabytes;
/// with 4 KiB pages nearly every row costs a TLB miss and a page walk (doubly
/// expensive under virtualisation), which the benchmark showed to be the largest
/// cost of a step. 2 MiB pages make the whole ledger fit the TLB. This is advice
/// only: where it is refused or unsupported nothing changes.
pub(super) fn advise_huge_pages<T>(v: &mut Vec<T>) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let lo = start.saturating_add(HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    let hi = start.saturating_add(bytes) / HUGE_PAGE * HUGE_PAGE;
    if hi > lo {
        madvise_huge(lo, hi - lo);
    }
}

#[cfg(target_os = "linux")]
pub(super) fn madvise_huge(addr: usize, len: usize) {
    // SAFETY: `addr..addr + len` lies inside a live allocation owned by the caller
    // and is page aligned; MADV_HUGEPAGE only changes how the kernel backs those
    // pages (contents are preserved). A failure (e.g. THP disabled) is harmless and
    // deliberately ignored.
    let _ = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
pub(super) fn madvise_huge(_addr: usize, _len: usize) {}

impl Ledger {
    /// Heap memory held by the ledger, in bytes (per-example columns, segments,
    /// filter queue, retry window and pending parts; shared tables not included).
    pub fn memory_bytes(&self) -> u64 {
        let mut bytes = self.bucket.capacity() * 4
            + self.since.capacity() * 8
            + self.flags.capacity()
            + self.seg_tables.capacity() * 8
            + self.release.capacity() * 8
            + self.shares.bytes()
            + self.discounts.bytes()
            + self.pld.bytes()
            + self.levels.bytes() as usize;
        bytes += match &self.accrual {
            Accrual::Poisson(p) => p.bytes(),
            Accrual::Shuffle(s) => s.bytes(),
        };
        if let Some(f) = &self.filter {
            bytes += f.bytes();
        }
        if let Some(v) = &self.view {
            bytes += v.bytes();
        }
        for rec in &self.history {
            for (_, out) in &rec.parts {
                bytes += outcome_bytes(out);
            }
        }
        if let Some(p) = &self.pending {
            for part in p.parts.iter().flatten() {
                bytes += part.ids.capacity() * 8
                    + part.norms.capacity() * 8
                    + outcome_bytes(&part.outcome);
            }
        }
        bytes as u64
    }
}

pub(super) fn outcome_bytes(out: &StepOutcome) -> usize {
    out.thresholds.capacity() * 8 + out.retired.capacity() * 8 + std::mem::size_of::<StepOutcome>()
}

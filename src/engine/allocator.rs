//! How freed memory goes back to the operating system.
//!
//! A paged-out dataset must leave memory for real, not only in the ledger's own
//! account. glibc's malloc serves a block above its *mmap threshold* with a
//! mapping of its own, unmapped on free; below it, from per-thread arenas,
//! which keep freed blocks. The threshold is adaptive: every time a mapped
//! block is freed it rises to that block's size (up to 32 MiB), so after the
//! first page-out a ledger's multi-megabyte columns, the snapshot's and the
//! archive's buffers all came from arenas and stayed there, fragmented.
//! `scripts/bench-archived-memory 30 200000` measured 80 MB resident for 30
//! paged-out runs that way (and a swing of ±10 MB from one page-out to the
//! next), against 19.8 MB with a fixed threshold: [`configure`] fixes it at
//! [`MMAP_THRESHOLD`] when the server starts, so every large buffer is its own
//! mapping and goes back whole, and [`return_free_memory`] trims what the
//! arenas hold after a page-out. A step's buffers (16 bytes per reported norm,
//! 64 KiB for a batch of 4,096) stay below the threshold, in the arenas.
//!
//! Both are glibc-only; elsewhere the allocator's own policy applies. An
//! operator's `MALLOC_MMAP_THRESHOLD_` in the environment is left to glibc.

/// Allocations of at least this many bytes get a mapping of their own.
pub const MMAP_THRESHOLD: usize = 256 * 1024;

/// Fix glibc's mmap threshold at [`MMAP_THRESHOLD`] (module note); returns
/// whether it did. Call once, before serving.
pub fn configure() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
            return false;
        }
        // SAFETY: mallopt only changes malloc's tuning, under glibc's own lock;
        // the value is within the range glibc accepts (at most 32 MiB).
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Give memory the arenas hold free back to the operating system (after a
/// page-out; module note).
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only returns free pages of the heap to the
        // kernel; it touches no live allocation and takes glibc's own locks.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_threshold() {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            assert!(configure());
        }
        return_free_memory();
    }
}

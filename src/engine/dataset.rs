//! One served dataset: its ledger, its release book and the flags that say
//! whether it may change (archived) and whether memory is current with the log
//! (stale). State derived per dataset from the log (the release book today; a
//! worst-case accountant or snapshots tomorrow) lives here, beside the ledger,
//! changed only under the ledger's write lock so that it stays in log order.

use super::book::ReleaseBook;
use super::error::EngineError;
use crate::ledger::{Ledger, PldWorstCase};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::RwLock;

/// One dataset (training run) served by this process.
#[derive(Debug)]
pub struct Dataset {
    /// Its id.
    pub id: String,
    /// Its ledger. Readers (queries) share; writers (steps) are exclusive.
    pub ledger: RwLock<Ledger>,
    /// Archived datasets are read-only.
    pub archived: AtomicBool,
    /// Set when memory may be behind the log (a change was persisted but could not
    /// be applied, or a commit's outcome is unknown and reloading failed). Writers
    /// reload from the log first; readers are refused until then.
    pub stale: AtomicBool,
    /// Releases, release budget, labels and policy. Changed only while the
    /// ledger's write lock is held (so releases and steps are ordered as in the
    /// log); read without it by viewers.
    pub book: std::sync::RwLock<ReleaseBook>,
    /// Recent PLD worst cases (spec §8), keyed by steps, releases and delta.
    pub(super) pld_cache: std::sync::Mutex<PldCache>,
    /// Level spectra for per-example PLD estimates (spec §8), built on demand.
    pub(super) estimate_cache:
        std::sync::Mutex<Option<std::sync::Arc<super::estimate::EstimateCache>>>,
}

impl Dataset {
    pub(super) fn new(id: &str, ledger: Ledger) -> Self {
        Dataset {
            id: id.to_string(),
            ledger: RwLock::new(ledger),
            archived: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            book: std::sync::RwLock::new(ReleaseBook::default()),
            pld_cache: std::sync::Mutex::new(PldCache::default()),
            estimate_cache: std::sync::Mutex::new(None),
        }
    }

    /// Refuse reads while memory may be behind the log.
    pub fn check_current(&self) -> Result<(), EngineError> {
        if self.stale.load(Ordering::Acquire) {
            return Err(EngineError::Unavailable(
                "this dataset is being reloaded from the log: retry shortly".to_string(),
            ));
        }
        Ok(())
    }

    /// Whether the dataset is archived (read-only).
    pub fn is_archived(&self) -> bool {
        self.archived.load(Ordering::Acquire)
    }

    /// Mark memory as possibly behind the log: the next writer reloads it.
    pub(super) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// The release book for reading; viewers never wait for the ledger's lock.
    pub(super) fn book_read(&self) -> std::sync::RwLockReadGuard<'_, ReleaseBook> {
        self.book.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The release book for writing; the caller holds the ledger's write lock.
    pub(super) fn book_write(&self) -> std::sync::RwLockWriteGuard<'_, ReleaseBook> {
        self.book.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// `(steps, releases, delta bits)`: what a PLD worst case depends on.
pub(super) type PldKey = (u64, u64, u64);

/// Recent PLD worst cases of one dataset (spec §8), newest last; filled and
/// read by `bounds.rs`.
#[derive(Debug, Default)]
pub struct PldCache {
    pub(super) entries: std::collections::VecDeque<(PldKey, Result<PldWorstCase, String>)>,
}

/// Whether `id` is an acceptable dataset id: 1–64 of `[A-Za-z0-9._-]`, and not
/// `.` or `..` (URL path navigation: such a dataset could not be addressed).
pub fn valid_dataset_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

//! One served dataset: its ledger, its release book and the flags that say
//! whether it may change (archived) and whether memory is current with the log
//! (stale). State derived per dataset from the log (the release book, the
//! records it was built from, the snapshot bookkeeping) lives here, beside the
//! ledger, changed only under the ledger's write lock so that it stays in log
//! order.

use super::book::ReleaseBook;
use super::error::EngineError;
use crate::ledger::{Ledger, PldWorstCase};
use crate::store::RecordKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::RwLock;

/// Whether records of this kind build the release book.
pub(super) fn is_book_record(kind: RecordKind) -> bool {
    matches!(
        kind,
        RecordKind::Release
            | RecordKind::BudgetChange
            | RecordKind::Labels
            | RecordKind::ReleasePolicy
    )
}

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
    /// Set while a background task reloads the stale dataset
    /// (`idempotency.rs`): one at a time.
    pub(super) healing: AtomicBool,
    /// Releases, release budget, labels and policy. Changed only while the
    /// ledger's write lock is held (so releases and steps are ordered as in the
    /// log), except the policy's last refusal, a status that is not in the log;
    /// read without it by viewers.
    pub book: std::sync::RwLock<ReleaseBook>,
    /// Recent PLD worst cases (spec §8), keyed by steps, releases and delta.
    pub(super) pld_cache: std::sync::Mutex<PldCache>,
    /// Sequence number of the last record of this dataset in memory (persisted,
    /// or replayed); a snapshot is taken at it.
    pub(super) last_seq: AtomicU64,
    /// The records that built the release book (budget, labels, policy,
    /// releases), as stored: a snapshot carries them so that loading it rebuilds
    /// the book through the same parsing as a replay of the log.
    pub(super) book_log: std::sync::Mutex<Vec<(RecordKind, Arc<[u8]>)>>,
    /// When and at which record the newest snapshot was taken, and how many
    /// records came since (the snapshot policy reads them).
    pub(super) snapshot: std::sync::Mutex<SnapshotMark>,
    /// Set while a snapshot of this dataset is being taken (one at a time).
    pub(super) snapshot_busy: AtomicBool,
    /// Releases take turns, a curator's and the policy's alike (each holds one
    /// view of the ledger while it computes, see `release_view.rs`). Shared so
    /// that a policy release's background task can own its turn.
    pub(super) release_turn: Arc<tokio::sync::Mutex<()>>,
    /// Held from the step that makes a policy release due until that release is
    /// published or refused (`policy.rs`): at most one policy release is
    /// computed at a time.
    pub(super) policy_in_flight: Arc<tokio::sync::Mutex<()>>,
    /// Set while a policy release that fell due during the previous one waits
    /// for it (`policy.rs`): further due releases coalesce into that one.
    pub(super) policy_deferred: AtomicBool,
    /// The lease epoch this copy was loaded under (cluster mode; 0 outside a
    /// cluster). Every record it persists carries it, so that the database
    /// refuses them once another node has taken the dataset over.
    pub(super) epoch: AtomicU64,
    /// Set while the ledger is paged out (`paging.rs`): the lock then holds a
    /// one-example placeholder, and whoever needs the ledger loads it first.
    pub(super) paged_out: AtomicBool,
    /// The archive its owners are answered from once it is paged out
    /// (archived datasets only, `archive.rs`).
    archive: std::sync::Mutex<Option<Archive>>,
    /// Examples and steps of the ledger when it was paged out, for the storage
    /// report (the placeholder in its place has one example).
    pub(super) paged_out_size: std::sync::Mutex<(u64, u64)>,
    /// When the dataset was last read or changed, in milliseconds since
    /// [`process_epoch`] (the paging policy reads it).
    last_touch: AtomicU64,
}

/// A complete archive of an archived dataset in the store (`archive.rs`): the
/// record it describes and what every answer shares.
#[derive(Debug, Clone)]
pub struct Archive {
    /// The dataset's last record when it was written.
    pub seq: u64,
    /// What every answer shares (a few kilobytes).
    pub summary: Arc<crate::ledger::ArchiveSummary>,
}

/// A fixed instant of this process, from which idle times are measured.
fn process_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since [`process_epoch`].
fn millis_now() -> u64 {
    process_epoch().elapsed().as_millis() as u64
}

/// The newest snapshot of a dataset, as far as this process knows.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotMark {
    /// Its sequence number (0: none).
    pub seq: u64,
    /// When this process wrote or loaded it (or started, if none).
    pub at: Instant,
    /// Records of the dataset applied since.
    pub records_since: u64,
}

impl Dataset {
    pub(super) fn new(id: &str, ledger: Ledger) -> Self {
        Dataset {
            id: id.to_string(),
            ledger: RwLock::new(ledger),
            archived: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            healing: AtomicBool::new(false),
            book: std::sync::RwLock::new(ReleaseBook::default()),
            pld_cache: std::sync::Mutex::new(PldCache::default()),
            last_seq: AtomicU64::new(0),
            book_log: std::sync::Mutex::new(Vec::new()),
            snapshot: std::sync::Mutex::new(SnapshotMark {
                seq: 0,
                at: Instant::now(),
                records_since: 0,
            }),
            snapshot_busy: AtomicBool::new(false),
            release_turn: Arc::new(tokio::sync::Mutex::new(())),
            policy_in_flight: Arc::new(tokio::sync::Mutex::new(())),
            policy_deferred: AtomicBool::new(false),
            paged_out: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            last_touch: AtomicU64::new(millis_now()),
            archive: std::sync::Mutex::new(None),
            paged_out_size: std::sync::Mutex::new((0, 0)),
        }
    }

    /// Note records of this dataset that are now in the log and (about to be)
    /// applied in memory: the last one's number, and the release book's sources.
    /// Called with the ledger's write lock held (or during recovery).
    pub(super) fn note_records(&self, seqs: &[u64], records: &[(RecordKind, &[u8])]) {
        if let Some(&last) = seqs.iter().max() {
            self.last_seq.fetch_max(last, Ordering::AcqRel);
        }
        let mut log = self.book_log.lock().unwrap_or_else(|e| e.into_inner());
        for (kind, payload) in records {
            if is_book_record(*kind) {
                log.push((*kind, Arc::from(*payload)));
            }
        }
        drop(log);
        self.snapshot_mark().records_since += seqs.len() as u64;
    }

    /// Its archive in the store, if one was written.
    pub fn archive(&self) -> Option<Archive> {
        self.archive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Note the archive written for it.
    pub(super) fn set_archive(&self, archive: Archive) {
        *self.archive.lock().unwrap_or_else(|e| e.into_inner()) = Some(archive);
    }

    /// Note a read or a change (the dataset is not idle).
    pub(super) fn touch(&self) {
        self.last_touch.store(millis_now(), Ordering::Relaxed);
    }

    /// How long since the dataset was last read or changed.
    pub fn idle_for(&self) -> std::time::Duration {
        let last = self.last_touch.load(Ordering::Relaxed);
        std::time::Duration::from_millis(millis_now().saturating_sub(last))
    }

    /// Whether the ledger is out of memory (loaded back on the next need).
    pub fn is_paged_out(&self) -> bool {
        self.paged_out.load(Ordering::Acquire)
    }

    /// Drop what is cached beside the ledger (PLD worst cases): it is rebuilt
    /// on demand. The estimates' cache is process-wide and keyed by content
    /// (`engine/estimate.rs`): nothing in it can go stale.
    pub(super) fn clear_caches(&self) {
        *self.pld_cache.lock().unwrap_or_else(|e| e.into_inner()) = PldCache::default();
    }

    /// The snapshot bookkeeping.
    pub(super) fn snapshot_mark(&self) -> std::sync::MutexGuard<'_, SnapshotMark> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Mark memory as possibly behind the log: the next writer reloads it (use
    /// `Engine::heal`, which also reloads it in the background at once).
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

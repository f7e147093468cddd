//! Snapshots of served datasets: the policy that says when, taking
//! one while steps keep flowing, pruning old ones, and loading the newest one
//! that verifies. The log stays the source of truth: a snapshot only saves
//! replaying the records it covers, and one that fails its checksum or does
//! not decode is skipped with a warning (an older one, or the log, is used).
//!
//! Taking a snapshot holds the dataset's *read* lock only while its state is
//! copied into bytes (about a memory copy of the ledger: ~0.1 s per 500 MB);
//! hashing and writing happen after the lock is released, in chunks that each
//! hold the database's write lock briefly.

use super::book::rebuild_book;
use super::dataset::Dataset;
use super::error::{EngineError, EngineResult};
use super::paging::PagingPolicy;
use super::snapshot_codec::{encode, read};
use super::Engine;
use crate::store::{SnapshotInfo, Store};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When the server takes snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotPolicy {
    /// Take one after this many records of a dataset (0: never by count).
    pub every_records: u64,
    /// Take one when a dataset has changed and its newest snapshot is this old
    /// (zero: never by age).
    pub every: Duration,
    /// Snapshots kept per dataset (older ones are deleted; pinned ones stay).
    pub keep: usize,
    /// How often the policy loop refreshes the storage gauges (`storage.rs`;
    /// each refresh scans the log's row headers once).
    pub gauges_every: Duration,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        Self {
            every_records: 10_000,
            every: Duration::from_secs(300),
            keep: 2,
            gauges_every: Duration::from_secs(30),
        }
    }
}

impl Engine {
    /// Datasets that changed since their newest snapshot and are due for one
    /// under `policy`.
    pub fn due_for_snapshot(&self, policy: &SnapshotPolicy) -> Vec<String> {
        let mut due = Vec::new();
        for entry in self.datasets.iter() {
            let mark = *entry.value().snapshot_mark();
            let by_count = policy.every_records > 0 && mark.records_since >= policy.every_records;
            let by_age = !policy.every.is_zero() && mark.at.elapsed() >= policy.every;
            if mark.records_since > 0 && (by_count || by_age) {
                due.push(entry.key().clone());
            }
        }
        due.sort();
        due
    }

    /// Every dataset with records not yet in a snapshot (for a clean shutdown).
    pub fn changed_since_snapshot(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .datasets
            .iter()
            .filter(|e| e.value().snapshot_mark().records_since > 0)
            .map(|e| e.key().clone())
            .collect();
        ids.sort();
        ids
    }

    /// Snapshot dataset `id` now and keep its `keep` newest snapshots: whether
    /// one was written (not when nothing changed since its newest snapshot, or
    /// another snapshot of it is being written).
    pub async fn snapshot(&self, id: &str, keep: usize) -> EngineResult<bool> {
        let ds = self.dataset(id)?;
        if ds.snapshot_busy.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        /// Clears the flag however the snapshot ends (the future may be dropped).
        struct Busy<'a>(&'a Dataset);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.snapshot_busy.store(false, Ordering::Release);
            }
        }
        let _busy = Busy(&ds);
        Ok(self.snapshot_now(&ds, keep).await?.is_some())
    }

    async fn snapshot_now(
        &self,
        ds: &Arc<Dataset>,
        keep: usize,
    ) -> EngineResult<Option<SnapshotInfo>> {
        let started = Instant::now();
        let copy = ds.clone();
        let encoded = tokio::task::spawn_blocking(move || {
            let ledger = copy.ledger.blocking_read();
            copy.check_current()?;
            let seq = copy.last_seq.load(Ordering::Acquire);
            let counted = copy.snapshot_mark().records_since;
            if counted == 0 || seq == 0 {
                return Ok(None);
            }
            let book = copy
                .book_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let bytes = encode(&copy.id, seq, copy.is_archived(), &book, &ledger);
            Ok::<_, EngineError>(Some((seq, counted, bytes)))
        })
        .await
        .map_err(|_| EngineError::Internal("snapshot task failed".into()))??;
        let Some((seq, counted, bytes)) = encoded else {
            return Ok(None);
        };
        let copied = started.elapsed();
        let store = self.store.clone();
        let id = ds.id.clone();
        let info = tokio::task::spawn_blocking(move || {
            let info = store.write_snapshot(&id, seq, &bytes)?;
            prune(store.as_ref(), &id, keep);
            Ok::<_, crate::store::StoreError>(info)
        })
        .await
        .map_err(|_| EngineError::Internal("snapshot task failed".into()))?
        .map_err(EngineError::store)?;
        {
            let mut mark = ds.snapshot_mark();
            mark.seq = seq;
            mark.at = Instant::now();
            mark.records_since = mark.records_since.saturating_sub(counted);
        }
        metrics::counter!("dpledger_snapshots_total").increment(1);
        metrics::histogram!("dpledger_snapshot_seconds").record(started.elapsed().as_secs_f64());
        tracing::info!(
            dataset = ds.id,
            seq,
            bytes = info.bytes,
            copy_seconds = copied.as_secs_f64(),
            seconds = started.elapsed().as_secs_f64(),
            "snapshot written"
        );
        Ok(Some(info))
    }
}

impl Engine {
    /// Take the snapshots `policy` asks for and page out the datasets `paging`
    /// says are idle, checking every second, and refresh the storage gauges
    /// (`storage.rs`), until the task is dropped. A
    /// failure is logged and retried at the next check (the log has everything;
    /// a missing snapshot only makes a restart slower).
    pub async fn run_snapshot_policy(&self, policy: SnapshotPolicy, paging: PagingPolicy) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gauges_at: Option<Instant> = None;
        loop {
            tick.tick().await;
            if gauges_at.is_none_or(|at| at.elapsed() >= policy.gauges_every) {
                self.export_storage_gauges().await;
                gauges_at = Some(Instant::now());
            }
            for id in self.due_for_snapshot(&policy) {
                if let Err(e) = self.snapshot(&id, policy.keep).await {
                    tracing::warn!(dataset = id, error = %e, "snapshot failed; will retry");
                }
            }
            self.page_out_idle(paging, policy.keep).await;
        }
    }

    /// Snapshot every dataset changed since its newest snapshot (clean shutdown:
    /// the next start then replays nothing). Returns how many were written.
    pub async fn snapshot_changed(&self, keep: usize) -> usize {
        let mut written = 0;
        for id in self.changed_since_snapshot() {
            match self.snapshot(&id, keep).await {
                Ok(true) => written += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(dataset = id, error = %e, "snapshot at shutdown failed"),
            }
        }
        written
    }
}

/// Delete all but the `keep` newest snapshots of `dataset` (pinned ones stay).
/// Failures are logged: an extra snapshot costs only space.
fn prune(store: &dyn Store, dataset: &str, keep: usize) {
    let all = match store.snapshots() {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!(dataset, error = %e, "cannot list snapshots to prune them");
            return;
        }
    };
    for old in all
        .iter()
        .filter(|s| s.dataset == dataset)
        .skip(keep.max(1))
        .filter(|s| !s.pinned)
    {
        if let Err(e) = store.delete_snapshot(old.id) {
            tracing::warn!(dataset, snapshot = old.id, error = %e, "cannot delete an old snapshot");
        }
    }
}

/// The newest of `candidates` (one dataset's, newest first) that reads back,
/// verifies and decodes, as a served dataset; each one skipped is logged.
pub(super) fn load_newest(
    store: &dyn Store,
    candidates: &[&SnapshotInfo],
) -> Option<(SnapshotInfo, Dataset)> {
    for info in candidates {
        let started = Instant::now();
        match load(store, info) {
            Ok(ds) => {
                tracing::info!(
                    dataset = info.dataset,
                    seq = info.seq,
                    bytes = info.bytes,
                    seconds = started.elapsed().as_secs_f64(),
                    "snapshot loaded"
                );
                return Some(((*info).clone(), ds));
            }
            Err(e) => {
                metrics::counter!("dpledger_snapshots_skipped_total").increment(1);
                tracing::warn!(
                    dataset = info.dataset,
                    snapshot = info.id,
                    seq = info.seq,
                    error = %e,
                    "skipping a snapshot that does not verify; using an older one or the log"
                );
            }
        }
    }
    None
}

/// Chunks queued between the store's reader and the decoder.
const CHUNKS_IN_FLIGHT: usize = 2;

/// One snapshot as a served dataset. The store reads and hashes its chunks on
/// one thread while this one decodes them as they come: a restart costs about
/// the longer of the two, and no copy of the whole snapshot is ever held (at a
/// million examples that copy was half a gigabyte of fresh memory, which cost
/// more to fault in than to read). What was decoded is used only if the store
/// then verifies every chunk, the length and the SHA-256; the decoder bounds
/// every allocation by the recorded length, so unverified bytes cannot make it
/// allocate more than the snapshot's size.
fn load(store: &dyn Store, info: &SnapshotInfo) -> Result<Dataset, String> {
    std::thread::scope(|scope| {
        let (chunks, received) = std::sync::mpsc::sync_channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
        // Decoded chunks come back to be filled again: a few chunks' worth of
        // memory is faulted in, not the snapshot's (engine::allocator).
        let (spent, recycled) = std::sync::mpsc::channel::<Vec<u8>>();
        let reading = std::thread::Builder::new()
            .name("dpledger-snapshot-read".into())
            .spawn_scoped(scope, move || {
                store.read_snapshot_chunks(info, &mut move |chunk| {
                    let mut buffer = recycled.try_recv().unwrap_or_default();
                    buffer.clear();
                    buffer.extend_from_slice(chunk);
                    chunks
                        .send(buffer)
                        .map_err(|_| crate::store::StoreError::Backend {
                            store: store.describe(),
                            detail: "the snapshot's decoder stopped".into(),
                        })
                })
            })
            .map_err(|e| format!("cannot start the snapshot reader: {e}"))?;
        // The receiver is dropped with the reader, so a decoder that stops
        // early also stops the store's read.
        let decoded = decode(
            info,
            &mut ChunkReader {
                chunks: received,
                spent,
                current: Vec::new(),
                at: 0,
            },
        );
        let verified = reading
            .join()
            .map_err(|_| "the snapshot reader panicked".to_string())?;
        // A corrupt snapshot is reported as such, whatever the decoder said.
        verified.map_err(|e| e.to_string())?;
        decoded
    })
}

/// The chunks the store sends, as one stream of bytes.
struct ChunkReader {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    /// Where read chunks go back to the store's reader, to be filled again.
    spent: std::sync::mpsc::Sender<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.recv() {
                Ok(next) => {
                    let read = std::mem::replace(&mut self.current, next);
                    self.at = 0;
                    // The reader may have finished: the buffer is then freed.
                    let _ = self.spent.send(read);
                }
                Err(_) => return Ok(0), // the store has sent everything
            }
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A served dataset from a snapshot's bytes (`reader` yields them all).
fn decode(info: &SnapshotInfo, reader: &mut ChunkReader) -> Result<Dataset, String> {
    let image = read(reader, info.bytes)?;
    if image.dataset != info.dataset || image.seq != info.seq {
        return Err(format!(
            "the snapshot holds dataset {:?} at seq {}, its catalogue row says {:?} at {}",
            image.dataset, image.seq, info.dataset, info.seq
        ));
    }
    let book = rebuild_book(&image.ledger, &image.book)?;
    let ds = Dataset::new(&image.dataset, image.ledger);
    ds.archived.store(image.archived, Ordering::Release);
    *ds.book_write() = book;
    *ds.book_log.lock().unwrap_or_else(|e| e.into_inner()) = image.book;
    ds.last_seq.store(image.seq, Ordering::Release);
    ds.snapshot_mark().seq = image.seq;
    Ok(ds)
}

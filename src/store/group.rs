//! Group commit: one writer thread per store that turns many concurrent appends
//! into few durable transactions.
//!
//! Why: a durable commit costs one fsync (0.1–10 ms depending on the disk), and a
//! database allows one writer at a time anyway. With a transaction per call, N
//! concurrent trainers would queue for N fsyncs. Here every `append` validates and
//! checksums its records on the caller's thread, sends them with a private reply
//! channel to the writer, and blocks. The writer takes the first pending request,
//! then everything else already queued (no waiting: a group forms naturally while
//! the previous commit is being synced), up to [`MAX_GROUP_RECORDS`] records or
//! [`MAX_GROUP_BYTES`] bytes; it runs them in one transaction, each request isolated
//! by a SAVEPOINT (PostgreSQL first tries the whole group in one statement and
//! falls back to per-request savepoints only when something is refused), commits
//! once and answers every caller. A request that fails inside its savepoint (a
//! duplicate step) is rolled back alone; a failure of the transaction itself is
//! reported to every caller of the group.
//!
//! The queue is bounded ([`QUEUE_DEPTH`] requests) so that a stalled database pushes
//! back on callers instead of buffering without limit. Dropping the store closes
//! the queue; the writer finishes what is queued, then exits and is joined.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Instant;

use super::{prepare_keyed, IdempotencyKey, Prepared, Record, StoreError};

/// Most records committed in one transaction.
pub(crate) const MAX_GROUP_RECORDS: usize = 8192;
/// Most payload bytes committed in one transaction (a single larger request is
/// still committed, alone).
pub(crate) const MAX_GROUP_BYTES: usize = 32 << 20;
/// Requests waiting for the writer before callers block on sending.
const QUEUE_DEPTH: usize = 4096;

/// The outcome for one caller's batch: its sequence numbers, or why it was refused.
pub(crate) type BatchResult = Result<Vec<u64>, StoreError>;

/// A database that can commit a group of batches.
pub(crate) trait Backend: Send + 'static {
    /// Stores each batch inside its own savepoint of one transaction, numbering the
    /// records after the store's last sequence number, and commits. Returns one
    /// result per batch, in order; `Err` means the whole transaction failed.
    fn commit_group(&mut self, batches: &[&[Prepared]]) -> Result<Vec<BatchResult>, StoreError>;
}

struct Request {
    batch: Vec<Prepared>,
    bytes: usize,
    reply: SyncSender<BatchResult>,
}

/// Handle to a store's writer thread.
pub(crate) struct GroupWriter {
    store: String,
    queue: Option<SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl GroupWriter {
    /// Starts the writer thread, runs `init` on it to build the backend (connecting
    /// and checking the database there, away from any async runtime), and returns
    /// once `init` has succeeded, or with its error.
    pub fn spawn<B, F>(store: String, init: F) -> Result<GroupWriter, StoreError>
    where
        B: Backend,
        F: FnOnce() -> Result<B, StoreError> + Send + 'static,
    {
        let (queue, requests) = sync_channel::<Request>(QUEUE_DEPTH);
        let (ready_tx, ready_rx) = sync_channel::<Result<(), StoreError>>(1);
        let thread = std::thread::Builder::new()
            .name("dpledger-store-writer".into())
            .spawn(move || match init() {
                Ok(backend) => {
                    let _ = ready_tx.send(Ok(()));
                    drop(ready_tx);
                    run(backend, requests);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| StoreError::Backend {
                store: store.clone(),
                detail: format!("cannot start the writer thread: {e}"),
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(GroupWriter {
                store,
                queue: Some(queue),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StoreError::Backend {
                    store,
                    detail: "the writer thread stopped while opening the store".into(),
                })
            }
        }
    }

    /// Validates `records` (and `key`, stored with the first), queues them and
    /// waits for the group commit.
    pub fn append(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
    ) -> Result<Vec<u64>, StoreError> {
        self.append_with_epoch(records, key, None)
    }

    /// [`GroupWriter::append`] with every record carrying the writer's lease
    /// `epoch` (cluster mode: the database fences a stale one).
    pub fn append_with_epoch(
        &self,
        records: Vec<Record>,
        key: Option<IdempotencyKey>,
        epoch: Option<u64>,
    ) -> Result<Vec<u64>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = prepare_keyed(records, key)?;
        for p in &mut batch {
            p.epoch = epoch;
        }
        let bytes = batch
            .iter()
            .map(|p| p.record.payload.len() + p.record.dataset.len())
            .sum();
        let (reply, answer) = sync_channel(1);
        let closed = |detail: &str| StoreError::Closed {
            store: self.store.clone(),
            detail: detail.to_string(),
        };
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| closed("the store is shutting down"))?;
        queue
            .send(Request {
                batch,
                bytes,
                reply,
            })
            .map_err(|_| closed("the writer thread has stopped; nothing was written"))?;
        answer.recv().map_err(|_| StoreError::OutcomeUnknown {
            store: self.store.clone(),
            detail: "the writer thread stopped before answering".into(),
        })?
    }
}

impl Drop for GroupWriter {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run<B: Backend>(mut backend: B, requests: Receiver<Request>) {
    let mut carried: Option<Request> = None;
    loop {
        let first = match carried.take() {
            Some(r) => r,
            None => match requests.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        let mut records = first.batch.len();
        let mut bytes = first.bytes;
        let mut group = vec![first];
        while records < MAX_GROUP_RECORDS && bytes < MAX_GROUP_BYTES {
            match requests.try_recv() {
                Ok(r) => {
                    if records + r.batch.len() > MAX_GROUP_RECORDS
                        || bytes + r.bytes > MAX_GROUP_BYTES
                    {
                        carried = Some(r);
                        break;
                    }
                    records += r.batch.len();
                    bytes += r.bytes;
                    group.push(r);
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
        let started = Instant::now();
        let outcome = {
            let batches: Vec<&[Prepared]> = group.iter().map(|r| r.batch.as_slice()).collect();
            backend.commit_group(&batches)
        };
        let seconds = started.elapsed().as_secs_f64();
        metrics::counter!("dpledger_store_commits_total").increment(1);
        metrics::histogram!("dpledger_store_group_requests").record(group.len() as f64);
        metrics::histogram!("dpledger_store_group_records").record(records as f64);
        metrics::histogram!("dpledger_store_commit_seconds").record(seconds);
        tracing::trace!(
            requests = group.len(),
            records,
            bytes,
            seconds,
            "group commit"
        );
        match outcome {
            Ok(results) => {
                // One result per request; a request left without one (a backend bug)
                // sees its reply channel close and reports OutcomeUnknown.
                for (request, result) in group.into_iter().zip(results) {
                    let _ = request.reply.send(result);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, requests = group.len(), "group commit failed");
                for request in group {
                    let _ = request.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

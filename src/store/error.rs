//! What the store can refuse or fail with ([`StoreError`]), in one place for
//! both backends, so that callers map every outcome the same way.

/// Everything the store can refuse or fail with. Messages name the store (path or
/// redacted URL) and, where it applies, the sequence number; they never contain a
/// password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The URL names no supported backend or is malformed.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store's content is damaged: a file that is not a SQLite database, a
    /// failed integrity check, a checksum mismatch, a gap in the sequence, a lost
    /// tail. Nothing is loaded from a corrupt store; restore it from a backup.
    #[error("store {store} is corrupt{}: {detail}", at_seq(.seq))]
    Corrupt {
        /// The store (file path or redacted URL).
        store: String,
        /// The row concerned, when one is.
        seq: Option<u64>,
        /// What was found.
        detail: String,
    },
    /// The location holds something that is not a dpledger store (a foreign SQLite
    /// database, tables without metadata). Refused rather than modified.
    #[error("{store} is not a dpledger store: {detail}")]
    NotAStore {
        /// The store (file path or redacted URL).
        store: String,
        /// Why.
        detail: String,
    },
    /// The store was written by a newer dpledger with a schema this build cannot
    /// read safely.
    #[error(
        "store {store} has schema version {found}, newer than version {supported} which this \
         build supports: run a newer dpledger"
    )]
    NewerSchema {
        /// The store (file path or redacted URL).
        store: String,
        /// Version found in the store.
        found: u64,
        /// Version this build supports ([`SCHEMA_VERSION`](super::SCHEMA_VERSION)).
        supported: u64,
    },
    /// A [`RecordKind::StepPart`](super::RecordKind::StepPart) with this
    /// `(dataset, step, part)` is already stored (by this or another process, or
    /// twice in the same call). Nothing of the call was written.
    #[error("step {step}{} of dataset {dataset:?} is already stored", part_suffix(.part))]
    Duplicate {
        /// The dataset.
        dataset: String,
        /// The step.
        step: u64,
        /// The part (`None`: the whole step, which shares part 0's key).
        part: Option<u32>,
    },
    /// The idempotency key is already stored for this dataset (an earlier try of
    /// the change, by this or another process); nothing of the call was written.
    #[error("idempotency key {key:?} of dataset {dataset:?} is already stored")]
    KeyUsed {
        /// The dataset.
        dataset: String,
        /// The key.
        key: String,
    },
    /// A record of the call cannot be stored as given; nothing of the call was
    /// written.
    #[error("record {index} of the append cannot be stored: {reason}")]
    InvalidRecord {
        /// Position of the record in the call's `Vec`.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The database failed (I/O error, disk full, connection lost, server down).
    /// Transient failures may succeed on retry.
    #[error("store {store}: {detail}")]
    Backend {
        /// The store (file path or redacted URL).
        store: String,
        /// What failed.
        detail: String,
    },
    /// The commit failed in a way that leaves its outcome unknown (an I/O error or a
    /// lost connection during COMMIT, or the writer stopped before answering): the
    /// records may or may not be durable. See the [module documentation](super).
    #[error("store {store}: the append may or may not have been stored: {detail}")]
    OutcomeUnknown {
        /// The store (file path or redacted URL).
        store: String,
        /// What failed.
        detail: String,
    },
    /// The store's writer thread is gone (the store is shutting down, or the
    /// thread could not run).
    #[error("store {store} is closed: {detail}")]
    Closed {
        /// The store.
        store: String,
        /// Why it is closed.
        detail: String,
    },
    /// The write was fenced (cluster mode): the writer's lease epoch for this
    /// dataset is no longer the current one (another node took the dataset over),
    /// so the database refused every record of the call. Nothing was written; the
    /// writer must stop serving the dataset.
    #[error("store {store}: the write to dataset {dataset:?} was fenced: {detail}")]
    Fenced {
        /// The store (redacted URL).
        store: String,
        /// The dataset whose lease moved.
        dataset: String,
        /// The database's explanation (the epochs).
        detail: String,
    },
    /// For [`Store::load`](super::Store::load) visitors: the application refused
    /// a record while replaying it, which means the log and the code disagree.
    #[error("replaying record seq {seq} failed: {detail}")]
    Replay {
        /// The record refused.
        seq: u64,
        /// Why.
        detail: String,
    },
}

fn at_seq(seq: &Option<u64>) -> String {
    seq.map(|s| format!(" at seq {s}")).unwrap_or_default()
}

fn part_suffix(part: &Option<u32>) -> String {
    match part {
        Some(p) => format!(" part {p}"),
        None => String::new(),
    }
}

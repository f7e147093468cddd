//! Rows on their way in and out of a backend: records validated and
//! checksummed before the writer thread sees them ([`prepare`]), rows verified
//! in order as they are read back ([`RowChecker`]: known kind, values in range,
//! checksum, contiguous sequence numbers), and the reader thread that feeds a
//! visitor while the next rows are read ([`pipelined_load`]). Shared by the
//! SQLite and PostgreSQL backends so both check exactly the same things.

use super::{
    record_checksum, LoadStats, Record, RecordKind, StoreError, StoredRecord, MAX_DATASET_BYTES,
    MAX_PAYLOAD_BYTES,
};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

/// A record checked for storage, with its checksum computed on the caller's
/// thread (the writer thread is the serial bottleneck, so it does no hashing).
pub(crate) struct Prepared {
    pub record: Record,
    pub crc: u32,
    /// The writer's lease epoch for the record's dataset (cluster mode, see
    /// `store::cluster`); `None` outside a cluster.
    pub epoch: Option<u64>,
    /// The idempotency key of the call, on its first record only: stored with it,
    /// in the same savepoint.
    pub key: Option<super::IdempotencyKey>,
}

impl Prepared {
    /// The step as stored (validated to fit in `i64`).
    pub fn step_i64(&self) -> Option<i64> {
        self.record.step.map(|s| s as i64)
    }

    /// The part as stored.
    pub fn part_i64(&self) -> Option<i64> {
        self.record.part.map(i64::from)
    }

    /// The error for a unique-index violation by this record.
    pub fn duplicate(&self) -> StoreError {
        StoreError::Duplicate {
            dataset: self.record.dataset.clone(),
            step: self.record.step.unwrap_or(0),
            part: self.record.part,
        }
    }

    /// The error for a violation of the idempotency table's key by this record's key.
    pub fn key_used(&self) -> StoreError {
        StoreError::KeyUsed {
            dataset: self.record.dataset.clone(),
            key: self.key.as_ref().map(|k| k.key.clone()).unwrap_or_default(),
        }
    }

    /// The unique key of a step record: `(dataset, step, part or 0)`.
    pub fn step_key(&self) -> Option<(&str, u64, u32)> {
        match (self.record.kind, self.record.step) {
            (RecordKind::StepPart, Some(step)) => {
                Some((&self.record.dataset, step, self.record.part.unwrap_or(0)))
            }
            _ => None,
        }
    }
}

/// Validates a call's records and computes their checksums.
pub(crate) fn prepare(records: Vec<Record>) -> Result<Vec<Prepared>, StoreError> {
    let mut out = Vec::with_capacity(records.len());
    for (index, record) in records.into_iter().enumerate() {
        let invalid = |reason: String| StoreError::InvalidRecord { index, reason };
        if record.dataset.len() > MAX_DATASET_BYTES {
            return Err(invalid(format!(
                "dataset name is {} bytes, the limit is {MAX_DATASET_BYTES}",
                record.dataset.len()
            )));
        }
        if record.dataset.contains('\0') {
            return Err(invalid("dataset name contains a NUL character".into()));
        }
        if let Some(step) = record.step {
            if step > i64::MAX as u64 {
                return Err(invalid(format!(
                    "step {step} exceeds the largest storable step {}",
                    i64::MAX
                )));
            }
        }
        if record.kind == RecordKind::StepPart && record.step.is_none() {
            return Err(invalid("a StepPart record needs a step number".into()));
        }
        if record.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(invalid(format!(
                "payload is {} bytes, the limit is {MAX_PAYLOAD_BYTES}",
                record.payload.len()
            )));
        }
        let crc = record_checksum(&record);
        out.push(Prepared {
            record,
            crc,
            epoch: None,
            key: None,
        });
    }
    Ok(out)
}

/// [`prepare`], with `key` checked and attached to the first record.
pub(crate) fn prepare_keyed(
    records: Vec<Record>,
    key: Option<super::IdempotencyKey>,
) -> Result<Vec<Prepared>, StoreError> {
    let mut out = prepare(records)?;
    if let (Some(key), Some(first)) = (key, out.first_mut()) {
        let invalid = |reason: String| StoreError::InvalidRecord { index: 0, reason };
        if !super::valid_key(&key.key) {
            return Err(invalid(format!(
                "idempotency key must be 1 to {} visible ASCII characters",
                crate::ledger::idempotency::MAX_KEY_BYTES
            )));
        }
        if key.answer.len() > super::idempotency::MAX_ANSWER_BYTES {
            return Err(invalid(format!(
                "the answer stored with an idempotency key is {} bytes, the limit is {}",
                key.answer.len(),
                super::idempotency::MAX_ANSWER_BYTES
            )));
        }
        first.key = Some(key);
    }
    Ok(out)
}

/// One row as read from a database, before verification. Integers are the raw
/// stored values so that out-of-range content is reported, not wrapped.
pub(crate) struct RawRow {
    pub seq: i64,
    pub dataset: Result<String, String>,
    pub kind: i64,
    pub step: Option<i64>,
    pub part: Option<i64>,
    pub payload: Vec<u8>,
    pub crc: i64,
}

/// Verifies rows in order: known kind, values in range, checksum, and sequence
/// numbers 1, 2, 3, ... ending at the recorded last number.
pub(crate) struct RowChecker {
    store: String,
    expected: u64,
    /// Per dataset, the last sequence number a compaction emptied.
    compacted: std::collections::HashMap<String, u64>,
}

impl RowChecker {
    #[cfg(test)]
    pub fn new(store: String) -> Self {
        Self::resuming(store, 0, Vec::new())
    }

    /// A checker for the rows after `after`, skipping rows emptied by `compactions`.
    pub fn resuming(store: String, after: u64, compactions: Vec<(String, u64)>) -> Self {
        RowChecker {
            store,
            expected: after + 1,
            compacted: compactions.into_iter().collect(),
        }
    }

    /// Whether a compaction emptied the payload of row `seq` of `dataset`.
    pub fn is_compacted(&self, dataset: &str, seq: u64) -> bool {
        self.compacted.get(dataset).is_some_and(|&upto| seq <= upto)
    }

    fn corrupt(&self, seq: Option<u64>, detail: String) -> StoreError {
        StoreError::Corrupt {
            store: self.store.clone(),
            seq,
            detail,
        }
    }

    /// The sequence number of the last row accepted (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.expected - 1
    }

    /// Checks one row and turns it into a record; `None` for a row a compaction
    /// emptied (its number counts, its content is gone).
    pub fn check(&mut self, row: RawRow) -> Result<Option<StoredRecord>, StoreError> {
        let expected = self.expected;
        let seq = u64::try_from(row.seq)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| self.corrupt(None, format!("invalid sequence number {}", row.seq)))?;
        if seq != expected {
            let detail = if seq > expected {
                format!(
                    "records {expected}..={} are missing (found seq {seq} after seq {})",
                    seq - 1,
                    expected - 1
                )
            } else {
                format!("seq {seq} appears after seq {}", expected - 1)
            };
            return Err(self.corrupt(Some(seq), detail));
        }
        let bad = |what: String| self.corrupt(Some(seq), what);
        let dataset = row
            .dataset
            .map_err(|e| bad(format!("dataset column: {e}")))?;
        let kind = u8::try_from(row.kind)
            .ok()
            .and_then(RecordKind::from_code)
            .ok_or_else(|| bad(format!("unknown record kind {}", row.kind)))?;
        let step = match row.step {
            None => None,
            Some(s) => Some(u64::try_from(s).map_err(|_| bad(format!("negative step {s}")))?),
        };
        let part = match row.part {
            None => None,
            Some(p) => {
                Some(u32::try_from(p).map_err(|_| bad(format!("part {p} is out of range")))?)
            }
        };
        let stored_crc = u32::try_from(row.crc)
            .map_err(|_| bad(format!("checksum column holds {}, not a CRC-32", row.crc)))?;
        if row.payload.is_empty() && self.is_compacted(&dataset, seq) {
            self.expected += 1;
            return Ok(None);
        }
        let record = Record {
            dataset,
            kind,
            step,
            part,
            payload: row.payload,
        };
        let computed = record_checksum(&record);
        if computed != stored_crc {
            return Err(bad(format!(
                "checksum mismatch: row says {stored_crc:#010x}, content (dataset {:?}, kind {:?}, \
                 step {:?}, part {:?}, {} payload bytes) has {computed:#010x}",
                record.dataset,
                record.kind,
                record.step,
                record.part,
                record.payload.len()
            )));
        }
        self.expected += 1;
        Ok(Some(StoredRecord { seq, record }))
    }

    /// Checks one row of a single dataset's records (no contiguity: other
    /// datasets' rows lie in between); a compacted row is corruption here.
    pub fn check_unordered(&mut self, row: RawRow) -> Result<StoredRecord, StoreError> {
        let seq = row.seq;
        self.expected = u64::try_from(seq).unwrap_or(0).max(1);
        match self.check(row)? {
            Some(record) => Ok(record),
            None => Err(self.corrupt(
                u64::try_from(seq).ok(),
                "the record was emptied by a compaction: read the dataset from its \
                 pinned snapshot"
                    .to_string(),
            )),
        }
    }

    /// Checks that the log ends where the metadata says it does.
    pub fn finish(&self, recorded_last: i64) -> Result<(), StoreError> {
        let last = self.last_seq();
        if recorded_last < 0 || recorded_last as u64 != last {
            let detail = if recorded_last > last as i64 {
                format!(
                    "the log ends at seq {last} but the store recorded {recorded_last} records: \
                     records {}..={recorded_last} are missing",
                    last + 1
                )
            } else {
                format!(
                    "the log holds records up to seq {last} but the store recorded only \
                     {recorded_last}"
                )
            };
            return Err(self.corrupt(None, detail));
        }
        Ok(())
    }
}

/// Records in flight between the reader thread and the visitor.
const LOAD_QUEUE: usize = 64;
/// Progress is logged after this many records or this much time.
const PROGRESS_RECORDS: u64 = 1 << 20;
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

/// Runs `produce` (which reads and verifies rows, handing each record to its sink
/// until the sink returns `false`) on a helper thread and feeds the records to
/// `visit` on this one, so reading and replaying overlap. The helper thread also
/// keeps blocking database clients (which start their own runtime) away from the
/// caller's thread, which may be inside a tokio runtime.
pub(crate) fn pipelined_load<F>(
    store: &str,
    produce: F,
    visit: &mut dyn FnMut(StoredRecord) -> Result<(), StoreError>,
) -> Result<LoadStats, StoreError>
where
    F: FnOnce(&mut dyn FnMut(StoredRecord) -> bool) -> Result<(), StoreError> + Send,
{
    let started = Instant::now();
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<StoredRecord>(LOAD_QUEUE);
        let producer = std::thread::Builder::new()
            .name("dpledger-store-load".into())
            .spawn_scoped(scope, move || {
                let mut sink = |record: StoredRecord| tx.send(record).is_ok();
                produce(&mut sink)
            })
            .map_err(|e| StoreError::Backend {
                store: store.to_string(),
                detail: format!("cannot start the load thread: {e}"),
            })?;
        let mut stats = LoadStats {
            records: 0,
            bytes: 0,
            seconds: 0.0,
        };
        let mut visit_error = None;
        let mut last_report = Instant::now();
        let mut last_report_records = 0u64;
        for record in rx.iter() {
            stats.records += 1;
            stats.bytes += (record.record.payload.len() + record.record.dataset.len()) as u64;
            if let Err(e) = visit(record) {
                visit_error = Some(e);
                break;
            }
            if stats.records - last_report_records >= PROGRESS_RECORDS
                || last_report.elapsed() >= PROGRESS_INTERVAL
            {
                tracing::info!(
                    store,
                    records = stats.records,
                    bytes = stats.bytes,
                    seconds = started.elapsed().as_secs_f64(),
                    "loading the event log"
                );
                last_report = Instant::now();
                last_report_records = stats.records;
            }
        }
        drop(rx);
        let produced = producer.join().unwrap_or_else(|_| {
            Err(StoreError::Backend {
                store: store.to_string(),
                detail: "the load thread panicked".into(),
            })
        });
        if let Some(e) = visit_error {
            return Err(e);
        }
        produced?;
        stats.seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            store,
            records = stats.records,
            bytes = stats.bytes,
            seconds = stats.seconds,
            "event log loaded"
        );
        Ok(stats)
    })
}

//! The SQLite event log against real files: round trips, atomicity, duplicates
//! under group commit, concurrency, durability across reopen and process crashes,
//! and refusal of every kind of damage (never an empty or shortened ledger).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;

use common::store_records::{
    assert_contiguous, assert_duplicates_write_nothing_of_their_call, event, load_all, step,
};
use dpledger::store::{
    self, append_async, Record, RecordKind, StepPayload, Store, StoreError, StoredRecord,
};

fn url(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

/// Opens and loads; the result a server would start from.
fn open_and_load(path: &Path) -> Result<Vec<StoredRecord>, StoreError> {
    let store = store::open(&url(path))?;
    load_all(&*store)
}

/// A store with a mix of records, closed cleanly (WAL checkpointed into the file).
fn populated(dir: &Path) -> (PathBuf, Vec<StoredRecord>) {
    let path = dir.join("ledger.sqlite");
    let store = store::open(&url(&path)).unwrap();
    store
        .append(vec![event(
            "ds",
            RecordKind::DatasetCreated,
            "{\"examples\":100}",
        )])
        .unwrap();
    for s in 0..60u64 {
        let mut r = step("ds", s, None);
        // A recognisable, incompressible-looking payload tail for the flip tests.
        r.payload
            .extend_from_slice(format!("MARKER-{s:04}-").as_bytes());
        r.payload
            .extend((0..300u32).map(|i| (i * 31 + s as u32) as u8));
        store.append(vec![r]).unwrap();
    }
    store
        .append(vec![event("ds", RecordKind::Release, "{\"epsilon\":1.5}")])
        .unwrap();
    let records = load_all(&*store).unwrap();
    drop(store);
    assert!(
        !Path::new(&format!("{}-wal", path.display())).exists(),
        "a clean close removes the WAL"
    );
    (path, records)
}

#[test]
fn round_trip_in_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/deeper/ledger.sqlite");
    let store = store::open(&url(&path)).unwrap();
    assert!(store.describe().starts_with("sqlite:/"));
    assert!(store.describe().ends_with("nested/deeper/ledger.sqlite"));
    assert!(
        load_all(&*store).unwrap().is_empty(),
        "a new store is empty"
    );
    let records = vec![
        event("alpha", RecordKind::DatasetCreated, "{\"n\":1}"),
        step("alpha", 0, None),
        step("alpha", 1, Some(0)),
        step("alpha", 1, Some(1)),
        event("alpha", RecordKind::Refresh, "{}"),
        event("alpha", RecordKind::Release, "{\"r\":2}"),
        event("alpha", RecordKind::BudgetChange, "{\"b\":3}"),
        Record {
            step: Some(i64::MAX as u64),
            ..event("beta ✓", RecordKind::Archived, "")
        },
    ];
    let seqs = store.append(records[..3].to_vec()).unwrap();
    assert_eq!(seqs, vec![1, 2, 3]);
    let seqs = store.append(records[3..].to_vec()).unwrap();
    assert_eq!(seqs, vec![4, 5, 6, 7, 8]);
    assert_eq!(store.append(vec![]).unwrap(), Vec::<u64>::new());
    let mut stats_records = 0;
    let mut loaded = Vec::new();
    let stats = store
        .load(&mut |r| {
            stats_records += 1;
            loaded.push(r);
            Ok(())
        })
        .unwrap();
    assert_eq!(stats.records, 8);
    assert_eq!(stats_records, 8);
    assert!(stats.bytes > 0 && stats.seconds >= 0.0);
    assert_contiguous(&loaded);
    let got: Vec<Record> = loaded.into_iter().map(|r| r.record).collect();
    assert_eq!(got, records);
    // Step payloads come back bit for bit.
    let p = StepPayload::decode(&got[2].payload).unwrap();
    assert_eq!(p.step, 1);
    assert_eq!(p.part, Some((0, 4)));
}

#[test]
fn multi_record_appends_are_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite");
    let store = store::open(&url(&path)).unwrap();
    store.append(vec![step("d", 0, None)]).unwrap();
    assert_duplicates_write_nothing_of_their_call(&*store);

    // An invalid record refuses the whole call before anything is queued.
    let err = store
        .append(vec![
            step("d", 6, None),
            Record {
                step: None,
                ..step("d", 7, None)
            },
        ])
        .unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidRecord { index: 1, .. }),
        "{err}"
    );

    let loaded = load_all(&*store).unwrap();
    assert_contiguous(&loaded);
    assert_eq!(loaded.len(), 4, "no failed call left a trace");
    assert!(loaded.iter().all(|r| r.record.step.is_none_or(|s| s < 5)));
}

#[test]
fn sixteen_threads_every_acknowledged_record_loaded_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sqlite");
    let store = store::open(&url(&path)).unwrap();
    let threads = 16u64;
    let per_thread = 200u64;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A concurrent reader: every snapshot it sees must be a contiguous prefix.
    let reader = {
        let store = Arc::clone(&store);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut loads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let records = load_all(&*store).expect("concurrent load");
                assert_contiguous(&records);
                loads += 1;
            }
            loads
        })
    };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..per_thread {
                    let dataset = format!("thread-{t}");
                    let records = if i % 10 == 0 {
                        vec![
                            step(&dataset, i, None),
                            event(&dataset, RecordKind::Refresh, &format!("{{\"i\":{i}}}")),
                        ]
                    } else {
                        vec![step(&dataset, i, None)]
                    };
                    let n = records.len();
                    let seqs = store.append(records).unwrap();
                    assert_eq!(seqs.len(), n);
                    assert!(
                        seqs.windows(2).all(|w| w[1] == w[0] + 1),
                        "a call's seqs are consecutive"
                    );
                    acked.push((i, seqs));
                }
                (t, acked)
            })
        })
        .collect();
    let mut expected: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    for h in handles {
        let (t, acked) = h.join().unwrap();
        for (i, seqs) in acked {
            for seq in seqs {
                let previous = expected.insert(seq, (format!("thread-{t}"), i));
                assert!(previous.is_none(), "seq {seq} acknowledged twice");
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let total = threads * per_thread + threads * per_thread / 10;
    assert_eq!(expected.len() as u64, total);
    // Reopen too: what was acknowledged is what a restart sees.
    drop(store);
    let loaded = open_and_load(&path).unwrap();
    assert_contiguous(&loaded);
    assert_eq!(loaded.len() as u64, total);
    let mut seen = HashSet::new();
    for r in &loaded {
        let (dataset, i) = &expected[&r.seq];
        assert_eq!(&r.record.dataset, dataset, "seq {}", r.seq);
        assert_eq!(r.record.step.unwrap_or(*i), *i, "seq {}", r.seq);
        if r.record.kind == RecordKind::StepPart {
            assert!(seen.insert((dataset.clone(), *i)), "step loaded twice");
        }
    }
    assert_eq!(seen.len() as u64, threads * per_thread);
}

#[test]
fn records_survive_reopen_and_numbering_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.sqlite");
    {
        let store = store::open(&url(&path)).unwrap();
        store
            .append(vec![step("d", 0, None), step("d", 1, None)])
            .unwrap();
    }
    let store = store::open(&url(&path)).unwrap();
    assert_eq!(load_all(&*store).unwrap().len(), 2);
    assert_eq!(store.append(vec![step("d", 2, None)]).unwrap(), vec![3]);
    // A retry of an old step is still refused after the restart.
    assert!(matches!(
        store.append(vec![step("d", 1, None)]),
        Err(StoreError::Duplicate { step: 1, .. })
    ));
    drop(store);
    let loaded = open_and_load(&path).unwrap();
    assert_eq!(loaded.len(), 3);
    assert_contiguous(&loaded);
}

#[test]
fn two_stores_on_one_file_never_store_a_step_twice() {
    // Two opens of one file behave like two server processes: SQLite's file lock
    // serialises their writers, the unique index refuses the second copy.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.sqlite");
    let a = store::open(&url(&path)).unwrap();
    let b = store::open(&url(&path)).unwrap();
    let steps = 40u64;
    let run = |s: Arc<dyn Store>| {
        std::thread::spawn(move || {
            (0..steps)
                .filter(|&i| s.append(vec![step("shared", i, None)]).is_ok())
                .count()
        })
    };
    let (ha, hb) = (run(Arc::clone(&a)), run(Arc::clone(&b)));
    let won = ha.join().unwrap() + hb.join().unwrap();
    assert_eq!(won as u64, steps, "each step stored by exactly one of them");
    let loaded = load_all(&*b).unwrap();
    assert_eq!(loaded.len() as u64, steps);
    assert_contiguous(&loaded);
}

#[test]
fn a_visitor_error_stops_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let store = store::open(&url(&dir.path().join("v.sqlite"))).unwrap();
    for i in 0..200 {
        store.append(vec![step("d", i, None)]).unwrap();
    }
    let mut seen = 0;
    let err = store
        .load(&mut |r| {
            seen += 1;
            if r.seq == 7 {
                return Err(StoreError::Replay {
                    seq: r.seq,
                    detail: "ledger refused".into(),
                });
            }
            Ok(())
        })
        .unwrap_err();
    assert_eq!(seen, 7);
    assert_eq!(
        err.to_string(),
        "replaying record seq 7 failed: ledger refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn append_async_from_many_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let store = store::open(&url(&dir.path().join("a.sqlite"))).unwrap();
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { append_async(&store, vec![step("d", i, None)]).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().len(), 1);
    }
    let err = append_async(&store, vec![step("d", 3, None)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate { step: 3, .. }));
    assert_eq!(load_all(&*store).unwrap().len(), 64);
}

// ---------------------------------------------------------------- damage

fn flip(path: &Path, offset: usize, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset] ^= mask;
    std::fs::write(path, bytes).unwrap();
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Damaged content must give an error, or (damage in unused space) exactly the
/// original records; never fewer or different ones.
fn assert_refused_or_intact(path: &Path, original: &[StoredRecord], what: &str) -> bool {
    match open_and_load(path) {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()),
                "{what}: error does not name the file: {msg}"
            );
            true
        }
        Ok(records) => {
            assert_eq!(
                records, original,
                "{what}: loaded different records without an error"
            );
            false
        }
    }
}

#[test]
fn damaged_magic_bytes_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = populated(dir.path());
    flip(&path, 0, 0x20);
    let err = open_and_load(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { seq: None, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("not a SQLite database"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

#[test]
fn every_header_byte_flip_is_refused_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (path, original) = populated(dir.path());
    let pristine = std::fs::read(&path).unwrap();
    let mut refused = 0;
    for offset in 0..100 {
        std::fs::write(&path, &pristine).unwrap();
        flip(&path, offset, 0xff);
        if assert_refused_or_intact(&path, &original, &format!("header byte {offset}")) {
            refused += 1;
        }
        let _ = std::fs::remove_file(format!("{}-wal", path.display()));
        let _ = std::fs::remove_file(format!("{}-shm", path.display()));
    }
    // Magic, page size, format bytes, payload fractions, encoding, app id...
    assert!(refused >= 30, "only {refused} header flips were noticed");
}

#[test]
fn a_flipped_payload_byte_is_reported_with_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (path, original) = populated(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let at = find(&bytes, b"MARKER-0042-").expect("marker in file");
    flip(&path, at + 3, 0x01);
    let err = open_and_load(&path).unwrap_err();
    // Record seq 1 is DatasetCreated, so step 42 is seq 44.
    assert_eq!(original[43].record.step, Some(42));
    match &err {
        StoreError::Corrupt {
            seq: Some(44),
            detail,
            ..
        } => assert!(detail.contains("checksum mismatch"), "{detail}"),
        other => panic!("expected Corrupt at seq 44, got {other}"),
    }
    assert!(err.to_string().contains("at seq 44"));
}

#[test]
fn byte_flips_across_the_file_never_load_a_different_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let (path, original) = populated(dir.path());
    let pristine = std::fs::read(&path).unwrap();
    let mut refused = 0;
    let mut tried = 0;
    let mut offset = 100;
    while offset < pristine.len() {
        std::fs::write(&path, &pristine).unwrap();
        flip(&path, offset, 0x5a);
        let noticed = assert_refused_or_intact(&path, &original, &format!("byte {offset}"));
        if pristine[offset] != 0 {
            tried += 1;
            refused += noticed as usize;
        }
        offset += 977;
    }
    // The middle of the file specifically.
    std::fs::write(&path, &pristine).unwrap();
    for i in 0..64 {
        flip(&path, pristine.len() / 2 + i, 0xff);
    }
    assert_refused_or_intact(&path, &original, "64 bytes in the middle");
    // Flips in unused page space are harmless, and 16 KiB pages of a small store
    // are mostly unused (zero): the mostly empty pages of the snapshot and
    // archive tables and indexes of schema 2. So the sweep counts only flips of
    // bytes that held something; most of those must be noticed (about 60% are:
    // the rest is stale cell space and free-list bytes no load reads).
    assert!(tried >= 20, "only {tried} flips hit content");
    assert!(
        refused * 5 >= tried * 2,
        "only {refused} of {tried} flips of content were noticed"
    );
}

#[test]
fn truncated_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = populated(dir.path());
    let pristine = std::fs::read(&path).unwrap();
    let len = pristine.len();
    // Pages are 16 KiB.
    assert!(len >= 4 * 16384, "test store too small: {len}");
    for cut in [0, 50, 99, 100, 4096, 16384, len / 2, len - 16384, len - 1] {
        std::fs::write(&path, &pristine[..cut]).unwrap();
        let err = open_and_load(&path).expect_err(&format!("truncated to {cut} bytes"));
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "cut {cut}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        if cut == 0 {
            assert!(msg.contains("empty"), "{msg}");
        }
        if cut >= 4096 {
            assert!(msg.contains("truncated"), "{msg}");
        }
    }
}

#[test]
fn foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some text that is long enough to pass the length check of one hundred bytes").unwrap();
    let err = open_and_load(&text).unwrap_err();
    assert!(err.to_string().contains("not a SQLite database"), "{err}");

    let other = dir.path().join("other.sqlite");
    let conn = rusqlite::Connection::open(&other).unwrap();
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(conn);
    let err = open_and_load(&other).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    // Refused, not modified.
    let conn = rusqlite::Connection::open(&other).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'dpledger%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0);

    let err = open_and_load(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
}

#[test]
fn a_write_ahead_log_without_its_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.sqlite");
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    std::fs::write(&wal, vec![0x37u8; 4096]).unwrap();
    let err = open_and_load(&path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("write-ahead log"), "{err}");
    assert!(!path.exists(), "no new store was created over the log");
}

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = populated(dir.path());
    raw(&path)
        .execute(
            "UPDATE dpledger_meta SET value = 3 WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
    let err = open_and_load(&path).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 3,
                supported: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("schema version 3"), "{err}");
}

#[test]
fn a_version_1_store_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = populated(dir.path());
    raw(&path)
        .execute_batch(
            "DROP TABLE dpledger_snapshot_chunks; DROP TABLE dpledger_snapshots; \
             DROP TABLE dpledger_compactions; DROP INDEX dpledger_events_dataset; \
             DROP INDEX dpledger_events_created; \
             UPDATE dpledger_meta SET value = 1 WHERE key = 'schema_version';",
        )
        .unwrap();
    open_and_load(&path).expect("a version-1 store opens");
    let version: i64 = raw(&path)
        .query_row(
            "SELECT value FROM dpledger_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, 2);
    let store = store::open(&format!("sqlite:{}", path.display())).unwrap();
    assert!(store.snapshots().unwrap().is_empty());
}

#[test]
fn an_edited_payload_fails_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let (path, original) = populated(dir.path());
    let conn = raw(&path);
    let mut payload = original[9].record.payload.clone();
    payload[20] ^= 0x10;
    conn.execute(
        "UPDATE dpledger_events SET payload = ?1 WHERE seq = 10",
        [&payload],
    )
    .unwrap();
    drop(conn);
    let mut seen = Vec::new();
    let store = store::open(&url(&path)).unwrap();
    let err = store
        .load(&mut |r| {
            seen.push(r.seq);
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { seq: Some(10), detail, .. } if detail.contains("checksum")),
        "{err}"
    );
    assert_eq!(
        seen,
        (1..10).collect::<Vec<u64>>(),
        "stops at the damaged row"
    );
}

#[test]
fn missing_rows_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (path, original) = populated(dir.path());
    let pristine = std::fs::read(&path).unwrap();

    raw(&path)
        .execute("DELETE FROM dpledger_events WHERE seq = 5", [])
        .unwrap();
    let err = open_and_load(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { seq: Some(6), .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("records 5..=5 are missing"),
        "{err}"
    );

    // A lost tail: contiguous, but shorter than the store recorded.
    std::fs::write(&path, &pristine).unwrap();
    let last = original.len();
    raw(&path)
        .execute(
            "DELETE FROM dpledger_events WHERE seq >= ?1",
            [last as i64 - 2],
        )
        .unwrap();
    let err = open_and_load(&path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");

    // Everything deleted: still not an empty ledger.
    std::fs::write(&path, &pristine).unwrap();
    raw(&path)
        .execute("DELETE FROM dpledger_events", [])
        .unwrap();
    assert!(open_and_load(&path).is_err());
}

// ---------------------------------------------------------------- crashes

const CRASH_ENV: &str = "DPLEDGER_STORE_CRASH_CHILD";

/// Not a test by itself: the child process of
/// `acknowledged_appends_survive_a_killed_process`. Appends forever, printing each
/// acknowledged seq, until it is killed.
#[test]
#[ignore = "child process of acknowledged_appends_survive_a_killed_process"]
fn crash_child() {
    let Ok(path) = std::env::var(CRASH_ENV) else {
        return;
    };
    let store = store::open(&url(Path::new(&path))).unwrap();
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0.. {
                    let seqs = store.append(vec![step(&format!("w{t}"), i, None)]).unwrap();
                    // One line per acknowledgement; the parent counts them.
                    println!("ack {} w{t} {i}", seqs[0]);
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
}

#[test]
fn acknowledged_appends_survive_a_killed_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.sqlite");
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_ENV, &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("ack ") {
            let mut parts = rest.split(' ');
            let seq: u64 = parts.next().unwrap().parse().unwrap();
            let dataset = parts.next().unwrap().to_string();
            let i: u64 = parts.next().unwrap().parse().unwrap();
            acked.push((seq, dataset, i));
            if acked.len() == 400 {
                child.kill().unwrap(); // SIGKILL: no destructor, no checkpoint
                break;
            }
        }
    }
    child.wait().unwrap();
    assert!(
        Path::new(&format!("{}-wal", path.display())).exists(),
        "the killed process left its WAL behind"
    );
    let loaded = open_and_load(&path).unwrap();
    assert_contiguous(&loaded);
    assert!(loaded.len() >= acked.len());
    for (seq, dataset, i) in acked {
        let r = &loaded[seq as usize - 1].record;
        assert_eq!((&r.dataset, r.step), (&dataset, Some(i)), "seq {seq}");
    }
}

#[test]
fn an_impossible_last_seq_is_corruption_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = populated(dir.path());
    raw(&path)
        .execute(
            "UPDATE dpledger_meta SET value = ?1 WHERE key = 'last_seq'",
            [i64::MAX],
        )
        .unwrap();
    let store = store::open(&url(&path)).unwrap();
    let err = store.append(vec![step("d", 1, None)]).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let err = load_all(&*store).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

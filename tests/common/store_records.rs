//! Records and checks shared by the event-log tests of every backend
//! (`store_sqlite`, `store_postgres`, `store_group_commit`): the same contract
//! (duplicates write nothing of their call; a duplicate inside a group commit
//! fails only its caller) is asserted once, against whichever store is given.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use dpledger::store::{Record, RecordKind, StepPayload, Store, StoreError, StoredRecord};

/// A non-step record with a UTF-8 payload.
pub fn event(dataset: &str, kind: RecordKind, payload: &str) -> Record {
    Record {
        dataset: dataset.into(),
        kind,
        step: None,
        part: None,
        payload: payload.as_bytes().to_vec(),
    }
}

/// A step record (of part `part` of 4 when given) whose size varies with the step.
pub fn step(dataset: &str, step: u64, part: Option<u32>) -> Record {
    let n = 1 + (step % 7) as usize;
    step_with(
        dataset,
        step,
        part,
        (0..n as u64).map(|i| i * 10 + step).collect(),
        (0..n).map(|i| i as f64 * 0.5 + step as f64).collect(),
    )
}

/// A step record with the given ids and norms.
pub fn step_with(
    dataset: &str,
    step: u64,
    part: Option<u32>,
    ids: Vec<u64>,
    norms: Vec<f64>,
) -> Record {
    let payload = StepPayload {
        step,
        part: part.map(|p| (p, 4)),
        noise_multiplier: None,
        sampling_rate: None,
        ids,
        norms,
    };
    Record {
        dataset: dataset.into(),
        kind: RecordKind::StepPart,
        step: Some(step),
        part,
        payload: payload.encode(),
    }
}

/// Every record of the store, in order.
pub fn load_all(store: &dyn Store) -> Result<Vec<StoredRecord>, StoreError> {
    let mut out = Vec::new();
    store.load(&mut |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Sequence numbers run 1, 2, 3, … without gaps.
pub fn assert_contiguous(records: &[StoredRecord]) {
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1, "seq not contiguous at position {i}");
    }
}

/// On a store holding only step 0 of `d`: a call with a duplicate anywhere in
/// it writes nothing (a stored step, the same step twice, a whole step against
/// part 0), while other parts, datasets and non-step kinds are unconstrained.
/// Returns the records loaded at the end (the caller may check more).
pub fn assert_duplicates_write_nothing_of_their_call(store: &dyn Store) -> Vec<StoredRecord> {
    // The last record collides with the stored step: nothing of the call lands.
    let err = store
        .append(vec![
            event("d", RecordKind::Refresh, "{}"),
            step("d", 1, None),
            step("d", 0, None),
        ])
        .unwrap_err();
    assert_eq!(
        err,
        StoreError::Duplicate {
            dataset: "d".into(),
            step: 0,
            part: None
        }
    );
    // The same step twice in one call.
    let err = store
        .append(vec![step("d", 5, Some(2)), step("d", 5, Some(2))])
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Duplicate {
                step: 5,
                part: Some(2),
                ..
            }
        ),
        "{err}"
    );
    // A whole step occupies part 0's key (the ledger's Part::WHOLE is part 0 of 1).
    let err = store.append(vec![step("d", 0, Some(0))]).unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { step: 0, .. }),
        "{err}"
    );
    // Other parts, other datasets and non-step kinds are not constrained.
    store
        .append(vec![
            step("d", 1, Some(1)),
            step("e", 0, None),
            event("d", RecordKind::Release, "{}"),
        ])
        .unwrap();
    let loaded = load_all(store).unwrap();
    assert_contiguous(&loaded);
    assert!(loaded.iter().all(|r| r.record.step != Some(5)));
    loaded
}

/// Group commit with a duplicate inside: on a store holding only step 0 of `d`
/// whose writer the caller has blocked (it holds the write lock), a pilot append
/// occupies the writer, 24 callers queue behind it, then `release_lock` lets the
/// group commit. A caller colliding with step 0 fails alone; of the callers
/// racing for one new step exactly one wins; every other caller commits.
pub fn assert_a_duplicate_fails_only_its_caller(
    store: Arc<dyn Store>,
    release_lock: impl FnOnce(),
) -> Vec<StoredRecord> {
    let pilot = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.append(vec![step("pilot", 0, None)]))
    };
    std::thread::sleep(Duration::from_millis(200));
    let threads = 24;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let records = match t % 6 {
                    // Collides with the stored step 0.
                    0 => vec![step("d", 100 + t as u64, None), step("d", 0, None)],
                    // All of these callers race for the same new step.
                    1 => vec![step("race", 1, None)],
                    _ => vec![
                        step("d", 100 + t as u64, None),
                        step("d", 500 + t as u64, None),
                    ],
                };
                (t, store.append(records))
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(Duration::from_millis(300));
    release_lock();
    assert_eq!(pilot.join().unwrap(), Ok(vec![2]));
    let mut race_winners = 0;
    for h in handles {
        let (t, result) = h.join().unwrap();
        match t % 6 {
            0 => assert!(
                matches!(result, Err(StoreError::Duplicate { step: 0, .. })),
                "caller {t}: {result:?}"
            ),
            1 => match result {
                Ok(_) => race_winners += 1,
                Err(StoreError::Duplicate { step: 1, .. }) => {}
                Err(e) => panic!("caller {t}: {e}"),
            },
            _ => assert_eq!(result.map(|s| s.len()), Ok(2), "caller {t}"),
        }
    }
    assert_eq!(race_winners, 1, "exactly one caller stores step 1");
    let loaded = load_all(&*store).unwrap();
    assert_contiguous(&loaded);
    assert_eq!(loaded.len(), 3 + (threads - 8) * 2);
    for t in (0..threads).filter(|t| t % 6 == 0) {
        assert!(
            loaded.iter().all(|r| r.record.step != Some(100 + t as u64)),
            "the failed caller {t} left a record"
        );
    }
    loaded
}

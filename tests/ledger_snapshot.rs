//! A ledger loaded from its snapshot is the same ledger: random
//! traces (Poisson and shuffle, with and without the individual filter, steps in
//! parts, hyperparameter changes, refreshes, releases, retries) are snapshotted
//! at random moments, a multi-part step in progress included; the loaded copy
//! re-encodes to the same bytes, answers every later step, retry and query
//! exactly (bit for bit) like the original, and ends in the same state.

#[path = "common/traces.rs"]
mod traces;

use dpledger::accounting::Conversion;
use dpledger::ledger::Ledger;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use traces::{apply, config, trace, Op};

/// Everything a client can read of a ledger, as exact text.
fn observe(ledger: &Ledger) -> String {
    let n = ledger.examples();
    let privacy: Vec<String> = (0..n)
        .map(|i| format!("{:?}", ledger.privacy(i, 1e-5, Conversion::default())))
        .collect();
    // Memory is measured from allocation capacities, which a copy may trim.
    let status = dpledger::ledger::LedgerStatus {
        memory_bytes: 0,
        ..ledger.status()
    };
    format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        status,
        ledger.thresholds(0..n),
        ledger.worst_case(1e-5, Conversion::default()),
        ledger.pld_events(),
        (0..n).map(|i| ledger.estimate_input(i)).collect::<Vec<_>>(),
        privacy
    )
}

fn run(seed: u64, shuffle: bool, filter: bool) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let (config, n, batch) = config(&mut rng, shuffle, filter, 60);
    let ops = trace(&mut rng, n, batch, shuffle);
    let mut original = Ledger::new(config).unwrap();
    let cut = rng.random_range(0..=ops.len());
    for op in &ops[..cut] {
        apply(&mut original, op);
    }
    let bytes = original.to_snapshot();
    let mut loaded = Ledger::from_snapshot(&bytes).expect("snapshot loads");
    assert_eq!(
        loaded.to_snapshot(),
        bytes,
        "seed {seed}: re-encoding differs"
    );
    assert_eq!(
        observe(&loaded),
        observe(&original),
        "seed {seed}: queries differ"
    );
    for (i, op) in ops[cut..].iter().enumerate() {
        assert_eq!(
            apply(&mut loaded, op),
            apply(&mut original, op),
            "seed {seed}: answer {i} after the snapshot differs"
        );
        // A retry of a recent operation gets the same answer from both.
        if i % 5 == 0 {
            let back = rng.random_range(0..=cut + i);
            if let Op::Step(r) = &ops[back] {
                assert_eq!(
                    format!("{:?}", loaded.step(r)),
                    format!("{:?}", original.step(r)),
                    "seed {seed}: retry differs"
                );
            }
        }
    }
    assert_eq!(
        observe(&loaded),
        observe(&original),
        "seed {seed}: end state"
    );
    assert_eq!(loaded.to_snapshot(), original.to_snapshot());
}

#[test]
fn a_loaded_snapshot_continues_exactly_like_the_original() {
    for seed in 0..120 {
        run(seed, seed % 3 == 0, seed % 2 == 0);
    }
}

#[test]
fn damaged_or_foreign_images_are_refused() {
    let mut rng = Pcg64::seed_from_u64(5);
    let (config, n, batch) = config(&mut rng, false, true, 60);
    let mut ledger = Ledger::new(config).unwrap();
    for op in &trace(&mut rng, n, batch, false) {
        apply(&mut ledger, op);
    }
    let bytes = ledger.to_snapshot();
    assert!(Ledger::from_snapshot(&[]).is_err());
    assert!(Ledger::from_snapshot(b"not a snapshot at all").is_err());
    for cut in [8, 16, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            Ledger::from_snapshot(&bytes[..cut]).is_err(),
            "an image cut at {cut} of {} bytes was accepted",
            bytes.len()
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(Ledger::from_snapshot(&longer).is_err());
    let mut other_format = bytes.clone();
    other_format[4] ^= 0xff;
    let err = Ledger::from_snapshot(&other_format)
        .unwrap_err()
        .to_string();
    assert!(err.contains("format"), "{err}");
}

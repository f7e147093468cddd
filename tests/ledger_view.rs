//! A release's view of the ledger shows every example exactly
//! as it was when the view was opened, whatever happens after: random traces
//! (Poisson and shuffle, with and without the individual filter, steps in parts,
//! hyperparameter changes, refreshes, release charges, retirements, an explicit
//! compaction) run on while a view is open and read in chunks in between, and
//! the view's epsilons are bit for bit those of a copy of the ledger frozen at
//! the view's step.

#[path = "common/traces.rs"]
mod traces;

use dpledger::accounting::Conversion;
use dpledger::ledger::Ledger;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use traces::{apply, config, trace};

const DELTA: f64 = 1e-5;

fn epsilons(ledger: &Ledger) -> Vec<f64> {
    ledger
        .epsilons(DELTA, Conversion::default())
        .unwrap()
        .into_iter()
        .map(|e| e.epsilon)
        .collect()
}

fn run(seed: u64, shuffle: bool, filter: bool) {
    let mut rng = Pcg64::seed_from_u64(seed);
    let (config, n, batch) = config(&mut rng, shuffle, filter, 60);
    let ops = trace(&mut rng, n, batch, shuffle);
    let mut ledger = Ledger::new(config).unwrap();
    let mut cut = rng.random_range(0..=ops.len());
    for op in &ops[..cut] {
        apply(&mut ledger, op);
    }
    // A multi-part step in progress refuses a view: go on until it completes.
    let token = loop {
        match ledger.open_view(DELTA, Conversion::default()) {
            Ok(t) => break t,
            Err(e) => {
                assert!(ledger.status().pending.is_some(), "seed {seed}: {e}");
                apply(&mut ledger, &ops[cut]);
                cut += 1;
            }
        }
    };
    let mut frozen = ledger.clone();
    assert!(frozen.close_view(token));
    assert_eq!(token.step(), frozen.next_step());
    assert!(
        ledger.open_view(DELTA, Conversion::default()).is_err(),
        "seed {seed}: a second view opened"
    );
    let want = epsilons(&frozen);
    // Read the view in chunks of random sizes, in order, with the remaining
    // operations applied in between (as steps interleave with a release).
    let n = n as usize;
    let mut got = Vec::new();
    let read = |ledger: &Ledger, got: &mut Vec<f64>, len: usize| {
        let start = got.len();
        ledger
            .view_epsilons(token, start..start + len, got)
            .unwrap();
    };
    for (k, op) in ops[cut..].iter().enumerate() {
        apply(&mut ledger, op);
        if k == 3 {
            ledger.compact(); // settles the view first
        }
        if got.len() < n && rng.random_bool(0.5) {
            let len = rng.random_range(1..=n / 4 + 1);
            read(&ledger, &mut got, len);
        }
    }
    if !got.is_empty() {
        let mut again = Vec::new();
        assert!(
            ledger.view_epsilons(token, 0..1, &mut again).is_err(),
            "seed {seed}: a view was read twice"
        );
    }
    read(&ledger, &mut got, n);
    assert_eq!(got, want, "seed {seed}: the view moved");
    // Once closed the view reads nothing, and the ledger answers as if no view
    // had been open: a copy that never had one took the same operations (the
    // compaction included, at the same point).
    assert!(ledger.close_view(token));
    assert!(!ledger.close_view(token));
    let mut out = Vec::new();
    assert!(ledger.view_epsilons(token, 0..1, &mut out).is_err());
    assert_eq!(ledger.view_saved(), 0);
    let mut plain = frozen;
    for (k, op) in ops[cut..].iter().enumerate() {
        apply(&mut plain, op);
        if k == 3 {
            plain.compact();
        }
    }
    assert_eq!(epsilons(&ledger), epsilons(&plain), "seed {seed}");
}

#[test]
fn a_view_shows_the_ledger_as_it_was_when_opened() {
    for seed in 0..150 {
        run(seed, seed % 3 == 0, seed % 2 == 0);
    }
}

#[test]
fn steps_save_only_the_examples_they_change() {
    let config = serde_json::from_value(serde_json::json!({
        "examples": 1000, "max_grad_norm": 1.0, "noise_multiplier": 1.1,
        "sampling": {"kind": "poisson", "rate": 0.01}, "delta": 1e-5}))
    .unwrap();
    let mut ledger = Ledger::new(config).unwrap();
    let token = ledger.open_view(DELTA, Conversion::default()).unwrap();
    let before = ledger.memory_bytes();
    let report = dpledger::ledger::StepReport::new(0, vec![1, 2, 3], vec![0.1, 0.2, 0.3]);
    ledger.step(&report).unwrap();
    assert_eq!(ledger.view_saved(), 3);
    assert!(ledger.memory_bytes() > before, "saved rows are counted");
    // A retry changes nothing and saves nothing more.
    ledger.step(&report).unwrap();
    assert_eq!(ledger.view_saved(), 3);
    assert!(ledger.close_view(token));
    assert_eq!(ledger.view_saved(), 0);
}

/// Compaction (automatic, when hyperparameter changes pile up segments) falls
/// at the same step whether or not a release's view is open, so a ledger that
/// had a view open is bit for bit the ledger a replay of the same log builds
/// (replay never has a view open), and the view still reads the ledger as it
/// was when opened. A new noise multiplier at every step makes compactions
/// due while the view is open.
#[test]
fn compaction_falls_at_the_same_step_with_or_without_a_view() {
    let config: dpledger::ledger::DatasetConfig = serde_json::from_value(serde_json::json!({
        "examples": 200, "max_grad_norm": 1.0, "noise_multiplier": 1.1, "rounding": 0.001,
        "sampling": {"kind": "poisson", "rate": 0.1}, "delta": 1e-5}))
    .unwrap();
    let mut rng = Pcg64::seed_from_u64(5);
    let reports: Vec<dpledger::ledger::StepReport> = (0..400u64)
        .map(|t| {
            let ids: Vec<u64> = (0..200).filter(|_| rng.random_bool(0.1)).collect();
            let norms = ids.iter().map(|_| rng.random::<f64>() * 1.5).collect();
            let mut report = dpledger::ledger::StepReport::new(t, ids, norms);
            report.noise_multiplier = Some(0.8 + (t % 53) as f64 * 0.011);
            report
        })
        .collect();
    let mut with_view = Ledger::new(config.clone()).unwrap();
    let mut plain = Ledger::new(config).unwrap();
    let mut compactions = 0;
    let mut views = 0;
    let mut open: Option<(dpledger::ledger::ViewToken, Vec<f64>, Vec<f64>)> = None;
    for (t, report) in reports.iter().enumerate() {
        if open.is_none() && t % 25 == 5 {
            let token = with_view.open_view(DELTA, Conversion::default()).unwrap();
            open = Some((token, epsilons(&with_view), Vec::new()));
        }
        let before = plain.status().segments;
        with_view.step(report).unwrap();
        plain.step(report).unwrap();
        let after = plain.status().segments;
        if after < before && open.is_some() {
            compactions += 1;
        }
        assert_eq!(
            with_view.status().segments,
            after,
            "step {t}: compaction moved by the view"
        );
        if let Some((token, want, mut got)) = open.take() {
            let start = got.len();
            with_view
                .view_epsilons(token, start..start + 10, &mut got)
                .unwrap();
            if got.len() == want.len() {
                assert_eq!(got, want, "step {t}: the view moved");
                assert!(with_view.close_view(token));
                views += 1;
            } else {
                open = Some((token, want, got));
            }
        }
    }
    assert!(
        compactions >= 3,
        "the schedule must compact while a view is open: {compactions}"
    );
    assert!(views >= 5, "{views}");
    let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(epsilons(&with_view)), bits(epsilons(&plain)));
    for id in 0..200 {
        let a = with_view.privacy(id, DELTA, Conversion::default()).unwrap();
        let b = plain.privacy(id, DELTA, Conversion::default()).unwrap();
        assert_eq!(bits(a.rdp), bits(b.rdp), "example {id}");
    }
}

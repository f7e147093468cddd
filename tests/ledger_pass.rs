//! The all-epsilons pass (`src/ledger/dataset/pass.rs`) serves, for
//! every example, bit for bit the epsilon and order of the per-example query:
//! random traces at the ledger's 64 orders (the pass's vectorised form) and at
//! 5 (its general form), Poisson and shuffle, with and without the individual
//! filter, hyperparameter changes, refreshes, releases, compaction, a reload
//! from a snapshot, and a view read while steps go on. Counts past a narrow
//! entry (wide entries) are covered by a long run of a few examples.

#[path = "common/traces.rs"]
mod traces;

use dpledger::accounting::pld::PldEvent;
use dpledger::accounting::Conversion;
use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::sync::atomic::{AtomicUsize, Ordering};
use traces::{config, trace, Op};

const DELTAS: [f64; 3] = [1e-5, 0.3, 1e-12];

/// Examples the traces' releases left out, over all runs: the pass's
/// per-example release charges must have been exercised.
static LEFT_OUT: AtomicUsize = AtomicUsize::new(0);

/// A small random configuration at the default 64 orders (`orders64`) or the
/// traces' 5.
fn configured(rng: &mut Pcg64, shuffle: bool, filter: bool, orders64: bool) -> (Ledger, u64, u64) {
    let (mut config, n, batch) = config(rng, shuffle, filter, 60);
    if orders64 {
        config.orders = None;
    }
    let ledger = Ledger::new(config).unwrap();
    (ledger, n, batch)
}

fn apply(ledger: &mut Ledger, op: &Op) {
    match op {
        Op::Step(r) => drop(ledger.step(r)),
        Op::Refresh(ids, norms) => drop(ledger.refresh(ids, norms)),
        Op::Release => {
            // Every other release is large: with a filter it leaves the
            // examples near their budget out, whose charges are then their own.
            let size = if ledger.releases() % 2 == 1 {
                0.4
            } else {
                0.01
            };
            let charge = vec![size; ledger.orders().len()];
            let pld = [PldEvent::Gaussian {
                sigma: 10.0,
                count: 1,
            }];
            let left_out = ledger.release_left_out(&charge);
            LEFT_OUT.fetch_add(left_out.len(), Ordering::Relaxed);
            drop(ledger.charge_release_with_pld(&charge, Some(&pld), &left_out));
        }
    }
}

/// Every example's value and order from the pass (a release's values: the
/// ledger's epsilon in the sampled protocol) equal its own query's estimate.
fn assert_pass_is_the_query(ledger: &Ledger, what: &str) {
    for conversion in [Conversion::Improved, Conversion::Classic] {
        for delta in DELTAS {
            let all = ledger.epsilons(delta, conversion).unwrap();
            assert_eq!(all.len() as u64, ledger.examples());
            for (id, e) in all.iter().enumerate() {
                let one = ledger.privacy(id as u64, delta, conversion).unwrap();
                assert_eq!(
                    (e.epsilon.to_bits(), e.order.to_bits()),
                    (one.rdp_epsilon.to_bits(), one.order.to_bits()),
                    "{what}: example {id}, delta {delta}, {conversion:?}"
                );
            }
        }
    }
}

fn bits(ledger: &Ledger) -> Vec<(u64, u64)> {
    ledger
        .epsilons(1e-5, Conversion::Improved)
        .unwrap()
        .iter()
        .map(|e| (e.epsilon.to_bits(), e.order.to_bits()))
        .collect()
}

fn run(seed: u64, shuffle: bool, filter: bool, orders64: bool) {
    let what = format!("seed {seed}, shuffle {shuffle}, filter {filter}, 64 orders {orders64}");
    let mut rng = Pcg64::seed_from_u64(seed);
    let (mut ledger, n, batch) = configured(&mut rng, shuffle, filter, orders64);
    let ops = trace(&mut rng, n, batch, shuffle);
    let view_at = rng.random_range(0..=ops.len());
    let mut view = None;
    for (k, op) in ops.iter().enumerate() {
        if k == view_at {
            if let Ok(token) = ledger.open_view(1e-5, Conversion::Improved) {
                let mut frozen = ledger.clone();
                frozen.close_view(token);
                view = Some((token, frozen));
            }
        }
        apply(&mut ledger, op);
        if k % 7 == 0 {
            assert_pass_is_the_query(&ledger, &what);
        }
    }
    assert_pass_is_the_query(&ledger, &what);
    // A view read after later steps (rows saved for the examples they changed)
    // serves the frozen copy's epsilons, which are its own queries'.
    if let Some((token, frozen)) = view {
        assert_pass_is_the_query(&frozen, &what);
        let mut got = Vec::new();
        ledger
            .view_epsilons(token, 0..n as usize, &mut got)
            .unwrap();
        let want: Vec<u64> = bits(&frozen).iter().map(|b| b.0).collect();
        let got: Vec<u64> = got.iter().map(|e| e.to_bits()).collect();
        assert_eq!(got, want, "{what}: the view");
        assert!(ledger.close_view(token));
    }
    // Reloaded from a snapshot (the rows cache rebuilt), and compacted.
    let back = Ledger::from_snapshot(&ledger.to_snapshot()).unwrap();
    assert_eq!(bits(&back), bits(&ledger), "{what}: reloaded");
    assert_pass_is_the_query(&back, &what);
    ledger.compact();
    assert_pass_is_the_query(&ledger, &what);
}

#[test]
fn the_pass_serves_each_examples_own_query_bit_for_bit() {
    for seed in 0..24 {
        for (shuffle, filter) in [(false, false), (false, true), (true, false), (true, true)] {
            run(seed, shuffle, filter, true);
        }
        run(seed, false, seed % 2 == 0, false);
    }
    assert!(
        LEFT_OUT.load(Ordering::Relaxed) > 0,
        "no release left an example out: the traces miss that case"
    );
}

/// More than 4,095 steps at one `(segment, level)` (a wide entry), with
/// schedule changes and examples moving between levels, at 64 orders.
#[test]
fn long_histories_with_wide_entries_agree_too() {
    let n = 6u64;
    let mut ledger = Ledger::new(DatasetConfig::poisson(n, 1.0, 1.0, 0.5, 1e-5)).unwrap();
    let mut rng = Pcg64::seed_from_u64(27);
    for t in 0..9000u64 {
        // Example 0 stays at one low level until the last step closes its run
        // (4,500 and 4,499 steps under the two settings); the others move.
        let norms: Vec<f64> = (0..n)
            .map(|i| match i {
                0 if t == 8999 => 1.0,
                0 => 0.3,
                _ => rng.random_range(0.0..1.5),
            })
            .collect();
        ledger
            .step(&StepReport {
                noise_multiplier: Some(if t < 4500 { 1.0 } else { 1.2 }),
                ..StepReport::new(t, (0..n).collect(), norms)
            })
            .unwrap();
    }
    // Closed counts only (bucket 0: no open run).
    let counts = ledger
        .level_history()
        .example_counts(0, 0, ledger.next_step())
        .unwrap();
    assert!(counts.iter().any(|c| c.steps > 4095), "{counts:?}");
    assert_pass_is_the_query(&ledger, "long run");
}

/// A pass long enough to be split over threads (65,536 examples or more)
/// still serves each example's own query, in id order.
#[test]
fn a_pass_split_over_threads_agrees_too() {
    let n = 70_000u64;
    let mut ledger = Ledger::new(DatasetConfig::poisson(n, 1.0, 1.0, 0.01, 1e-5)).unwrap();
    let mut rng = Pcg64::seed_from_u64(3);
    for t in 0..30u64 {
        let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.01)).collect();
        let norms = ids.iter().map(|_| rng.random_range(0.0..1.5)).collect();
        ledger
            .step(&StepReport {
                noise_multiplier: Some(1.0 + 0.1 * (t / 10) as f64),
                ..StepReport::new(t, ids, norms)
            })
            .unwrap();
    }
    let all = ledger.epsilons(1e-5, Conversion::Improved).unwrap();
    assert_eq!(all.len() as u64, n);
    for (id, e) in all.iter().enumerate() {
        let one = ledger
            .privacy(id as u64, 1e-5, Conversion::Improved)
            .unwrap();
        assert_eq!(
            (e.epsilon.to_bits(), e.order.to_bits()),
            (one.rdp_epsilon.to_bits(), one.order.to_bits()),
            "example {id}"
        );
    }
    // The view reads the same values, in one range (split) and in chunks.
    let token = ledger.open_view(1e-5, Conversion::Improved).unwrap();
    let mut got = Vec::new();
    ledger.view_epsilons(token, 0..1000, &mut got).unwrap();
    ledger
        .view_epsilons(token, 1000..n as usize, &mut got)
        .unwrap();
    let want: Vec<f64> = all.iter().map(|e| e.epsilon).collect();
    assert_eq!(got, want);
}

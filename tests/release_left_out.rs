//! Releases leave out of their input the examples under the individual filter
//! that they would push past their budget (spec §6): those bear nothing of the
//! release, every other example bears all of it, nobody leaves the budget, and
//! what each example bore survives a snapshot and a second release.

use dpledger::accounting::sgm::sgm_rdp;
use dpledger::accounting::Conversion;
use dpledger::ledger::{DatasetConfig, IndividualBudget, Ledger, StepReport};
use dpledger::release::rdp_of_rho;

const DELTA: f64 = 1e-5;
const ORDERS: [f64; 8] = [1.5, 2.0, 3.0, 5.5, 8.0, 16.0, 32.0, 64.0];
const N: u64 = 200;

/// Examples below `N / 2` have tiny gradients; the others large ones, each its
/// own (so that they retire at different steps, with different slack).
fn small(i: u64) -> bool {
    i < N / 2
}

fn norm(i: u64) -> f64 {
    if small(i) {
        0.05
    } else {
        0.6 + 0.4 * (i - N / 2) as f64 / (N / 2) as f64
    }
}

fn filtered_ledger() -> Ledger {
    Ledger::new(DatasetConfig {
        orders: Some(ORDERS.to_vec()),
        individual_budget: Some(IndividualBudget {
            epsilon: 1.0,
            delta: 1e-5,
        }),
        ..DatasetConfig::poisson(N, 1.0, 2.0, 0.1, DELTA)
    })
    .unwrap()
}

fn step_everyone(ledger: &mut Ledger) {
    let ids: Vec<u64> = (0..N).collect();
    let norms = ids.iter().map(|&i| norm(i)).collect();
    let t = ledger.next_step();
    ledger.step(&StepReport::new(t, ids, norms)).unwrap();
}

fn rdp_rows(ledger: &Ledger) -> Vec<Vec<f64>> {
    (0..N)
        .map(|i| ledger.privacy(i, DELTA, Conversion::Improved).unwrap().rdp)
        .collect()
}

#[test]
fn examples_near_their_budget_bear_nothing_and_the_rest_bear_everything() {
    let mut ledger = filtered_ledger();
    let filter = ledger.status().filter.unwrap();
    let j = ORDERS.iter().position(|&a| a == filter.order).unwrap();
    let per_step = sgm_rdp(0.1, 2.0, filter.order);
    let worst_steps = (filter.rdp_budget / per_step).floor() as u64;
    while ledger.status().retired < N / 2 && ledger.next_step() < 20 * worst_steps {
        step_everyone(&mut ledger);
    }
    assert_eq!(ledger.status().retired, N / 2, "the large examples retired");

    // A release costing two worst-case steps at the filter's order.
    let rdp = rdp_of_rho(&ORDERS, 2.0 * per_step / filter.order);
    let left_out = ledger.release_left_out(&rdp);
    let want: Vec<u32> = (N / 2..N).map(|i| i as u32).collect();
    assert_eq!(left_out, want);
    assert_eq!(ledger.release_would_retire(&rdp, &left_out), 0);
    assert_eq!(ledger.release_would_retire(&rdp, &[]), N / 2);
    let worst_before = ledger.worst_case_rdp();
    let before = rdp_rows(&ledger);
    let retired = ledger
        .charge_release_with_pld(&rdp, None, &left_out)
        .unwrap();
    assert!(retired.is_empty(), "{retired:?}");
    let after = rdp_rows(&ledger);
    for i in 0..N as usize {
        for (k, r) in rdp.iter().enumerate() {
            let want = if small(i as u64) {
                before[i][k] + r
            } else {
                before[i][k]
            };
            assert_eq!(after[i][k], want, "example {i}, order {}", ORDERS[k]);
        }
        assert!(
            after[i][j] <= filter.rdp_budget,
            "example {i} left its budget"
        );
    }
    for (k, r) in rdp.iter().enumerate() {
        assert_eq!(ledger.worst_case_rdp()[k], worst_before[k] + r);
    }

    // A small release after more steps: the large examples it still fits
    // bear it (and move share class), the others still bear nothing.
    for _ in 0..3 {
        step_everyone(&mut ledger);
    }
    let small_rdp = rdp_of_rho(&ORDERS, 0.1 * per_step / filter.order);
    let left_out2 = ledger.release_left_out(&small_rdp);
    assert!(left_out2.iter().all(|&i| !small(i as u64)));
    let before = rdp_rows(&ledger);
    ledger
        .charge_release_with_pld(&small_rdp, None, &left_out2)
        .unwrap();
    let after = rdp_rows(&ledger);
    let mut charged_large = 0;
    for i in 0..N as usize {
        let out = left_out2.binary_search(&(i as u32)).is_ok();
        charged_large += usize::from(!out && !small(i as u64));
        for (k, r) in small_rdp.iter().enumerate() {
            let want = if out { before[i][k] } else { before[i][k] + r };
            assert_eq!(after[i][k], want, "example {i}, order {}", ORDERS[k]);
        }
        assert!(
            after[i][j] <= filter.rdp_budget,
            "example {i} left its budget"
        );
    }
    assert!(
        charged_large > 0 && charged_large < N as usize / 2,
        "the second release should fit some large examples and not others: {charged_large}"
    );

    // The pass (a release's values) is each example's own query, and a
    // snapshot keeps what each example bore.
    let all = ledger.epsilons(DELTA, Conversion::Improved).unwrap();
    for (i, e) in all.iter().enumerate() {
        let one = ledger
            .privacy(i as u64, DELTA, Conversion::Improved)
            .unwrap();
        assert_eq!(
            e.epsilon.to_bits(),
            one.rdp_epsilon.to_bits(),
            "example {i}"
        );
    }
    let back = Ledger::from_snapshot(&ledger.to_snapshot()).unwrap();
    assert_eq!(rdp_rows(&back), after);
}

#[test]
fn a_malformed_left_out_list_is_refused_and_changes_nothing() {
    let mut ledger = filtered_ledger();
    step_everyone(&mut ledger);
    let rdp = vec![0.01; ORDERS.len()];
    let before = rdp_rows(&ledger);
    for bad in [&[3u32, 1][..], &[2, 2], &[N as u32]] {
        let e = ledger.charge_release_with_pld(&rdp, None, bad).unwrap_err();
        assert!(e.to_string().contains("left_out"), "{e}");
    }
    assert_eq!(rdp_rows(&ledger), before);
    assert_eq!(ledger.releases(), 0);
}

#[test]
fn without_a_filter_nobody_is_left_out() {
    let mut ledger = Ledger::new(DatasetConfig::poisson(N, 1.0, 2.0, 0.1, DELTA)).unwrap();
    step_everyone(&mut ledger);
    assert!(ledger.release_left_out(&[1e3; 64]).is_empty());
}

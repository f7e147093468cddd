//! Property tests of the accounting core: monotonicity that any correct
//! RDP computation must have. Values are compared with a 1e-12 relative slack,
//! the size of floating-point noise, so a real violation still fails.

use dpledger::accounting::conversion::{epsilon_from_rdp, Conversion};
use dpledger::accounting::grid::BucketGrid;
use dpledger::accounting::sgm::sgm_rdp;
use dpledger::accounting::table::{RdpTable, StepMechanism};
use proptest::prelude::*;

fn le(a: f64, b: f64) -> bool {
    a <= b + 1e-12 * b.abs()
}

fn order() -> impl Strategy<Value = f64> {
    prop_oneof![(2u32..300).prop_map(f64::from), 1.01f64..40.0,]
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![(-7.0f64..0.0).prop_map(|e| 10f64.powf(e)), (0.0f64..1.0)]
}

fn sigma() -> impl Strategy<Value = f64> {
    0.3f64..100.0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn rdp_non_decreasing_in_order(q in rate(), s in sigma(), a in order(), da in 0.01f64..20.0) {
        let lo = sgm_rdp(q, s, a);
        let hi = sgm_rdp(q, s, a + da);
        prop_assert!(le(lo, hi), "q={q} s={s} a={a}+{da}: {lo} > {hi}");
    }

    #[test]
    fn rdp_non_decreasing_in_rate(q in rate(), f in 1.0f64..3.0, s in sigma(), a in order()) {
        let q2 = (q * f).min(1.0);
        let lo = sgm_rdp(q, s, a);
        let hi = sgm_rdp(q2, s, a);
        prop_assert!(le(lo, hi), "q={q}->{q2} s={s} a={a}: {lo} > {hi}");
    }

    #[test]
    fn rdp_non_increasing_in_sigma(q in rate(), s in sigma(), f in 1.0f64..3.0, a in order()) {
        let big = sgm_rdp(q, s, a);
        let small = sgm_rdp(q, s * f, a);
        prop_assert!(le(small, big), "q={q} s={s}*{f} a={a}: {small} > {big}");
    }

    #[test]
    fn epsilon_non_increasing_in_delta(q in rate(), s in sigma(), steps in 1u64..10_000, d in -12.0f64..-1.0, f in 1.0f64..10.0) {
        let orders = dpledger::accounting::orders::ledger_orders();
        let rdp: Vec<f64> = orders.iter().map(|&a| steps as f64 * sgm_rdp(q, s, a)).collect();
        let d1 = 10f64.powf(d);
        let d2 = (d1 * f).min(0.5);
        for c in [Conversion::Improved, Conversion::Classic] {
            let e1 = epsilon_from_rdp(&orders, &rdp, d1, c).epsilon;
            let e2 = epsilon_from_rdp(&orders, &rdp, d2, c).epsilon;
            prop_assert!(le(e2, e1), "{c:?} delta {d1}->{d2}: {e1} -> {e2}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn bucket_table_monotone_in_k(q in rate(), s in 0.5f64..10.0, r in 0.02f64..0.5) {
        let grid = BucketGrid::new(1.0, r).unwrap();
        let orders = [1.5, 2.0, 3.5, 8.0, 32.0, 256.0];
        let table = RdpTable::compute(&grid, StepMechanism::Poisson { q, sigma: s }, &orders);
        for k in 1..=grid.top() {
            for (j, order) in orders.iter().enumerate() {
                prop_assert!(le(table.row(k - 1)[j], table.row(k)[j]), "k={k} order={order}");
            }
        }
    }
}

//! The ex-post bound (spec §10) against an independent oracle: the root of
//! `sum_a w_a exp((a - 1)(eps - R_a)) = 1/delta` found by bisection in mpmath at
//! 50 digits for seeded random ledgers (`tests/fixtures/ex_post.json`, written by
//! `scripts/gen-fixtures --only ex_post`, or `python3 scripts/fixtures/ex_post.py`
//! with any Python that has mpmath).
//!
//! The Rust value must never be below the exact root (it is a privacy number,
//! rounded up) and at most 1e-9 relative above it.

mod oracle;

use dpledger::accounting::ex_post::ex_post_epsilon;
use oracle::{f, fixture, floats};
use serde_json::Value;

/// RDP values; JSON null is +inf.
fn rdp(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::INFINITY))
        .collect()
}

#[test]
fn ex_post_matches_mpmath_never_below_within_1e9() {
    let doc = fixture("ex_post.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 400, "fixture has {} cases", cases.len());
    let mut worst: f64 = 0.0;
    let mut infinite = 0;
    for c in cases {
        let orders = floats(&c["orders"]);
        let weights = floats(&c["weights"]);
        let r = rdp(&c["rdp"]);
        let delta = f(c, "delta");
        let ours = ex_post_epsilon(&orders, &weights, &r, delta);
        if c["epsilon"].is_null() {
            assert_eq!(ours, f64::INFINITY, "{c}");
            infinite += 1;
            continue;
        }
        let down = f(c, "epsilon_down");
        let exact = f(c, "epsilon");
        assert!(
            ours >= down,
            "below the exact root: ours {ours}, oracle {exact}: {c}"
        );
        let rel = (ours - exact) / exact;
        assert!(
            rel <= 1e-9,
            "{rel:e} relative above the root: ours {ours}, oracle {exact}: {c}"
        );
        worst = worst.max(rel);
    }
    assert!(
        infinite >= 2,
        "the fixture must exercise all-infinite ledgers"
    );
    eprintln!("{} cases, worst relative excess {worst:e}", cases.len());
}

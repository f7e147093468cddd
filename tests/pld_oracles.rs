//! The PLD accountant against independent oracles: dp-accounting's
//! pessimistic connect-the-dots PLD at value discretisation 1e-4 and the PRV
//! accountant's lower bound (Gopi et al. 2021, eps_error 0.01).
//!
//! Fixtures `tests/fixtures/pld_*.json` come from `scripts/gen-fixtures --only pld`
//! (versions recorded in each file); the per-example estimate's
//! (`pld_small_epsilon.json`, `pld_grid273.json`: dp-accounting at 1e-5 and its
//! RDP epsilon) from `scripts/gen-fixtures --only pld_small`. Nothing here
//! compares the code with itself.

mod oracle;

use dpledger::accounting::pld::{
    estimate_epsilon, worst_case_epsilon, EstimateCache, LevelCache, PldEvent, PldOptions,
};
use oracle::{f, fixture};
use serde_json::Value;

/// How far above dp-accounting (1e-4) our default may be.
const MAX_RATIO: f64 = 1.005;

fn levels(case: &Value) -> Vec<(f64, f64, u64)> {
    case["levels"]
        .as_array()
        .expect("levels")
        .iter()
        .map(|l| {
            (
                l[0].as_f64().unwrap(),
                l[1].as_f64().unwrap(),
                l[2].as_u64().unwrap(),
            )
        })
        .collect()
}

fn events(levels: &[(f64, f64, u64)]) -> Vec<PldEvent> {
    levels
        .iter()
        .map(|&(q, sigma, count)| PldEvent::PoissonGaussian { q, sigma, count })
        .collect()
}

/// Check every case; returns (max ratio to dp-accounting, min margin over PRV lower).
fn check_cases(name: &str) -> (usize, f64, f64) {
    let doc = fixture(name);
    let cases = doc["cases"].as_array().expect("cases");
    let opts = PldOptions::default();
    let (mut max_ratio, mut min_margin) = (0.0f64, f64::INFINITY);
    for c in cases {
        let lv = levels(c);
        let delta = f(c, "delta");
        let ours = worst_case_epsilon(&events(&lv), delta, &opts).unwrap();
        let dpa = f(c, "epsilon_dp_accounting");
        let prv_lo = f(c, "prv_lower");
        assert!(
            ours >= prv_lo,
            "{name}: {ours} below the PRV lower bound {prv_lo}: {c}"
        );
        assert!(
            ours <= dpa * MAX_RATIO + 1e-6,
            "{name}: {ours} more than 0.5% above dp-accounting {dpa}: {c}"
        );
        if dpa > 1e-3 {
            max_ratio = max_ratio.max(ours / dpa);
        }
        min_margin = min_margin.min(ours - prv_lo);
    }
    eprintln!(
        "{name}: {} cases, max ours/dp-accounting {max_ratio:.5}, min margin over PRV lower {min_margin:.5}",
        cases.len()
    );
    (cases.len(), max_ratio, min_margin)
}

#[test]
fn single_settings_sit_between_prv_lower_bound_and_dp_accounting() {
    let (n, _, _) = check_cases("pld_single.json");
    assert!(n >= 40, "{n} settings");
    // The fixture spans the ranges the issue asks for.
    let doc = fixture("pld_single.json");
    let cases = doc["cases"].as_array().unwrap();
    let lv: Vec<(f64, f64, u64)> = cases.iter().flat_map(levels).collect();
    let deltas: Vec<f64> = cases.iter().map(|c| f(c, "delta")).collect();
    assert!(lv.iter().any(|l| l.0 <= 1e-4) && lv.iter().any(|l| l.0 >= 0.5));
    assert!(lv.iter().any(|l| l.1 <= 0.5) && lv.iter().any(|l| l.1 >= 10.0));
    assert!(lv.iter().any(|l| l.2 == 1) && lv.iter().any(|l| l.2 >= 100_000));
    assert!(deltas.iter().any(|&d| d >= 1e-3) && deltas.iter().any(|&d| d <= 1e-10));
}

#[test]
fn demo_run_is_at_most_opacus_prv() {
    let events = [PldEvent::PoissonGaussian {
        q: 0.00427,
        sigma: 1.0,
        count: 4688,
    }];
    let eps = worst_case_epsilon(&events, 1e-5, &PldOptions::default()).unwrap();
    eprintln!("demo run: PLD epsilon {eps}");
    assert!(eps <= 1.58, "{eps}");
}

#[test]
fn bad_inputs_are_refused_not_answered_loosely() {
    let ev = [PldEvent::PoissonGaussian {
        q: 0.01,
        sigma: 1.0,
        count: 100,
    }];
    let opts = PldOptions::default();
    for delta in [0.0, 1.0, -1e-5, f64::NAN] {
        assert!(worst_case_epsilon(&ev, delta, &opts).is_err(), "{delta}");
    }
    let coarse = PldOptions {
        value_discretization: 0.5,
    };
    assert!(worst_case_epsilon(&ev, 1e-5, &coarse).is_err());
    let huge = [PldEvent::PoissonGaussian {
        q: 0.5,
        sigma: 0.5,
        count: u64::MAX / 2,
    }];
    let e = worst_case_epsilon(&huge, 1e-5, &opts).unwrap_err();
    assert!(e.to_string().contains("grid"), "{e}");
}
#[test]
fn heterogeneous_compositions_sit_between_prv_lower_bound_and_dp_accounting() {
    let (n, _, _) = check_cases("pld_hetero.json");
    assert!(n >= 20, "{n} compositions");
}

#[test]
fn cached_level_estimate_matches_dp_accounting() {
    // The per-example estimate composes cached spectra; same oracle bounds at the
    // oracle's own discretisation (the estimate does not refine its grid itself:
    // at the default 1e-3 an epsilon of 0.2 comes out about 3% above).
    let doc = fixture("pld_hetero.json");
    let opts = PldOptions {
        value_discretization: 1e-4,
    };
    for c in doc["cases"].as_array().unwrap().iter().take(4) {
        let lv = levels(c);
        let total: u64 = lv.iter().map(|l| l.2).sum();
        let cache = LevelCache::new(
            &lv.iter().map(|l| (l.0, l.1)).collect::<Vec<_>>(),
            total,
            &opts,
        )
        .unwrap();
        let counts: Vec<(usize, u64)> = lv.iter().enumerate().map(|(i, l)| (i, l.2)).collect();
        let eps = cache
            .compose(&counts)
            .unwrap()
            .epsilon(f(c, "delta"))
            .unwrap();
        assert!(eps >= f(c, "prv_lower"), "{eps} {c}");
        assert!(
            eps <= f(c, "epsilon_dp_accounting") * MAX_RATIO + 1e-6,
            "{eps} {c}"
        );
    }
}

/// Check the per-example estimate (its grid chosen per query) on every case of
/// `name` against dp-accounting at 1e-5: within 0.5% above it, not implausibly
/// below it, and never above dp-accounting's RDP epsilon of the same
/// composition (where the oracle is below it: the rule the served estimate
/// keeps by its cap, `src/engine/estimate.rs`, holds here without the cap).
/// Returns the epsilons checked.
fn check_estimates(name: &str) -> Vec<f64> {
    let doc = fixture(name);
    let cache = EstimateCache::default();
    let mut seen = Vec::new();
    for c in doc["cases"].as_array().expect("cases") {
        let lv = levels(c);
        let delta = f(c, "delta");
        let dpa = f(c, "epsilon_dp_accounting");
        let rdp = f(c, "epsilon_rdp_dp_accounting");
        let ours = estimate_epsilon(&cache, &events(&lv), delta).unwrap();
        let e = ours.epsilon;
        assert!(
            e <= dpa * MAX_RATIO + 1e-7,
            "{name}: estimate {e} (grid {}) more than 0.5% above dp-accounting at 1e-5 {dpa}: {c}",
            ours.value_discretization
        );
        assert!(
            e >= dpa * 0.99 - 1e-7,
            "{name}: estimate {e} implausibly below dp-accounting at 1e-5 {dpa}: {c}"
        );
        if dpa < rdp {
            assert!(
                e <= rdp,
                "{name}: estimate {e} above the RDP epsilon {rdp}: {c}"
            );
        }
        eprintln!(
            "{name}: dp-accounting {dpa:.6} estimate {e:.6} (ratio {:.5}, grid {:.3e}) rdp {rdp:.6}",
            if dpa > 0.0 { e / dpa } else { 1.0 },
            ours.value_discretization
        );
        seen.push(dpa);
    }
    seen
}

#[test]
fn small_epsilon_estimates_are_within_half_a_percent_of_dp_accounting_at_1e5() {
    let seen = check_estimates("pld_small_epsilon.json");
    assert!(seen.len() >= 15, "{} cases", seen.len());
    // The fixture spans the epsilons the issue names, 1e-3 .. 0.1.
    assert!(seen.iter().any(|&e| e > 1e-3 && e < 2e-3), "{seen:?}");
    assert!(seen.iter().any(|&e| e > 0.09), "{seen:?}");
    assert!(seen.iter().filter(|&&e| e > 1e-3 && e < 0.1).count() >= 12);
}

#[test]
fn estimates_on_a_273_level_grid_are_within_half_a_percent_of_dp_accounting_at_1e5() {
    let seen = check_estimates("pld_grid273.json");
    assert!(seen.len() >= 8, "{} cases", seen.len());
    let doc = fixture("pld_grid273.json");
    let ks: Vec<u64> = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["grid_levels"].as_array().unwrap().clone())
        .map(|k| k.as_u64().unwrap())
        .collect();
    assert!(ks.iter().any(|&k| k < 10) && ks.contains(&273), "{ks:?}");
}

//! Issue 6's accuracy benchmark, run as a test with statistical bounds (seeded;
//! no timing): n = 50,000 values B·Beta(1.5, 6), and the same with 20% exactly at
//! B, rho = 0.00125 for five quantiles; and heavily tied epsilons (issue 15,
//! item 8). Goal: KSS mean rank error at most 30.

use dpledger::release::accuracy::{compare_methods, Population};

const LEVELS: [f64; 5] = [0.1, 0.3, 0.5, 0.7, 0.9];
const RHO: f64 = 0.00125;
const TRIALS: usize = 20;

fn check(share_at_bound: f64) {
    let population = Population::Beta { share_at_bound };
    let report = compare_methods(2022, 50_000, population, &LEVELS, RHO, TRIALS);
    println!("{}", report.to_text());
    // Expected ≈ 1/η ≈ 17 with η = sqrt(8ρ/3); 30 leaves room for the seed's luck
    // (20 trials × 5 levels) yet fails if the mechanism lost a factor of 2.
    assert!(
        report.kss_mean_rank_error <= 30.0,
        "KSS mean rank error {}",
        report.kss_mean_rank_error
    );
    for row in &report.levels {
        assert!(row.kss_rank_error <= 60.0, "level {}: {row:?}", row.level);
    }
}

#[test]
fn kss_meets_the_rank_error_goal_on_beta_data() {
    check(0.0);
}

#[test]
fn kss_meets_the_rank_error_goal_with_ties_at_the_bound() {
    check(0.2);
}

/// Issue 15, item 8: per-example epsilons of a run with stable norms (about 115
/// distinct values in runs of up to about 1,400). Before the grid mechanism KSS
/// measured 92 here (309 at resolution 0); the goal is 30. Rank errors count
/// ties as intervals at the release's public resolution `B / 2^16`: no zCDP
/// mechanism can hit a private value exactly (docs/releases-quantiles.md).
#[test]
fn kss_meets_the_rank_error_goal_on_tied_data() {
    let report = compare_methods(2022, 50_000, Population::Tied, &LEVELS, RHO, TRIALS);
    println!("{}", report.to_text());
    assert!(report.resolution > 0.0 && report.resolution <= 1.0 / 65536.0);
    assert!(
        report.kss_mean_rank_error <= 30.0,
        "KSS mean rank error on tied data {}",
        report.kss_mean_rank_error
    );
}

/// Continuous data must not lose accuracy to the grid. Measured means (seed
/// 2022, 20 trials): 18.5 before (jitter, but overspending its charge, see the
/// proof's correction), 19.0 with the grid at the old utility scale, 22.1 with
/// the grid and the corrected scale. 25 fails if the grid cost more than a
/// few ranks on top of the privacy correction.
#[test]
fn grid_keeps_the_accuracy_on_continuous_data() {
    let population = Population::Beta {
        share_at_bound: 0.0,
    };
    let report = compare_methods(2022, 50_000, population, &LEVELS, RHO, TRIALS);
    assert!(
        report.kss_mean_rank_error <= 25.0,
        "KSS mean rank error {}",
        report.kss_mean_rank_error
    );
}

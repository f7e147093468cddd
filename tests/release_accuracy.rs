//! The release accuracy benchmark, run as a test with statistical bounds (seeded;
//! no timing): n = 50,000 values B·Beta(1.5, 6), and the same with 20% exactly at
//! B, rho = 0.00125 for five quantiles; and heavily tied epsilons; training-like traces under the min rule with 20-40% at the atom B,
//! per group, and the histogram near B. Goal: KSS mean rank error at
//! most 30, at most 60 at every level.

use dpledger::release::accuracy::{
    compare_groups, compare_methods, histogram_near_bound, rank_error_within, AccuracyReport,
    Norms, Population,
};
use dpledger::release::quantiles::{
    cell_mechanism, cell_of, cell_value, kss_eta, resolution, AtomMass, Target, GRID_CELLS,
};
use rand::SeedableRng;
use rand_distr::{Binomial, Distribution};

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

/// Tied data: per-example epsilons of a run with stable norms (about 115
/// distinct values in runs of up to about 1,400). Before the grid mechanism KSS
/// measured 92 here (309 at resolution 0); the goal is 30. Rank errors count
/// ties as intervals at the release's public resolution `B / GRID_CELLS`: no
/// zCDP mechanism can hit a private value exactly (docs/releases-quantiles.md).
#[test]
fn kss_meets_the_rank_error_goal_on_tied_data() {
    let report = compare_methods(2022, 50_000, Population::Tied, &LEVELS, RHO, TRIALS);
    println!("{}", report.to_text());
    assert_eq!(report.resolution, resolution());
    assert!(report.resolution > 0.0 && report.resolution <= 1.0 / 8192.0);
    assert!(
        report.kss_mean_rank_error <= 30.0,
        "KSS mean rank error on tied data {}",
        report.kss_mean_rank_error
    );
    for row in &report.levels {
        assert!(row.kss_rank_error <= 60.0, "level {}: {row:?}", row.level);
    }
}

/// Mean and squared standard error of independent trials.
fn mean_and_variance_of_mean(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var / n)
}

/// Continuous data must not lose accuracy to the grid. The served grid (`2^13`
/// cells, chosen for ties: a cell holds up to about 18 values here) runs beside
/// the former fine grid (`2^16` cells, at most about 2.5 values per cell) in the
/// same run, at exact ranks (no credit for the resolution), 200 trials. 20
/// trials were too few: their mean on one grid ranged over 21.7-30.6 with the
/// random stream alone. The trials are independent, so the difference of the
/// two means has a standard error measured from the trials themselves; the
/// served grid may not be worse by more than four of them (about 5 ranks: a
/// grid of `2^11` cells, 11 ranks worse, fails), and both meet the goal of 30.
#[test]
fn grid_keeps_the_accuracy_on_continuous_data() {
    let population = Population::Beta {
        share_at_bound: 0.0,
    };
    let report = compare_methods(2022, 50_000, population, &LEVELS, RHO, 200);
    assert_eq!(report.resolution, 0.0, "exact ranks on continuous data");
    let (served, var_served) = mean_and_variance_of_mean(&report.kss_trial_means);
    let (fine, var_fine) = mean_and_variance_of_mean(&report.issue_15_grid_trial_means);
    assert!(
        (served - report.kss_mean_rank_error).abs() < 1e-9,
        "{report:?}"
    );
    let se = (var_served + var_fine).sqrt();
    println!(
        "continuous data, exact ranks, 200 trials: served grid {served:.1}, \
         former fine grid {fine:.1}, standard error of the difference {se:.2}"
    );
    // Not vacuous: four standard errors stay below 6 ranks.
    assert!(se < 1.5, "standard error {se}");
    assert!(served <= fine + 4.0 * se, "{served} vs {fine} ± {se}");
    assert!(served <= 30.0 && fine <= 30.0, "{served}, {fine}");
}

/// Atoms at the bound: training-like traces under the min rule, 20-40% of the values at
/// the public atom B with a dense region just below it, continuous or tied
/// (persistent norms). Rank errors at the release's public resolution.
fn check_min_rule(share_at_bound: f64, norms: Norms) -> AccuracyReport {
    let population = Population::MinRule {
        share_at_bound,
        norms,
    };
    let report = compare_methods(2022, 50_000, population, &LEVELS, RHO, TRIALS);
    println!("{}", report.to_text());
    assert!(report.share_at_bound >= share_at_bound, "{report:?}");
    // The mechanism's own error is ≈ 1/(η s) ≈ 17-28 ranks per level; the
    // level whose sub-problem follows the atom adds the atom count's noise
    // (σ = 2/η ≈ 35, times its fraction). Before atoms were sent whole the level just below
    // the atom was 600-1,000 ranks off (see `old_recursion_misses_below_the_atom`).
    assert!(
        report.kss_mean_rank_error <= 30.0,
        "KSS mean rank error {}",
        report.kss_mean_rank_error
    );
    for row in &report.levels {
        assert!(row.kss_rank_error <= 60.0, "level {}: {row:?}", row.level);
    }
    // The seed's method in the same run cannot reach the atom's edge.
    assert!(
        report.gradient_mean_rank_error > 2.0 * report.kss_mean_rank_error,
        "{report:?}"
    );
    report
}

#[test]
fn kss_meets_the_goal_on_min_rule_traces() {
    for share in [0.2, 0.3, 0.4] {
        check_min_rule(share, Norms::Varying);
    }
}

#[test]
fn kss_meets_the_goal_on_tied_min_rule_traces() {
    for share in [0.2, 0.3, 0.4] {
        check_min_rule(share, Norms::Persistent);
    }
}

/// Five persistent norm classes: every value tied, in runs of a few hundred
/// spread over the range with gaps between them. On the former fine grid of
/// `2^16` cells the gaps (about 50 empty cells each) outweighed a run covering
/// the target and KSS missed the goal (mean 30-35, worst level up to 75); the
/// served grid of `2^13` cells (gaps of a few cells) is run beside it in the
/// same report.
#[test]
fn kss_meets_the_goal_on_all_tied_min_rule_traces() {
    for share in [0.2, 0.3, 0.4] {
        let report = check_min_rule(share, Norms::Classes);
        assert!(
            report.kss_mean_rank_error < report.issue_15_grid_mean_rank_error,
            "{report:?}"
        );
    }
}

/// The recursion before atoms were sent whole: the chosen cell's values, atoms included,
/// split by fair coins, and both sides' levels rescaled as if the split were
/// at the target rank. Kept here to show the benchmark catches it.
fn old_kss(values: &[f64], levels: &[f64], rng: &mut rand_pcg::Pcg64) -> Vec<f64> {
    fn recurse(
        rng: &mut rand_pcg::Pcg64,
        cells: &[u32],
        (lo, hi): (u32, u32),
        levels: &[f64],
        eta: f64,
        out: &mut [u32],
    ) {
        if levels.is_empty() {
            return;
        }
        let p = levels.len() / 2;
        let q = levels[p];
        let t = Target {
            frac: q,
            offset: 0.0,
        };
        let (c, below, tied) = cell_mechanism(rng, cells, lo, hi, t, eta, AtomMass::default());
        out[p] = c;
        let split = below + Binomial::new(tied as u64, 0.5).unwrap().sample(rng) as usize;
        let left: Vec<f64> = levels[..p].iter().map(|&l| l / q).collect();
        let right: Vec<f64> = levels[p + 1..]
            .iter()
            .map(|&l| (l - q) / (1.0 - q))
            .collect();
        let (out_left, rest) = out.split_at_mut(p);
        recurse(rng, &cells[..split], (lo, c), &left, eta, out_left);
        recurse(rng, &cells[split..], (c, hi), &right, eta, &mut rest[1..]);
    }
    let mut cells: Vec<u32> = values.iter().map(|&x| cell_of(x, 1.0)).collect();
    cells.sort_unstable();
    let mut out = vec![0; levels.len()];
    let eta = kss_eta(levels.len(), RHO);
    recurse(rng, &cells, (0, GRID_CELLS + 1), levels, eta, &mut out);
    out.iter().map(|&c| cell_value(c, 1.0)).collect()
}

#[test]
fn old_recursion_misses_below_the_atom() {
    // Same trace and measure as above, 30% at B: the coin split of the atom
    // gives the 0.7 sub-problem about half the atom and a level rescaled for
    // 0.9·n values. Measured: 600-1,000 ranks at level 0.7; 200 is a third
    // of the smallest, and over three times the new bound of 60.
    let population = Population::MinRule {
        share_at_bound: 0.3,
        norms: Norms::Varying,
    };
    let mut xs = population.values(2022, 50_000, 1.0);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(29);
    let mut err = 0.0;
    for _ in 0..TRIALS {
        let est = old_kss(&xs, &LEVELS, &mut rng);
        xs.sort_by(f64::total_cmp);
        err += rank_error_within(&xs, 0.7, est[3], resolution()) / TRIALS as f64;
    }
    println!("old recursion, level 0.7, 30% at B: mean rank error {err:.1}");
    assert!(err >= 200.0, "{err}");
}

/// Item 3: the same through the per-group release path (labels = classes of
/// different difficulty, so atom shares range over about 5-55% by group).
#[test]
fn per_group_releases_meet_the_goal_near_the_atom() {
    for norms in [Norms::Varying, Norms::Persistent, Norms::Classes] {
        let report = compare_groups(2022, 50_000, 0.3, norms, &LEVELS, RHO, TRIALS);
        println!("{}", report.to_text());
        assert_eq!(report.groups.len(), 5);
        let shares: Vec<f64> = report.groups.iter().map(|g| g.share_at_bound).collect();
        let (lo, hi) = shares
            .iter()
            .fold((1.0f64, 0.0f64), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        assert!(lo < 0.2 && hi > 0.4, "{shares:?}");
        for g in &report.groups {
            // Same mechanism and per-level error as the population (absolute
            // ranks do not grow with a group's size), same bounds.
            assert!(g.kss_mean_rank_error <= 30.0, "{g:?}");
            assert!(g.kss_max_rank_error <= 60.0, "{g:?}");
        }
    }
}

/// Item 3: the histogram's bins near B are plain Gaussian counts (the atom
/// lands in the closed last bin): their error is the noise's, no more.
#[test]
fn histogram_bins_near_the_bound_are_unbiased() {
    let r = histogram_near_bound(2022, 50_000, 0.3, Norms::Varying, 20, 3, RHO, 200);
    println!("{}", r.to_text());
    let last = r.near_bound.last().unwrap();
    assert!(
        last.at_bound >= 15_000 && last.exact > last.at_bound,
        "{last:?}"
    );
    // 200 trials × 3 bins: the mean |error| of Gaussian noise has a standard
    // error of about 0.6σ/sqrt(600) ≈ 0.5 here (σ = 20); ±20% of
    // σ·sqrt(2/π) ≈ 16 is over six of them, and fails if the noise doubled or
    // a bin lost its values.
    let expect = r.sigma * (2.0 / std::f64::consts::PI).sqrt();
    assert!(
        (r.mean_abs_error - expect).abs() <= 0.2 * expect,
        "{} vs {expect}",
        r.mean_abs_error
    );
    for b in &r.near_bound {
        // The mean of 200 errors has a standard error σ/sqrt(200) ≈ 1.4.
        assert!(b.bias.abs() <= 6.0, "{b:?}");
    }
}

//! An independent statistical audit of what the per-example numbers of spec §10
//! and §7 claim, without the service: 1-D DP-SGD is simulated here, the exact
//! privacy-loss random variable of each transcript is computed, and the claims are
//! checked over many seeded runs with exact binomial confidence bounds.
//!
//! The model. One example, clipping norm `C = 1`, noise multiplier `sigma`; the
//! other examples' contributions are public and taken as 0. At step `t` the
//! threshold `c_t` is PREDICTABLE (a function of the earlier outputs only), the
//! example's gradient is at least `c_t` (adversarial), and with Poisson bit
//! `B_t ~ Bernoulli(q)` the output is `o_t = B_t c_t + N(0, sigma^2)` under `P'`
//! (example in) and `N(0, sigma^2)` under `P`. The privacy loss of a transcript
//! is exactly `L = sum_t ln[(1 - q) + q exp((2 o_t c_t - c_t^2) / (2 sigma^2))]`
//! (each factor is the step's likelihood ratio given the past, because `c_t` is
//! a function of the past).
//!
//! Claims checked (each over 20,000 runs; a claim "p <= delta" fails only if the
//! exact one-sided binomial test rejects it at false-alarm probability 1e-6, i.e.
//! the Clopper–Pearson lower confidence bound of p exceeds delta):
//! * ex post (§10): `P'(L > eps_i) <= delta` with `eps_i` from
//!   `R^thr(alpha) = sum_t SGM_RDP(q, sigma C / c_t, alpha)` through
//!   [`ex_post_epsilon`], under adversarial threshold policies;
//! * the individual filter (§7): with retirement before the first step whose
//!   predictable charge would exceed the budget, the charge sum is `<= B` on
//!   EVERY run, and the real claim, the hockey-stick divergence
//!   `E_P'[(1 - e^(eps - L))_+] <= delta` at `eps = eps_improved(B, delta)`, is
//!   estimated without bias (each run contributes a Bernoulli with that mean);
//!   the classic tail `P'(L > B + ln(1/delta)/(alpha - 1)) <= delta` too;
//! * negative controls that show the audit has power: the old served number
//!   (improved conversion of the realized sum) in §10's full-batch
//!   counterexample, and the ex-post formula fed with the old protocol's
//!   non-predictable ledger (§10's hidden-sampling flaw): both are rejected;
//! * exact 1-D integrals for §10's two counterexamples at the spec's parameters.

use dpledger::accounting::conversion::{epsilon_from_rdp, Conversion};
use dpledger::accounting::ex_post::{equal_weights, ex_post_epsilon};
use dpledger::accounting::orders::default_orders;
use dpledger::accounting::sgm::sgm_rdp;
use dpledger::accounting::special::log_factorial;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rand_pcg::Pcg64;

const RUNS: u64 = 20_000;
/// False-alarm probability of every one-sided binomial test here.
const ALARM: f64 = 1e-6;
const DELTA: f64 = 0.05;
/// The ex-post mixture's orders in the audit (equal weights), fixed in advance.
const ORDERS: [f64; 10] = [1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0];
/// Threshold levels the policies may use (as fractions of C = 1).
const LEVELS: [f64; 5] = [0.0, 0.1, 0.25, 0.5, 1.0];

/// `ln P(Bin(n, p) >= k)`, summed exactly in log space.
fn ln_binomial_upper_tail(n: u64, k: u64, p: f64) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let (lp, lq) = (p.ln(), (-p).ln_1p());
    let terms: Vec<f64> = (k..=n)
        .map(|j| {
            log_factorial(n) - log_factorial(j) - log_factorial(n - j)
                + j as f64 * lp
                + (n - j) as f64 * lq
        })
        .collect();
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}

/// Whether `k` successes in `n` trials reject "success probability <= p" at
/// false-alarm probability [`ALARM`] (equivalently: the Clopper–Pearson lower
/// confidence bound at level 1 - ALARM is above p).
fn rejects(n: u64, k: u64, p: f64) -> bool {
    ln_binomial_upper_tail(n, k, p) < ALARM.ln()
}

/// `ln[(1 - q) + q exp(x)]` without overflow.
fn ln_mix(q: f64, x: f64) -> f64 {
    if q >= 1.0 {
        return x;
    }
    let (a, b) = ((-q).ln_1p(), q.ln() + x);
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// A predictable threshold policy: the level index for step `t` from the past
/// outputs `o_1..o_{t-1}`.
type Policy = fn(&[f64]) -> usize;

/// `C` throughout.
fn constant(_: &[f64]) -> usize {
    4
}
/// `C` until some output exceeds 2, then 0.1 (the loud example goes quiet).
fn loud_then_quiet(past: &[f64]) -> usize {
    if past.iter().any(|&o| o > 2.0) {
        1
    } else {
        4
    }
}
/// 0.25 until some output exceeds 1.5, then `C`.
fn quiet_then_loud(past: &[f64]) -> usize {
    if past.iter().any(|&o| o > 1.5) {
        4
    } else {
        2
    }
}
/// `C` after a positive output, 0.25 after a negative one (alternating by sign).
fn by_last_sign(past: &[f64]) -> usize {
    match past.last() {
        Some(&o) if o <= 0.0 => 2,
        _ => 4,
    }
}
/// `C` while the running sum is negative, 0.1 otherwise; 0.5 at the start.
fn by_running_sum(past: &[f64]) -> usize {
    if past.is_empty() {
        3
    } else if past.iter().sum::<f64>() < 0.0 {
        4
    } else {
        1
    }
}
/// Spec §10's full-batch policy: `C` at step 1; at step 2 `C` only if `o_1 > 2`.
fn full_batch_counterexample(past: &[f64]) -> usize {
    match past.first() {
        None => 4,
        Some(&o) if o > 2.0 => 4,
        Some(_) => 0,
    }
}

/// Per-level, per-order one-step RDP: `SGM_RDP(q, sigma / c, alpha)` (0 at c = 0).
fn level_table(q: f64, sigma: f64, orders: &[f64]) -> Vec<Vec<f64>> {
    LEVELS
        .iter()
        .map(|&c| {
            orders
                .iter()
                .map(|&a| {
                    if c == 0.0 {
                        0.0
                    } else {
                        sgm_rdp(q, sigma / c, a)
                    }
                })
                .collect()
        })
        .collect()
}

/// One transcript under `P'`: (privacy loss L, level index used at each step).
fn run_once(
    rng: &mut Pcg64,
    q: f64,
    sigma: f64,
    steps: usize,
    policy: Policy,
) -> (f64, Vec<usize>) {
    let mut past = Vec::with_capacity(steps);
    let mut levels = Vec::with_capacity(steps);
    let mut loss = 0.0;
    for _ in 0..steps {
        let k = policy(&past);
        let c = LEVELS[k];
        let sampled = rng.random_bool(q);
        let noise: f64 = StandardNormal.sample(rng);
        let o = if sampled { c } else { 0.0 } + sigma * noise;
        if c > 0.0 {
            loss += ln_mix(q, (2.0 * o * c - c * c) / (2.0 * sigma * sigma));
        }
        past.push(o);
        levels.push(k);
    }
    (loss, levels)
}

fn ex_post_of(table: &[Vec<f64>], levels: &[usize], delta: f64) -> f64 {
    let mut rdp = vec![0.0; ORDERS.len()];
    for &k in levels {
        for (r, v) in rdp.iter_mut().zip(&table[k]) {
            *r += v;
        }
    }
    ex_post_epsilon(&ORDERS, &equal_weights(ORDERS.len()), &rdp, delta)
}

struct Scenario {
    name: &'static str,
    q: f64,
    sigma: f64,
    steps: usize,
    policy: Policy,
}

#[test]
fn ex_post_tail_bound_holds_under_adaptive_thresholds() {
    let scenarios = [
        Scenario {
            name: "constant C",
            q: 0.5,
            sigma: 1.0,
            steps: 10,
            policy: constant,
        },
        Scenario {
            name: "loud then quiet",
            q: 0.5,
            sigma: 1.0,
            steps: 10,
            policy: loud_then_quiet,
        },
        Scenario {
            name: "quiet then loud",
            q: 0.5,
            sigma: 1.0,
            steps: 10,
            policy: quiet_then_loud,
        },
        Scenario {
            name: "by last sign",
            q: 0.3,
            sigma: 0.8,
            steps: 12,
            policy: by_last_sign,
        },
        Scenario {
            name: "by running sum",
            q: 1.0,
            sigma: 1.5,
            steps: 6,
            policy: by_running_sum,
        },
        Scenario {
            name: "full-batch counterexample",
            q: 1.0,
            sigma: 1.0,
            steps: 2,
            policy: full_batch_counterexample,
        },
        Scenario {
            name: "small sigma",
            q: 0.2,
            sigma: 0.5,
            steps: 8,
            policy: loud_then_quiet,
        },
    ];
    for (i, s) in scenarios.iter().enumerate() {
        let table = level_table(s.q, s.sigma, &ORDERS);
        let mut rng = Pcg64::seed_from_u64(1000 + i as u64);
        let mut violations = 0u64;
        let mut mean_eps = 0.0;
        for _ in 0..RUNS {
            let (loss, levels) = run_once(&mut rng, s.q, s.sigma, s.steps, s.policy);
            let eps = ex_post_of(&table, &levels, DELTA);
            assert!(eps > 0.0 && eps.is_finite(), "{}: eps {eps}", s.name);
            mean_eps += eps / RUNS as f64;
            if loss > eps {
                violations += 1;
            }
        }
        eprintln!(
            "ex post, {}: P'(L > eps_i) ~ {:.4} (delta {DELTA}), mean eps_i {mean_eps:.3}",
            s.name,
            violations as f64 / RUNS as f64
        );
        assert!(
            !rejects(RUNS, violations, DELTA),
            "{}: {violations} of {RUNS} runs have L > eps_i: P'(L > eps_i) <= {DELTA} is rejected",
            s.name
        );
    }
}

/// The improved conversion (spec §5) at one order.
fn eps_improved(alpha: f64, rdp: f64, delta: f64) -> f64 {
    epsilon_from_rdp(&[alpha], &[rdp], delta, Conversion::Improved).epsilon
}

#[test]
fn individual_filter_keeps_the_budget_on_every_run() {
    // Budget B at order 4; retirement (threshold 0 from then on) before the
    // first step whose predictable charge would push the sum over B.
    let (alpha, budget, q, sigma, steps) = (4.0, 2.0, 0.5, 1.0, 12usize);
    let table = level_table(q, sigma, &[alpha]);
    let eps_b = eps_improved(alpha, budget, DELTA);
    let eps_classic = budget + (1.0 / DELTA).ln() / (alpha - 1.0);
    let policies: [(&str, Policy); 3] = [
        ("constant C", constant),
        ("quiet then loud", quiet_then_loud),
        ("by last sign", by_last_sign),
    ];
    for (i, (name, policy)) in policies.iter().enumerate() {
        let mut rng = Pcg64::seed_from_u64(2000 + i as u64);
        let (mut hs_hits, mut tail_hits, mut retired) = (0u64, 0u64, 0u64);
        let mut worst_sum: f64 = 0.0;
        for _ in 0..RUNS {
            let mut past = Vec::with_capacity(steps);
            let (mut loss, mut sum, mut is_retired) = (0.0, 0.0, false);
            for _ in 0..steps {
                let mut k = policy(&past);
                if !is_retired && sum + table[k][0] > budget {
                    is_retired = true;
                    retired += 1;
                }
                if is_retired {
                    k = 0;
                }
                sum += table[k][0];
                let c = LEVELS[k];
                let sampled = rng.random_bool(q);
                let noise: f64 = StandardNormal.sample(&mut rng);
                let o = if sampled { c } else { 0.0 } + sigma * noise;
                if c > 0.0 {
                    loss += ln_mix(q, (2.0 * o * c - c * c) / (2.0 * sigma * sigma));
                }
                past.push(o);
            }
            assert!(
                sum <= budget,
                "{name}: charges {sum} exceed the budget {budget}"
            );
            worst_sum = worst_sum.max(sum);
            // Unbiased Bernoulli for the hockey-stick divergence at eps_b:
            // success with probability (1 - e^(eps_b - L))_+.
            let hs = (1.0 - (eps_b - loss).exp()).max(0.0);
            if rng.random::<f64>() < hs {
                hs_hits += 1;
            }
            if loss > eps_classic {
                tail_hits += 1;
            }
        }
        eprintln!(
            "filter, {name}: retired {retired}, largest charge sum {worst_sum:.3} <= B {budget}, \
             hockey stick at eps_improved(B) {eps_b:.3} ~ {:.5}, P'(L > {eps_classic:.3}) ~ {:.5}",
            hs_hits as f64 / RUNS as f64,
            tail_hits as f64 / RUNS as f64
        );
        assert!(
            retired > RUNS / 20,
            "{name}: the budget must bind on some runs"
        );
        assert!(
            !rejects(RUNS, hs_hits, DELTA),
            "{name}: hockey stick above delta"
        );
        assert!(
            !rejects(RUNS, tail_hits, DELTA),
            "{name}: classic tail above delta"
        );
    }
}

/// Standard normal CDF.
fn phi_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

fn phi_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Hockey-stick divergence `E_{N(mu,1)}[(1 - e^(eps - L))_+]` of N(mu, 1) against
/// N(0, 1) at any real eps (closed form).
fn gaussian_hockey_stick(mu: f64, eps: f64) -> f64 {
    (phi_cdf(mu / 2.0 - eps / mu) - eps.exp() * phi_cdf(-mu / 2.0 - eps / mu)).max(0.0)
}

/// Composite Simpson rule on [a, b] with n (even) intervals.
fn simpson(f: impl Fn(f64) -> f64, a: f64, b: f64, n: usize) -> f64 {
    let h = (b - a) / n as f64;
    let mut s = f(a) + f(b);
    for i in 1..n {
        s += f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0
}

/// Hockey-stick divergence at e^eps of spec §10's full-batch mechanism (q = 1,
/// sigma = 1; step 1 mean 1; step 2 mean 1 only if o_1 > 2), by 1-D integration
/// over o_1 (the step-2 part in closed form).
fn full_batch_hockey_stick(eps: f64) -> f64 {
    let low = simpson(
        |o| phi_pdf(o - 1.0) * (1.0 - (eps - (o - 0.5)).exp()).max(0.0),
        -12.0,
        2.0,
        200_000,
    );
    let high = simpson(
        |o| phi_pdf(o - 1.0) * gaussian_hockey_stick(1.0, eps - (o - 0.5)),
        2.0,
        14.0,
        200_000,
    );
    low + high
}

/// The improved conversion over dp-accounting's default orders of `rdp(alpha)`.
fn served_improved(rdp: impl Fn(f64) -> f64, delta: f64) -> f64 {
    let orders = default_orders();
    let r: Vec<f64> = orders.iter().map(|&a| rdp(a)).collect();
    epsilon_from_rdp(&orders, &r, delta, Conversion::Improved).epsilon
}

#[test]
fn negative_control_realized_sum_in_the_full_batch_counterexample() {
    // Exact, at the spec's delta: the low branch (R = alpha/2) is served 4.73,
    // yet the mechanism's hockey-stick divergence at e^4.73 is 1.24e-3.
    let served = served_improved(|a| a / 2.0, 1e-5);
    assert!((served - 4.7285).abs() < 1e-3, "served {served}");
    let hs = full_batch_hockey_stick(served);
    eprintln!("full batch: served {served:.4} at delta 1e-5, hockey stick {hs:.4e}");
    assert!((hs - 1.2357e-3).abs() < 2e-6, "hockey stick {hs}");
    assert!(hs > 100.0 * 1e-5);

    // Monte Carlo, with the same estimator as the filter test, at delta 1e-3
    // (served 3.54 on the low branch; exact divergence 1.1e-2): the audit rejects.
    let delta = 1e-3;
    let served_low = served_improved(|a| a / 2.0, delta);
    let exact = full_batch_hockey_stick(served_low);
    let mut rng = Pcg64::seed_from_u64(3000);
    let mut hits = 0u64;
    for _ in 0..RUNS {
        // The old service served eps_improved of the realized sum as a guarantee:
        // on the low branch (R = alpha/2) that claims the mechanism is
        // (served_low, delta)-DP for the example, i.e. hockey stick <= delta.
        let (loss, _) = run_once(&mut rng, 1.0, 1.0, 2, full_batch_counterexample);
        let hs = (1.0 - (served_low - loss).exp()).max(0.0);
        if rng.random::<f64>() < hs {
            hits += 1;
        }
    }
    eprintln!(
        "full batch Monte Carlo at delta {delta}: hockey stick at e^{served_low:.3} ~ {:.4} \
         (exact {exact:.4})",
        hits as f64 / RUNS as f64
    );
    assert!(
        rejects(RUNS, hits, delta),
        "the audit must detect the violation"
    );
}

#[test]
fn negative_control_hidden_sampling_ledger_fed_to_ex_post() {
    // Spec §10's hidden-sampling flaw in the old protocol: norm 0 at step 1,
    // C at step 2; a sampled report at step 1 moves the threshold to 0, so that
    // branch is charged nothing, though o_2 depends on the example through the
    // branch where it was NOT sampled at step 1. Feeding that (non-predictable)
    // ledger to the ex-post formula breaks P'(L > eps) <= delta; the audit sees it.
    let (q, sigma) = (0.5, 1.0);
    let table = level_table(q, sigma, &ORDERS);
    let mut rng = Pcg64::seed_from_u64(4000);
    let mut violations = 0u64;
    for _ in 0..RUNS {
        let b1 = rng.random_bool(q);
        let b2 = rng.random_bool(q);
        // o_1 does not depend on the example (norm 0) and is not simulated.
        let n2: f64 = StandardNormal.sample(&mut rng);
        let contributes = !b1 && b2; // threshold still C only if not sampled at step 1
        let o2 = if contributes { 1.0 } else { 0.0 } + sigma * n2;
        // Given o_1 (independent of the example), o_2's law under P' is the
        // mixture (1 - p) N(0,1) + p N(1,1), p = q(1-q).
        let p = q * (1.0 - q);
        let loss = ln_mix(p, (2.0 * o2 - 1.0) / (2.0 * sigma * sigma));
        // Old ledger: threshold C charged at both steps unless sampled at step 1.
        let levels: &[usize] = if b1 { &[0, 0] } else { &[4, 4] };
        let eps = ex_post_of(&table, levels, DELTA);
        if loss > eps {
            violations += 1;
        }
    }
    eprintln!(
        "hidden sampling fed to ex post: P'(L > eps) ~ {:.4} (delta {DELTA})",
        violations as f64 / RUNS as f64
    );
    assert!(rejects(RUNS, violations, DELTA));
}

#[test]
fn hidden_sampling_counterexample_total_variation() {
    // T = 2, norm 0 at step 1 and C at step 2, q = 256/60000, sigma = 1: the
    // step-2 output is (1 - p) N(0,1) + p N(1,1) with p = q(1-q) against N(0,1).
    let q = 256.0 / 60000.0;
    let p = q * (1.0 - q);
    for a in [1.5, 2.0, 8.0, 32.0] {
        assert!(
            sgm_rdp(p, 1.0, a) > 0.0,
            "true per-instance RDP at order {a}"
        );
    }
    let tv = 0.5
        * simpson(
            |x| ((1.0 - p) * phi_pdf(x) + p * phi_pdf(x - 1.0) - phi_pdf(x)).abs(),
            -14.0,
            15.0,
            400_000,
        );
    let closed = p * (2.0 * phi_cdf(0.5) - 1.0);
    eprintln!("hidden sampling: total variation {tv:.6e} (closed form {closed:.6e})");
    assert!((tv - closed).abs() < 1e-9 * closed.max(1.0) + 1e-10);
    assert!((tv - 1.6e-3).abs() < 0.05e-3, "{tv}");
    assert!(tv > 1e-5, "so the served (0, 1e-5) is false");
}

#[test]
fn binomial_test_sanity() {
    // 1000 of 20000 at p = 0.05 is the mean: not rejected; 1300 is (7 sigma).
    assert!(!rejects(20_000, 1000, 0.05));
    assert!(rejects(20_000, 1300, 0.05));
    assert!(!rejects(20_000, 0, 0.05));
    let t = ln_binomial_upper_tail(10, 1, 0.5).exp();
    assert!((t - (1.0 - 0.5f64.powi(10))).abs() < 1e-12);
}

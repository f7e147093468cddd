//! The fast ledger against naive references written straight from spec §3: every
//! example charged at every step, no prefix sums, no tables.

use dpledger::accounting::conversion::{epsilon_from_rdp, Conversion};
use dpledger::accounting::grid::BucketGrid;
use dpledger::accounting::sgm::{gaussian_rdp, sgm_rdp};
use dpledger::ledger::DatasetConfigExt;
use dpledger::ledger::{
    replay, Clipping, DatasetConfig, ErrorKind, IndividualBudget, Ledger, LedgerError, LedgerKind,
    Part, PrivacyKind, RefreshSchedule, Sampling, StepReport, ThresholdMode, FILTER_MARGIN,
    RETRY_WINDOW,
};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::collections::HashMap;

const DELTA: f64 = 1e-5;
const ORDERS: [f64; 8] = [1.5, 2.0, 3.0, 5.5, 8.0, 16.0, 32.0, 64.0];
const SIGMAS: [f64; 3] = [0.8, 1.1, 2.0];
const RATES: [f64; 5] = [0.0, 0.02, 0.1, 0.35, 1.0];

// ---------------------------------------------------------------- references

/// Memoised per-step RDP (the references are O(n) per step; memoising the pure
/// function keeps 200 traces fast without changing what is computed).
#[derive(Default)]
struct Rho {
    memo: HashMap<(u8, u64, u64, u64), f64>,
}

impl Rho {
    fn sgm(&mut self, q: f64, sigma_eff: f64, alpha: f64) -> f64 {
        *self
            .memo
            .entry((0, q.to_bits(), sigma_eff.to_bits(), alpha.to_bits()))
            .or_insert_with(|| sgm_rdp(q, sigma_eff, alpha))
    }

    fn gauss(&mut self, sigma_eff: f64, alpha: f64) -> f64 {
        *self
            .memo
            .entry((1, 0, sigma_eff.to_bits(), alpha.to_bits()))
            .or_insert_with(|| gaussian_rdp(sigma_eff, alpha))
    }
}

/// Spec §3 verbatim, Poisson sampling, with an optional naive individual filter.
struct Naive {
    grid: BucketGrid,
    orders: Vec<f64>,
    b: Vec<u32>,
    acc: Vec<Vec<f64>>,
    worst: Vec<f64>,
    retired: Vec<bool>,
    /// (alpha* index, decision limit, budget) of the filter.
    filter: Option<(usize, f64, f64)>,
    /// Examples seen past the budget (by steps charging more than announced).
    over: Vec<bool>,
    /// Default hyperparameters `(q, sigma)` and those of the latest step: the
    /// filter bounds the next step's charge by the larger of the two.
    default: (f64, f64),
    last: (f64, f64),
}

impl Naive {
    fn new(grid: BucketGrid, orders: &[f64], n: usize, q: f64, sigma: f64) -> Self {
        Self {
            grid,
            orders: orders.to_vec(),
            b: vec![grid.top(); n],
            acc: vec![vec![0.0; orders.len()]; n],
            worst: vec![0.0; orders.len()],
            retired: vec![false; n],
            over: vec![false; n],
            filter: None,
            default: (q, sigma),
            last: (q, sigma),
        }
    }

    fn rho(&self, rho: &mut Rho, q: f64, sigma: f64, k: u32, alpha: f64) -> f64 {
        if k == 0 {
            0.0
        } else {
            rho.sgm(q, self.grid.effective_sigma(sigma, k), alpha)
        }
    }

    /// Returns the ids the filter retires after the step.
    fn step(&mut self, rho: &mut Rho, q: f64, sigma: f64, ids: &[u64], norms: &[f64]) -> Vec<u64> {
        let sampled: HashMap<usize, f64> = ids
            .iter()
            .map(|&i| i as usize)
            .zip(norms.iter().copied())
            .collect();
        for i in 0..self.b.len() {
            let k = match sampled.get(&i) {
                Some(&g) => self.b[i].min(self.grid.bucket_of(g)),
                None => self.b[i],
            };
            for j in 0..self.orders.len() {
                let r = self.rho(rho, q, sigma, k, self.orders[j]);
                self.acc[i][j] += r;
            }
        }
        for (&i, &g) in &sampled {
            if !self.retired[i] {
                self.b[i] = self.grid.bucket_of(g);
            }
        }
        for j in 0..self.orders.len() {
            self.worst[j] += self.rho(rho, q, sigma, self.grid.top(), self.orders[j]);
        }
        self.last = (q, sigma);
        self.run_filter(rho)
    }

    fn refresh(&mut self, rho: &mut Rho, ids: &[u64], norms: &[f64]) -> Vec<u64> {
        for (&i, &g) in ids.iter().zip(norms) {
            if !self.retired[i as usize] {
                self.b[i as usize] = self.grid.bucket_of(g);
            }
        }
        self.run_filter(rho)
    }

    fn run_filter(&mut self, rho: &mut Rho) -> Vec<u64> {
        let Some((j, limit, budget)) = self.filter else {
            return Vec::new();
        };
        for i in 0..self.b.len() {
            if !self.retired[i] && self.acc[i][j] > budget {
                self.over[i] = true;
            }
        }
        let ((q0, s0), (q, sigma)) = (self.default, self.last);
        let mut out = Vec::new();
        for i in 0..self.b.len() {
            if self.retired[i] {
                continue;
            }
            let next = self
                .rho(rho, q, sigma, self.b[i], self.orders[j])
                .max(self.rho(rho, q0, s0, self.b[i], self.orders[j]));
            if self.acc[i][j] + next > limit {
                self.retired[i] = true;
                self.b[i] = 0;
                out.push(i as u64);
            }
        }
        out
    }
}

/// The same ledger with exact (unrounded) thresholds: effective sigma `sigma C / min(g, C)`.
struct NaiveUnrounded {
    c: f64,
    orders: Vec<f64>,
    clip: Vec<f64>,
    acc: Vec<Vec<f64>>,
}

impl NaiveUnrounded {
    fn rho(rho: &mut Rho, c_max: f64, q: f64, sigma: f64, c: f64, alpha: f64) -> f64 {
        if c <= 0.0 {
            0.0
        } else if c >= c_max {
            rho.sgm(q, sigma, alpha)
        } else {
            rho.sgm(q, sigma * (c_max / c), alpha)
        }
    }

    fn step(&mut self, rho: &mut Rho, q: f64, sigma: f64, ids: &[u64], norms: &[f64]) {
        let sampled: HashMap<usize, f64> = ids
            .iter()
            .map(|&i| i as usize)
            .zip(norms.iter().copied())
            .collect();
        for i in 0..self.clip.len() {
            let c = match sampled.get(&i) {
                Some(&g) => self.clip[i].min(g.min(self.c)),
                None => self.clip[i],
            };
            for j in 0..self.orders.len() {
                self.acc[i][j] += Self::rho(rho, self.c, q, sigma, c, self.orders[j]);
            }
        }
        for (&i, &g) in &sampled {
            self.clip[i] = g.min(self.c);
        }
    }

    fn refresh(&mut self, ids: &[u64], norms: &[f64]) {
        for (&i, &g) in ids.iter().zip(norms) {
            self.clip[i as usize] = g.min(self.c);
        }
    }
}

// ---------------------------------------------------------------- traces

#[derive(Debug, Clone)]
enum Event {
    Step(StepReport),
    Refresh(Vec<u64>, Vec<f64>),
    Compact,
}

#[derive(Debug, Clone)]
struct Trace {
    config: DatasetConfig,
    events: Vec<Event>,
}

/// A norm from the interesting places: exactly C, 0, huge, tiny, exactly at a bucket
/// edge, just above one, or anywhere.
fn random_norm(rng: &mut Pcg64, grid: &BucketGrid, at_least_c: bool) -> f64 {
    let c = grid.max_norm();
    if at_least_c {
        return match rng.random_range(0..4) {
            0 => c,
            1 => c * (1.0 + 1e-12),
            2 => 1e300,
            _ => c * rng.random_range(1.0..5.0),
        };
    }
    let k = rng.random_range(0..=grid.top());
    match rng.random_range(0..9) {
        0 => c,
        1 => 0.0,
        2 => 1e300,
        3 => 1e-300,
        4 => grid.value(k),
        5 => grid.value(k) * (1.0 + 1e-12),
        6 => f64::MAX,
        _ => rng.random_range(0.0..1.5 * c),
    }
}

fn random_config(rng: &mut Pcg64, n_max: u64) -> DatasetConfig {
    let c = *[1.0, 2.5].choose(rng).unwrap();
    let rounding = *[None, Some(c / 8.0), Some(c / 37.0)].choose(rng).unwrap();
    DatasetConfig {
        examples: rng.random_range(1..=n_max),
        max_grad_norm: c,
        rounding,
        noise_multiplier: *SIGMAS.choose(rng).unwrap(),
        sampling: Sampling::Poisson {
            rate: *RATES[1..4].choose(rng).unwrap(),
        },
        orders: Some(ORDERS.to_vec()),
        delta: DELTA,
        clipping: Clipping::PerExample,
        individual_budget: None,
        label_budgets: None,
        thresholds: None,
        refresh: None,
        planned_steps: None,
        ex_post: None,
    }
}

/// A random Poisson trace: schedules that change sigma and q, refreshes, empty
/// steps, compactions, all the edge-case norms.
fn random_trace(rng: &mut Pcg64, config: DatasetConfig, steps: u64, at_least_c: bool) -> Trace {
    let grid = config.grid().unwrap();
    let n = config.examples;
    let Sampling::Poisson { rate } = config.sampling else {
        unreachable!()
    };
    let mut events = Vec::new();
    for t in 0..steps {
        if rng.random_bool(0.1) {
            let mut ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.3)).collect();
            ids.shuffle(rng);
            let norms = ids
                .iter()
                .map(|_| random_norm(rng, &grid, at_least_c))
                .collect();
            events.push(Event::Refresh(ids, norms));
        }
        if rng.random_bool(0.05) {
            events.push(Event::Compact);
        }
        let noise_multiplier = rng.random_bool(0.25).then(|| *SIGMAS.choose(rng).unwrap());
        let sampling_rate = rng.random_bool(0.25).then(|| *RATES.choose(rng).unwrap());
        let q = sampling_rate.unwrap_or(rate);
        let mut ids: Vec<u64> = if rng.random_bool(0.1) {
            Vec::new()
        } else {
            (0..n).filter(|_| rng.random_bool(q)).collect()
        };
        ids.shuffle(rng);
        let norms = ids
            .iter()
            .map(|_| random_norm(rng, &grid, at_least_c))
            .collect();
        events.push(Event::Step(StepReport {
            step: t,
            ids,
            norms,
            noise_multiplier,
            sampling_rate,
            part: None,
        }));
    }
    Trace { config, events }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-300
}

fn assert_rdp_close(fast: &[f64], naive: &[f64], what: &str) {
    for (j, (&f, &s)) in fast.iter().zip(naive).enumerate() {
        assert!(
            close(f, s, 1e-9),
            "{what}: order #{j}: fast {f} vs naive {s}"
        );
    }
}

/// Run a trace through the fast ledger and the naive reference and compare them.
fn check_against_naive(trace: &Trace, rho: &mut Rho) {
    let cfg = &trace.config;
    let grid = cfg.grid().unwrap();
    let Sampling::Poisson { rate } = cfg.sampling else {
        unreachable!()
    };
    let mut fast = Ledger::new(cfg.clone()).unwrap();
    let orders = fast.orders().to_vec();
    let mut naive = Naive::new(
        grid,
        &orders,
        cfg.examples as usize,
        rate,
        cfg.noise_multiplier,
    );
    for event in &trace.events {
        match event {
            Event::Step(r) => {
                let out = fast.step(r).unwrap();
                let q = r.sampling_rate.unwrap_or(rate);
                let s = r.noise_multiplier.unwrap_or(cfg.noise_multiplier);
                naive.step(rho, q, s, &r.ids, &r.norms);
                let expected: Vec<f64> = r
                    .norms
                    .iter()
                    .map(|&g| grid.value(grid.bucket_of(g)))
                    .collect();
                assert_eq!(out.thresholds, expected);
                assert!(out.complete && !out.duplicate);
            }
            Event::Refresh(ids, norms) => {
                fast.refresh(ids, norms).unwrap();
                naive.refresh(rho, ids, norms);
            }
            Event::Compact => fast.compact(),
        }
    }
    let worst = fast.worst_case(DELTA, Conversion::Improved).unwrap();
    assert_rdp_close(&worst.rdp, &naive.worst, "worst case");
    let thresholds = fast.thresholds(0..cfg.examples).unwrap();
    let all = fast.all_epsilons(DELTA, Conversion::Classic).unwrap();
    for i in 0..cfg.examples as usize {
        let p = fast.privacy(i as u64, DELTA, Conversion::Improved).unwrap();
        assert_rdp_close(&p.rdp, &naive.acc[i], &format!("example {i}"));
        assert!(p
            .rdp
            .iter()
            .zip(&worst.rdp)
            .all(|(a, w)| *a <= *w * (1.0 + 1e-12)));
        let e = epsilon_from_rdp(&orders, &naive.acc[i], DELTA, Conversion::Improved);
        assert!(
            close(p.rdp_epsilon, e.epsilon, 1e-9),
            "example {i}: eps {} vs {}",
            p.rdp_epsilon,
            e.epsilon
        );
        // The sampled protocol's ledger is an estimate; the guarantee is the worst case.
        assert_eq!(p.estimate.kind, PrivacyKind::Estimate);
        assert_eq!(p.guarantee.kind, PrivacyKind::WorstCase);
        assert!(p.ex_post.is_none());
        let c = epsilon_from_rdp(&orders, &naive.acc[i], DELTA, Conversion::Classic);
        assert!(close(all[i], c.epsilon, 1e-9));
        assert_eq!(thresholds[i], grid.value(naive.b[i]));
        assert_eq!(p.threshold, grid.value(naive.b[i]));
    }
}

// ---------------------------------------------------------------- tests

#[test]
fn fast_ledger_matches_the_naive_reference_on_200_traces() {
    let mut rho = Rho::default();
    for seed in 0..200u64 {
        let mut rng = Pcg64::seed_from_u64(seed);
        let config = random_config(&mut rng, 300);
        let steps = rng.random_range(0..30);
        let trace = random_trace(&mut rng, config, steps, false);
        check_against_naive(&trace, &mut rho);
    }
}

#[test]
fn fast_ledger_matches_the_naive_reference_with_the_64_ledger_orders() {
    let mut rho = Rho::default();
    for seed in 1000..1004u64 {
        let mut rng = Pcg64::seed_from_u64(seed);
        let mut config = random_config(&mut rng, 40);
        config.orders = None;
        config.rounding = Some(config.max_grad_norm / 8.0);
        let trace = random_trace(&mut rng, config, 12, false);
        check_against_naive(&trace, &mut rho);
    }
}

#[test]
fn norms_at_or_above_c_give_exactly_the_worst_case() {
    for seed in 0..40u64 {
        let mut rng = Pcg64::seed_from_u64(7_000 + seed);
        let config = random_config(&mut rng, 60);
        let steps = rng.random_range(1..40);
        let trace = random_trace(&mut rng, config.clone(), steps, true);
        let mut fast = Ledger::new(config).unwrap();
        for event in &trace.events {
            match event {
                Event::Step(r) => drop(fast.step(r).unwrap()),
                Event::Refresh(ids, norms) => drop(fast.refresh(ids, norms).unwrap()),
                Event::Compact => fast.compact(),
            }
        }
        for conversion in [Conversion::Improved, Conversion::Classic] {
            let worst = fast.worst_case(DELTA, conversion).unwrap();
            let all = fast.all_epsilons(DELTA, conversion).unwrap();
            for (i, &eps) in all.iter().enumerate() {
                assert_eq!(eps, worst.epsilon, "seed {seed} example {i}");
                let p = fast.privacy(i as u64, DELTA, conversion).unwrap();
                assert_eq!(p.epsilon, worst.epsilon);
                assert_eq!(p.order, worst.order);
                assert_eq!(p.rdp, worst.rdp);
            }
        }
    }
}

#[test]
fn worst_case_is_the_sum_of_sgm_rdp_over_steps() {
    let mut config = DatasetConfig::poisson(10, 1.0, 1.1, 0.01, DELTA);
    config.orders = Some(ORDERS.to_vec());
    let mut fast = Ledger::new(config).unwrap();
    for t in 0..500 {
        fast.step(&StepReport::new(t, vec![], vec![])).unwrap();
    }
    let w = fast.worst_case(DELTA, Conversion::Improved).unwrap();
    for (j, &a) in ORDERS.iter().enumerate() {
        assert!(close(w.rdp[j], 500.0 * sgm_rdp(0.01, 1.1, a), 1e-13));
    }
}

#[test]
fn rounding_never_gives_a_smaller_epsilon_than_exact_norms() {
    let mut rho = Rho::default();
    let mut strictly_larger = 0;
    for seed in 0..25u64 {
        let mut rng = Pcg64::seed_from_u64(50_000 + seed);
        let mut config = random_config(&mut rng, 40);
        config.orders = Some(vec![1.5, 2.0, 8.0, 32.0]);
        let steps = rng.random_range(1..15);
        let trace = random_trace(&mut rng, config.clone(), steps, false);
        let Sampling::Poisson { rate } = config.sampling else {
            unreachable!()
        };
        let n = config.examples as usize;
        let mut fast = Ledger::new(config.clone()).unwrap();
        let orders = fast.orders().to_vec();
        let mut exact = NaiveUnrounded {
            c: config.max_grad_norm,
            orders: orders.clone(),
            clip: vec![config.max_grad_norm; n],
            acc: vec![vec![0.0; orders.len()]; n],
        };
        for event in &trace.events {
            match event {
                Event::Step(r) => {
                    fast.step(r).unwrap();
                    let q = r.sampling_rate.unwrap_or(rate);
                    let s = r.noise_multiplier.unwrap_or(config.noise_multiplier);
                    exact.step(&mut rho, q, s, &r.ids, &r.norms);
                }
                Event::Refresh(ids, norms) => {
                    fast.refresh(ids, norms).unwrap();
                    exact.refresh(ids, norms);
                }
                Event::Compact => fast.compact(),
            }
        }
        for i in 0..n {
            let p = fast.privacy(i as u64, DELTA, Conversion::Improved).unwrap();
            let e = epsilon_from_rdp(&orders, &exact.acc[i], DELTA, Conversion::Improved);
            // Equal norms (bucket edges) may differ by float rounding only.
            assert!(
                p.epsilon >= e.epsilon * (1.0 - 1e-12),
                "seed {seed} example {i}: {} < {}",
                p.epsilon,
                e.epsilon
            );
            for (f, x) in p.rdp.iter().zip(&exact.acc[i]) {
                assert!(
                    *f >= *x * (1.0 - 1e-12),
                    "seed {seed} example {i}: rdp {f} < {x}"
                );
            }
            if p.epsilon > e.epsilon * (1.0 + 1e-9) {
                strictly_larger += 1;
            }
        }
    }
    assert!(
        strictly_larger > 0,
        "rounding should cost something somewhere"
    );
}

/// Everything observable about a ledger, to prove that refused inputs change nothing.
fn snapshot(ledger: &Ledger) -> String {
    let n = ledger.examples();
    let mut s = serde_json::to_string(&ledger.status()).unwrap();
    s += &format!("{:?}", ledger.thresholds(0..n).unwrap());
    s += &format!(
        "{:?}",
        ledger.worst_case(DELTA, Conversion::Improved).unwrap()
    );
    for i in 0..n {
        s += &format!(
            "{:?}",
            ledger.privacy(i, DELTA, Conversion::Improved).unwrap()
        );
    }
    s
}

fn small_ledger() -> Ledger {
    let mut config = DatasetConfig::poisson(20, 1.0, 1.1, 0.1, DELTA);
    config.orders = Some(ORDERS.to_vec());
    let mut ledger = Ledger::new(config).unwrap();
    ledger
        .step(&StepReport::new(0, vec![1, 2, 3], vec![0.5, 2.0, 0.0]))
        .unwrap();
    ledger
        .step(&StepReport::new(1, vec![3, 4], vec![0.25, 0.75]))
        .unwrap();
    ledger
}

#[test]
fn retries_are_idempotent_and_conflicts_are_refused() {
    let mut ledger = small_ledger();
    let before = snapshot(&ledger);
    let retry = StepReport::new(1, vec![3, 4], vec![0.25, 0.75]);
    let out = ledger.step(&retry).unwrap();
    assert!(out.duplicate && out.complete);
    assert_eq!(out.thresholds, vec![0.25, 0.75]);
    assert_eq!(snapshot(&ledger), before);
    // Same meaning, canonical encoding: part 0 of 1 and -0.0 are the same report.
    let mut same = StepReport::new(0, vec![1, 2, 3], vec![0.5, 2.0, -0.0]);
    same.part = Some(Part::WHOLE);
    assert!(ledger.step(&same).unwrap().duplicate);
    // Different content for an applied step.
    for bad in [
        StepReport::new(1, vec![3, 4], vec![0.25, 0.76]),
        StepReport::new(1, vec![4, 3], vec![0.75, 0.25]),
        StepReport {
            noise_multiplier: Some(1.1),
            ..retry.clone()
        },
    ] {
        let err = ledger.step(&bad).unwrap_err();
        assert!(
            matches!(err, LedgerError::Conflict { step: 1, .. }),
            "{err}"
        );
        assert_eq!(err.kind(), ErrorKind::Conflict);
    }
    assert_eq!(snapshot(&ledger), before);
    // A gap.
    let err = ledger
        .step(&StepReport::new(5, vec![], vec![]))
        .unwrap_err();
    assert_eq!(
        err,
        LedgerError::OutOfOrder {
            expected: 2,
            got: 5
        }
    );
    assert!(err.to_string().contains("expects step 2"), "{err}");
    assert_eq!(snapshot(&ledger), before);
    // Old steps leave the retry window.
    for t in 2..2 + RETRY_WINDOW + 1 {
        ledger.step(&StepReport::new(t, vec![], vec![])).unwrap();
    }
    assert!(matches!(
        ledger.step(&retry).unwrap_err(),
        LedgerError::Archived { step: 1, .. }
    ));
}

#[test]
fn bad_inputs_change_nothing() {
    let mut ledger = small_ledger();
    let before = snapshot(&ledger);
    let s = |ids: Vec<u64>, norms: Vec<f64>| StepReport::new(2, ids, norms);
    let cases: Vec<(StepReport, &str)> = vec![
        (s(vec![0, 1], vec![0.1, f64::NAN]), "norms"),
        (s(vec![0, 1], vec![f64::INFINITY, 0.1]), "norms"),
        (s(vec![0, 1], vec![0.1, -1e-300]), "norms"),
        (s(vec![0, 20], vec![0.1, 0.1]), "ids"),
        (s(vec![0, u64::MAX], vec![0.1, 0.1]), "ids"),
        (s(vec![5, 6, 5], vec![0.1, 0.2, 0.3]), "ids"),
        (s(vec![0, 1], vec![0.1]), "norms"),
        (s(vec![0], vec![0.1, 0.2]), "norms"),
        (
            StepReport {
                sampling_rate: Some(1.5),
                ..s(vec![0], vec![0.1])
            },
            "sampling_rate",
        ),
        (
            StepReport {
                sampling_rate: Some(-0.1),
                ..s(vec![0], vec![0.1])
            },
            "sampling_rate",
        ),
        (
            StepReport {
                sampling_rate: Some(f64::NAN),
                ..s(vec![0], vec![0.1])
            },
            "sampling_rate",
        ),
        (
            StepReport {
                noise_multiplier: Some(0.0),
                ..s(vec![0], vec![0.1])
            },
            "noise_multiplier",
        ),
        (
            StepReport {
                noise_multiplier: Some(-1.0),
                ..s(vec![0], vec![0.1])
            },
            "noise_multiplier",
        ),
        (
            StepReport {
                noise_multiplier: Some(f64::INFINITY),
                ..s(vec![0], vec![0.1])
            },
            "noise_multiplier",
        ),
        (
            StepReport {
                noise_multiplier: Some(f64::NAN),
                ..s(vec![0], vec![0.1])
            },
            "noise_multiplier",
        ),
        (
            StepReport {
                part: Some(Part { index: 2, count: 2 }),
                ..s(vec![0], vec![0.1])
            },
            "part",
        ),
        (
            StepReport {
                part: Some(Part { index: 0, count: 0 }),
                ..s(vec![0], vec![0.1])
            },
            "part",
        ),
    ];
    for (report, field) in cases {
        let err = ledger.step(&report).unwrap_err();
        match &err {
            LedgerError::Invalid(e) => assert_eq!(e.name, field, "{err}"),
            other => panic!("expected an invalid {field}, got {other}"),
        }
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert_eq!(snapshot(&ledger), before, "{err}");
    }
    for (ids, norms, field) in [
        (vec![0, 0], vec![0.1, 0.1], "ids"),
        (vec![99], vec![0.1], "ids"),
        (vec![1], vec![f64::NAN], "norms"),
        (vec![1, 2], vec![0.1], "norms"),
    ] {
        match ledger.refresh(&ids, &norms).unwrap_err() {
            LedgerError::Invalid(e) => assert_eq!(e.name, field),
            other => panic!("{other}"),
        }
        assert_eq!(snapshot(&ledger), before);
    }
    assert!(ledger.charge_release(&[0.1]).is_err());
    assert!(ledger.charge_release(&[f64::NAN; 8]).is_err());
    assert!(ledger.privacy(20, DELTA, Conversion::Improved).is_err());
    assert!(ledger.privacy(0, 0.0, Conversion::Improved).is_err());
    assert!(ledger.thresholds(5..21).is_err());
    assert_eq!(snapshot(&ledger), before);
    // The duplicate check's scratch marks were cleared: the same ids are fine now.
    ledger.step(&s(vec![5, 6], vec![0.1, 0.2])).unwrap();
    ledger.refresh(&[0], &[0.3]).unwrap();
}

#[test]
fn invalid_configurations_name_the_field() {
    let base = DatasetConfig::poisson(10, 1.0, 1.1, 0.1, DELTA);
    let cases: Vec<(DatasetConfig, &str)> = vec![
        (
            DatasetConfig {
                examples: 0,
                ..base.clone()
            },
            "examples",
        ),
        (
            DatasetConfig {
                max_grad_norm: -1.0,
                ..base.clone()
            },
            "max_grad_norm",
        ),
        (
            DatasetConfig {
                rounding: Some(0.0),
                ..base.clone()
            },
            "rounding",
        ),
        (
            DatasetConfig {
                noise_multiplier: 0.0,
                ..base.clone()
            },
            "noise_multiplier",
        ),
        (
            DatasetConfig {
                sampling: Sampling::Poisson { rate: 2.0 },
                ..base.clone()
            },
            "sampling.rate",
        ),
        (
            DatasetConfig {
                sampling: Sampling::Shuffle {
                    batch_size: 0,
                    epoch_steps: None,
                },
                ..base.clone()
            },
            "sampling.batch_size",
        ),
        (
            DatasetConfig {
                orders: Some(vec![0.5]),
                ..base.clone()
            },
            "orders",
        ),
        (
            DatasetConfig {
                orders: Some(vec![2.0, f64::INFINITY]),
                ..base.clone()
            },
            "orders",
        ),
        (
            DatasetConfig {
                delta: 1.0,
                ..base.clone()
            },
            "delta",
        ),
        (
            DatasetConfig {
                individual_budget: Some(IndividualBudget {
                    epsilon: -1.0,
                    delta: 1e-5,
                }),
                ..base.clone()
            },
            "individual_budget.epsilon",
        ),
        (
            DatasetConfig {
                individual_budget: Some(IndividualBudget {
                    epsilon: 1.0,
                    delta: 0.0,
                }),
                ..base.clone()
            },
            "individual_budget.delta",
        ),
        (
            DatasetConfig {
                individual_budget: Some(IndividualBudget {
                    epsilon: 1e-4,
                    delta: 1e-5,
                }),
                ..base.clone()
            },
            "individual_budget.epsilon",
        ),
    ];
    for (config, field) in cases {
        match Ledger::new(config).unwrap_err() {
            LedgerError::Invalid(e) => assert_eq!(e.name, field),
            other => panic!("{other}"),
        }
    }
    let json = r#"{"examples": 5, "max_grad_norm": 1.0, "noise_multiplier": 1.0,
                   "sampling": {"kind": "shuffle", "batch_size": 2}, "delta": 1e-5,
                   "clipping": "global"}"#;
    let cfg: DatasetConfig = serde_json::from_str(json).unwrap();
    assert_eq!(
        cfg.sampling,
        Sampling::Shuffle {
            batch_size: 2,
            epoch_steps: None,
        }
    );
    assert_eq!(cfg.clipping, Clipping::Global);
    let typo = json.replace("\"delta\"", "\"detla\"");
    assert!(serde_json::from_str::<DatasetConfig>(&typo).is_err());
    let typo = json.replace("\"batch_size\": 2", "\"batch_size\": 2, \"rate\": 0.1");
    assert!(serde_json::from_str::<DatasetConfig>(&typo).is_err());
}

#[test]
fn global_clipping_is_labelled_an_estimate() {
    let mut config = DatasetConfig::poisson(4, 1.0, 1.1, 0.5, DELTA);
    config.clipping = Clipping::Global;
    config.orders = Some(ORDERS.to_vec());
    let mut ledger = Ledger::new(config).unwrap();
    ledger
        .step(&StepReport::new(0, vec![0], vec![0.2]))
        .unwrap();
    let p = ledger.privacy(0, DELTA, Conversion::Improved).unwrap();
    assert_eq!(p.ledger, LedgerKind::Sampled);
    assert_eq!(p.estimate.kind, PrivacyKind::Estimate);
    assert_eq!(p.guarantee.kind, PrivacyKind::WorstCase);
    assert!(p.ex_post.is_none());
    assert!(!ledger.status().guarantee);
}

#[test]
fn multi_part_steps_equal_single_part_steps() {
    for seed in 0..30u64 {
        let mut rng = Pcg64::seed_from_u64(90_000 + seed);
        let config = random_config(&mut rng, 120);
        let steps = rng.random_range(1..20);
        let trace = random_trace(&mut rng, config.clone(), steps, false);
        let mut whole = Ledger::new(config.clone()).unwrap();
        let mut parts = Ledger::new(config).unwrap();
        for event in &trace.events {
            match event {
                Event::Step(r) => {
                    let expected = whole.step(r).unwrap();
                    let count = rng.random_range(1..5u32);
                    let len = r.ids.len();
                    let cut: Vec<usize> = (0..=count)
                        .map(|p| len * p as usize / count as usize)
                        .collect();
                    let mut reports: Vec<StepReport> = (0..count)
                        .map(|p| {
                            let range = cut[p as usize]..cut[p as usize + 1];
                            StepReport {
                                ids: r.ids[range.clone()].to_vec(),
                                norms: r.norms[range].to_vec(),
                                part: Some(Part { index: p, count }),
                                ..r.clone()
                            }
                        })
                        .collect();
                    reports.shuffle(&mut rng);
                    let mut thresholds = vec![Vec::new(); count as usize];
                    for (k, part) in reports.iter().enumerate() {
                        let out = parts.step(part).unwrap();
                        assert!(!out.duplicate);
                        assert_eq!(out.complete, k + 1 == count as usize);
                        if out.complete {
                            assert_eq!(out.retired, expected.retired);
                        } else {
                            // Each part is idempotent while the step is open.
                            let again = parts.step(part).unwrap();
                            assert!(again.duplicate && !again.complete);
                            assert_eq!(parts.status().pending.unwrap().received, k as u32 + 1);
                        }
                        thresholds[part.part.unwrap().index as usize] = out.thresholds;
                    }
                    assert_eq!(thresholds.concat(), expected.thresholds);
                    // And after it was applied: a retry of any part says the
                    // step is complete (a sharded step's merged answer needs
                    // it when one shard's part was a retry).
                    for part in &reports {
                        let again = parts.step(part).unwrap();
                        assert!(again.duplicate && again.complete);
                    }
                }
                Event::Refresh(ids, norms) => {
                    whole.refresh(ids, norms).unwrap();
                    parts.refresh(ids, norms).unwrap();
                }
                Event::Compact => {}
            }
        }
        assert_eq!(whole.status().pending, None);
        assert_eq!(
            whole.epsilons(DELTA, Conversion::Improved).unwrap(),
            parts.epsilons(DELTA, Conversion::Improved).unwrap()
        );
        for i in 0..whole.examples() {
            assert_eq!(
                whole.privacy(i, DELTA, Conversion::Improved).unwrap().rdp,
                parts.privacy(i, DELTA, Conversion::Improved).unwrap().rdp
            );
        }
    }
}

#[test]
fn multi_part_protocol_errors() {
    let mut ledger = small_ledger();
    let part = |index, count, ids: Vec<u64>| StepReport {
        part: Some(Part { index, count }),
        norms: vec![0.5; ids.len()],
        ..StepReport::new(2, ids, vec![])
    };
    let out = ledger.step(&part(0, 3, vec![1, 2])).unwrap();
    assert!(!out.complete);
    assert_eq!(out.thresholds, vec![0.5, 0.5]);
    let before = snapshot(&ledger);
    // Overlapping ids.
    let err = ledger.step(&part(1, 3, vec![3, 2])).unwrap_err();
    assert!(
        matches!(err, LedgerError::Conflict { step: 2, .. }),
        "{err}"
    );
    // Count disagrees.
    assert!(matches!(
        ledger.step(&part(1, 4, vec![3])).unwrap_err(),
        LedgerError::Conflict { .. }
    ));
    // Hyperparameters disagree.
    let mut odd = part(1, 3, vec![3]);
    odd.noise_multiplier = Some(2.0);
    assert!(matches!(
        ledger.step(&odd).unwrap_err(),
        LedgerError::Conflict { .. }
    ));
    // Different content for a received part.
    assert!(matches!(
        ledger.step(&part(0, 3, vec![1, 5])).unwrap_err(),
        LedgerError::Conflict { .. }
    ));
    // No refresh or release while the step is open; no next step either.
    assert!(matches!(
        ledger.refresh(&[7], &[0.1]).unwrap_err(),
        LedgerError::StepInProgress { .. }
    ));
    assert!(matches!(
        ledger.charge_release(&[0.0; 8]).unwrap_err(),
        LedgerError::StepInProgress { .. }
    ));
    assert!(matches!(
        ledger
            .step(&StepReport::new(3, vec![], vec![]))
            .unwrap_err(),
        LedgerError::OutOfOrder { .. }
    ));
    assert_eq!(snapshot(&ledger), before);
    ledger.step(&part(2, 3, vec![])).unwrap();
    let done = ledger.step(&part(1, 3, vec![3, 9])).unwrap();
    assert!(done.complete);
    assert_eq!(ledger.next_step(), 3);
    // Retrying a part of an applied step with a different count is a conflict.
    assert!(matches!(
        ledger.step(&part(0, 2, vec![1, 2])).unwrap_err(),
        LedgerError::Conflict { .. }
    ));
    assert!(ledger.step(&part(0, 3, vec![1, 2])).unwrap().duplicate);
}

// ---------------------------------------------------------------- shuffle

/// Spec §2 shuffle: an example is charged once per epoch at the step that processed
/// it; the worst case is one Gaussian charge at C per epoch.
#[test]
fn shuffle_mode_matches_the_naive_reference() {
    let mut rho = Rho::default();
    for seed in 0..40u64 {
        let mut rng = Pcg64::seed_from_u64(30_000 + seed);
        let n = rng.random_range(1..150u64);
        let batch = rng.random_range(1..=n);
        let c = 1.0;
        let sigma = *SIGMAS.choose(&mut rng).unwrap();
        let all_top = seed % 4 == 0;
        let config = DatasetConfig {
            examples: n,
            max_grad_norm: c,
            rounding: Some(c / 16.0),
            noise_multiplier: sigma,
            sampling: Sampling::Shuffle {
                batch_size: batch,
                epoch_steps: None,
            },
            orders: Some(ORDERS.to_vec()),
            delta: DELTA,
            clipping: Clipping::PerExample,
            individual_budget: None,
            label_budgets: None,
            thresholds: None,
            refresh: None,
            planned_steps: None,
            ex_post: None,
        };
        let grid = config.grid().unwrap();
        let mut fast = Ledger::new(config).unwrap();
        let spe = n.div_ceil(batch);
        let epochs = rng.random_range(1..5u64);
        let mut b = vec![grid.top(); n as usize];
        let mut acc = vec![vec![0.0; ORDERS.len()]; n as usize];
        let mut worst = vec![0.0; ORDERS.len()];
        for e in 0..epochs {
            let mut perm: Vec<u64> = (0..n).collect();
            perm.shuffle(&mut rng);
            let mut epoch_max = vec![0.0f64; ORDERS.len()];
            for s in 0..spe {
                let t = e * spe + s;
                let lo = (s * batch) as usize;
                let hi = ((s + 1) * batch).min(n) as usize;
                // Sometimes an example skips its epoch; never all_top traces.
                let ids: Vec<u64> = perm[lo..hi]
                    .iter()
                    .copied()
                    .filter(|_| all_top || rng.random_bool(0.9))
                    .collect();
                let norms: Vec<f64> = ids
                    .iter()
                    .map(|_| random_norm(&mut rng, &grid, all_top))
                    .collect();
                let noise =
                    (!all_top && rng.random_bool(0.2)).then(|| *SIGMAS.choose(&mut rng).unwrap());
                let s_t = noise.unwrap_or(sigma);
                fast.step(&StepReport {
                    noise_multiplier: noise,
                    ..StepReport::new(t, ids.clone(), norms.clone())
                })
                .unwrap();
                for (&id, &g) in ids.iter().zip(&norms) {
                    let i = id as usize;
                    let k = b[i].min(grid.bucket_of(g));
                    for (j, &a) in ORDERS.iter().enumerate() {
                        if k > 0 {
                            acc[i][j] += rho.gauss(grid.effective_sigma(s_t, k), a);
                        }
                    }
                    b[i] = grid.bucket_of(g);
                }
                for (j, &a) in ORDERS.iter().enumerate() {
                    epoch_max[j] = epoch_max[j].max(rho.gauss(s_t, a));
                }
            }
            // Epoch rule: steps e*S .. (e+1)*S - 1 form epoch e, S = ceil(n / b); the
            // worst case adds each epoch's largest Gaussian charge at C.
            for j in 0..ORDERS.len() {
                worst[j] += epoch_max[j];
            }
        }
        let w = fast.worst_case(DELTA, Conversion::Improved).unwrap();
        assert_rdp_close(&w.rdp, &worst, "shuffle worst case");
        for i in 0..n {
            let p = fast.privacy(i, DELTA, Conversion::Improved).unwrap();
            assert_rdp_close(&p.rdp, &acc[i as usize], &format!("shuffle example {i}"));
            if all_top {
                assert_eq!(p.rdp, w.rdp, "all-top shuffled example {i}");
                assert_eq!(p.epsilon, w.epsilon);
            }
        }
    }
}

#[test]
fn shuffle_refuses_a_second_processing_in_one_epoch() {
    let config = DatasetConfig {
        sampling: Sampling::Shuffle {
            batch_size: 4,
            epoch_steps: None,
        },
        orders: Some(ORDERS.to_vec()),
        ..DatasetConfig::poisson(10, 1.0, 1.0, 0.5, DELTA)
    };
    let mut ledger = Ledger::new(config).unwrap();
    // S = ceil(10 / 4) = 3 steps per epoch: steps 0-2 are epoch 0, 3-5 epoch 1.
    ledger
        .step(&StepReport::new(0, vec![0, 1, 2, 3], vec![0.5; 4]))
        .unwrap();
    ledger
        .step(&StepReport::new(1, vec![4, 5, 6, 7], vec![0.5; 4]))
        .unwrap();
    let before = snapshot(&ledger);
    let err = ledger
        .step(&StepReport::new(2, vec![8, 9, 3], vec![0.5; 3]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::EpochViolation {
                step: 2,
                id: 3,
                epoch: 0,
                first_step: 0,
                last_step: 2
            }
        ),
        "{err}"
    );
    assert_eq!(snapshot(&ledger), before);
    let mut with_rate = StepReport::new(2, vec![8, 9], vec![0.5; 2]);
    with_rate.sampling_rate = Some(0.1);
    assert!(
        matches!(ledger.step(&with_rate).unwrap_err(), LedgerError::Invalid(e) if e.name == "sampling_rate")
    );
    ledger
        .step(&StepReport::new(2, vec![8, 9], vec![0.5; 2]))
        .unwrap();
    // Epoch 1: example 3 may come again.
    ledger
        .step(&StepReport::new(3, vec![3, 0], vec![0.5; 2]))
        .unwrap();
    // One epoch begun, one Gaussian charge at C... two epochs begun now.
    let w = ledger.worst_case(DELTA, Conversion::Improved).unwrap();
    for (j, &a) in ORDERS.iter().enumerate() {
        assert!(close(w.rdp[j], 2.0 * gaussian_rdp(1.0, a), 1e-14));
    }
    // Unsampled examples accrue nothing: example 9's one charge was at norm 0.5.
    ledger.step(&StepReport::new(4, vec![], vec![])).unwrap();
    let p = ledger.privacy(9, DELTA, Conversion::Improved).unwrap();
    for (j, &a) in ORDERS.iter().enumerate() {
        assert!(close(p.rdp[j], gaussian_rdp(2.0, a), 1e-14));
    }
}

// ---------------------------------------------------------------- filter

fn filter_config(n: u64, epsilon: f64) -> DatasetConfig {
    DatasetConfig {
        orders: Some(ORDERS.to_vec()),
        individual_budget: Some(IndividualBudget {
            epsilon,
            delta: 1e-5,
        }),
        ..DatasetConfig::poisson(n, 1.0, 2.0, 0.1, DELTA)
    }
}

#[test]
fn filter_matches_a_naive_filter_and_keeps_every_example_within_budget() {
    let mut rho = Rho::default();
    let mut total_retired = 0;
    let mut total_over = 0;
    for seed in 0..50u64 {
        // From seed 30 on, steps may also charge more than the defaults.
        let loud = seed >= 30;
        let mut rng = Pcg64::seed_from_u64(60_000 + seed);
        let n = rng.random_range(1..80u64);
        let config = filter_config(n, rng.random_range(0.5..3.0));
        let grid = config.grid().unwrap();
        let mut fast = Ledger::new(config.clone()).unwrap();
        let filter = fast.status().filter.unwrap();
        let j = ORDERS.iter().position(|&a| a == filter.order).unwrap();
        let mut naive = Naive::new(grid, &ORDERS, n as usize, 0.1, 2.0);
        naive.filter = Some((
            j,
            filter.rdp_budget * (1.0 - FILTER_MARGIN),
            filter.rdp_budget,
        ));
        // The RDP of each retired example when it retired: it must never move again.
        let mut frozen: Vec<Option<Vec<f64>>> = vec![None; n as usize];
        for t in 0..rng.random_range(10..120u64) {
            if rng.random_bool(0.05) {
                let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.3)).collect();
                let norms: Vec<f64> = ids
                    .iter()
                    .map(|_| random_norm(&mut rng, &grid, false))
                    .collect();
                let out = fast.refresh(&ids, &norms).unwrap();
                assert_eq!(out.retired, naive.refresh(&mut rho, &ids, &norms));
            }
            // Only rate or noise that charge less than the defaults: no example can
            // be pushed over budget.
            let noise = rng
                .random_bool(0.2)
                .then_some(if loud && rng.random_bool(0.5) {
                    1.2
                } else {
                    3.0
                });
            let rate = rng
                .random_bool(0.2)
                .then_some(if loud && rng.random_bool(0.5) {
                    0.3
                } else {
                    0.05
                });
            // The trainer keeps sampling retired examples now and then (clipped to 0).
            let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.2)).collect();
            let norms: Vec<f64> = ids
                .iter()
                .map(|_| random_norm(&mut rng, &grid, false))
                .collect();
            let out = fast
                .step(&StepReport {
                    noise_multiplier: noise,
                    sampling_rate: rate,
                    ..StepReport::new(t, ids.clone(), norms.clone())
                })
                .unwrap();
            let expected = naive.step(
                &mut rho,
                rate.unwrap_or(0.1),
                noise.unwrap_or(2.0),
                &ids,
                &norms,
            );
            assert_eq!(out.retired, expected, "seed {seed} step {t}");
            for (&id, &th) in ids.iter().zip(&out.thresholds) {
                if naive.retired[id as usize] {
                    assert_eq!(th, 0.0);
                }
            }
            for i in 0..n {
                let p = fast.privacy(i, DELTA, Conversion::Improved).unwrap();
                assert_eq!(
                    p.over_budget, naive.over[i as usize],
                    "seed {seed} example {i}"
                );
                if !p.over_budget {
                    assert!(
                        p.rdp[j] <= filter.rdp_budget,
                        "seed {seed}: example {i} over budget"
                    );
                    // The sampled protocol's filter keeps its ledger (an
                    // estimate) within budget.
                    let eps = fast
                        .privacy(i, 1e-5, Conversion::Improved)
                        .unwrap()
                        .rdp_epsilon;
                    assert!(
                        eps <= filter.epsilon * (1.0 + 1e-12),
                        "example {i}: epsilon {eps}"
                    );
                }
                assert_eq!(p.retired, naive.retired[i as usize]);
                if p.retired {
                    assert_eq!(p.threshold, 0.0);
                    let first = frozen[i as usize].get_or_insert_with(|| p.rdp.clone());
                    assert_eq!(*first, p.rdp, "retired example {i} accrued");
                }
                assert_rdp_close(&p.rdp, &naive.acc[i as usize], "filtered example");
            }
        }
        let status = fast.status();
        let over = naive.over.iter().filter(|&&o| o).count() as u64;
        assert_eq!(status.over_budget, over);
        if !loud {
            assert_eq!(over, 0);
        } else {
            total_over += over;
        }
        assert_eq!(
            status.retired,
            naive.retired.iter().filter(|&&r| r).count() as u64
        );
        total_retired += status.retired;
    }
    assert!(
        total_retired > 100,
        "the filter should retire examples: {total_retired}"
    );
    assert!(total_over > 0, "loud steps should push someone over budget");
}

#[test]
fn filter_lets_small_gradients_train_longer_than_the_worst_case() {
    let n = 200u64;
    let mut ledger = Ledger::new(filter_config(n, 1.0)).unwrap();
    let filter = ledger.status().filter.unwrap();
    let j = ORDERS.iter().position(|&a| a == filter.order).unwrap();
    let per_step = sgm_rdp(0.1, 2.0, filter.order);
    let worst_steps = (filter.rdp_budget / per_step).floor() as u64;
    assert!(worst_steps > 2);
    // Examples 0..100 have tiny gradients, the rest large ones; all sampled each step.
    let mut retired_at = vec![None; n as usize];
    let mut t = 0;
    while t < 4 * worst_steps {
        let ids: Vec<u64> = (0..n).collect();
        let norms: Vec<f64> = ids
            .iter()
            .map(|&i| if i < 100 { 0.05 } else { 3.0 })
            .collect();
        let out = ledger.step(&StepReport::new(t, ids, norms)).unwrap();
        for &i in &out.retired {
            assert!(retired_at[i as usize].is_none(), "retired twice");
            retired_at[i as usize] = Some(t);
            // Announced before it would exceed: the next worst-case step would.
            let p = ledger.privacy(i, DELTA, Conversion::Improved).unwrap();
            let next = if i < 100 {
                sgm_rdp(0.1, 2.0 * (1.0 / 0.05), filter.order)
            } else {
                per_step
            };
            assert!(p.rdp[j] + next > filter.rdp_budget * (1.0 - 1e-9));
            assert!(p.rdp[j] <= filter.rdp_budget);
        }
        t += 1;
    }
    for at in &retired_at[100..] {
        let at = at.expect("large-gradient examples retire");
        assert!(
            at < worst_steps,
            "retired after step {at}, worst case allows {worst_steps}"
        );
    }
    for (i, at) in retired_at.iter().enumerate().take(100) {
        if let Some(at) = at {
            assert!(*at > worst_steps, "small example {i} retired too early");
        }
    }
    // Retired examples accrue nothing more.
    let before = ledger.privacy(150, DELTA, Conversion::Improved).unwrap();
    ledger
        .step(&StepReport::new(t, vec![150], vec![5.0]))
        .unwrap();
    let after = ledger.privacy(150, DELTA, Conversion::Improved).unwrap();
    assert_eq!(before.rdp, after.rdp);
    assert!(after.retired && after.threshold == 0.0);
    assert_eq!(ledger.thresholds(150..151).unwrap(), vec![0.0]);
}

#[test]
fn overridden_steps_and_releases_that_overshoot_are_recorded() {
    let mut ledger = Ledger::new(filter_config(10, 1.0)).unwrap();
    let filter = ledger.status().filter.unwrap();
    ledger
        .step(&StepReport::new(0, vec![0, 1], vec![0.01, 0.01]))
        .unwrap();
    // Far less noise than announced: everyone still at threshold C overshoots.
    let mut loud = StepReport::new(1, vec![0], vec![0.01]);
    loud.noise_multiplier = Some(0.3);
    loud.sampling_rate = Some(1.0);
    let out = ledger.step(&loud).unwrap();
    let status = ledger.status();
    assert!(status.over_budget >= 8, "{status:?}");
    assert!(out.retired.len() as u64 >= status.over_budget);
    let p = ledger.privacy(5, DELTA, Conversion::Improved).unwrap();
    assert!(p.over_budget && p.retired);
    let j = ORDERS.iter().position(|&a| a == filter.order).unwrap();
    assert!(p.rdp[j] > filter.rdp_budget);
    // A release that overshoots everyone's budget retires everyone.
    let mut ledger = Ledger::new(filter_config(4, 1.0)).unwrap();
    let retired = ledger.charge_release(&[10.0; 8]).unwrap();
    assert_eq!(retired, vec![0, 1, 2, 3]);
    assert_eq!(ledger.status().over_budget, 4);
}

#[test]
fn releases_are_charged_to_everyone_and_the_worst_case() {
    let mut ledger = small_ledger();
    let before_w = ledger.worst_case(DELTA, Conversion::Improved).unwrap();
    let before: Vec<_> = (0..20)
        .map(|i| ledger.privacy(i, DELTA, Conversion::Improved).unwrap())
        .collect();
    let release: Vec<f64> = ORDERS.iter().map(|a| a * 0.001).collect();
    assert!(ledger.charge_release(&release).unwrap().is_empty());
    let after_w = ledger.worst_case(DELTA, Conversion::Improved).unwrap();
    for (j, r) in release.iter().enumerate() {
        assert_eq!(after_w.rdp[j], before_w.rdp[j] + r);
    }
    for (i, b) in before.iter().enumerate() {
        let a = ledger
            .privacy(i as u64, DELTA, Conversion::Improved)
            .unwrap();
        for (j, r) in release.iter().enumerate() {
            assert_eq!(a.rdp[j], b.rdp[j] + r);
        }
    }
    assert_eq!(ledger.status().releases, 1);
}

#[test]
fn memory_stays_below_700_bytes_per_example() {
    let n = 20_000u64;
    let mut config = DatasetConfig::poisson(n, 1.0, 1.0, 0.01, DELTA);
    config.individual_budget = Some(IndividualBudget {
        epsilon: 8.0,
        delta: 1e-5,
    });
    let mut ledger = Ledger::new(config).unwrap();
    assert_eq!(ledger.orders().len(), 64);
    let mut rng = Pcg64::seed_from_u64(1);
    for t in 0..300 {
        let ids: Vec<u64> = (0..200)
            .map(|_| rng.random_range(0..n))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let norms = ids.iter().map(|_| rng.random_range(0.0..2.0)).collect();
        ledger.step(&StepReport::new(t, ids, norms)).unwrap();
    }
    let per_example = ledger.memory_bytes() as f64 / n as f64;
    assert!(per_example <= 700.0, "{per_example} bytes per example");
    let plain = Ledger::new(DatasetConfig::poisson(n, 1.0, 1.0, 0.01, DELTA)).unwrap();
    // 526 bytes before the per-example PLD level history (the bound: at most +50%);
    // a fresh example's history costs its run start and an empty list header.
    let plain_per_example = plain.memory_bytes() as f64 / n as f64;
    assert!(
        plain_per_example < 600.0,
        "{plain_per_example} bytes per example"
    );
}

#[test]
fn ledger_is_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Ledger>();
}

// ---------------------------------------------------------------- replay

const TRACE: &str = r#"{"dataset": {"examples": 5, "max_grad_norm": 1.0, "rounding": 0.1, "noise_multiplier": 1.1, "sampling_rate": 0.4, "orders": [1.5, 2, 8, 32]}}
{"step": 0, "ids": [0, 1], "norms": [0.05, 3.0]}

{"step": 1, "ids": [], "norms": []}
{"refresh": {"ids": [2, 3], "norms": [0.2, 0.0]}}
{"step": 2, "ids": [2, 4], "norms": [0.31, 1.0], "noise_multiplier": 2.0, "sampling_rate": 0.1}
{"step": 2, "ids": [2, 4], "norms": [0.31, 1.0], "noise_multiplier": 2.0, "sampling_rate": 0.1}
{"step": 3, "ids": [0, 1, 2, 3, 4], "norms": [0.1, 0.1, 0.1, 0.1, 0.1]}
"#;

#[test]
fn replay_parses_a_trace_end_to_end() {
    let report = replay(TRACE.as_bytes(), DELTA, Conversion::Improved).unwrap();
    // The same through the API.
    let config = DatasetConfig {
        rounding: Some(0.1),
        orders: Some(vec![1.5, 2.0, 8.0, 32.0]),
        ..DatasetConfig::poisson(5, 1.0, 1.1, 0.4, DELTA)
    };
    let mut ledger = Ledger::new(config).unwrap();
    ledger
        .step(&StepReport::new(0, vec![0, 1], vec![0.05, 3.0]))
        .unwrap();
    ledger.step(&StepReport::new(1, vec![], vec![])).unwrap();
    ledger.refresh(&[2, 3], &[0.2, 0.0]).unwrap();
    ledger
        .step(&StepReport {
            noise_multiplier: Some(2.0),
            sampling_rate: Some(0.1),
            ..StepReport::new(2, vec![2, 4], vec![0.31, 1.0])
        })
        .unwrap();
    ledger
        .step(&StepReport::new(3, vec![0, 1, 2, 3, 4], vec![0.1; 5]))
        .unwrap();
    let w = ledger.worst_case(DELTA, Conversion::Improved).unwrap();
    assert_eq!(report.worst_case.rdp, w);
    assert_eq!(report.steps, 4);
    // The PLD worst case: a proven bound, below the RDP one here, reported as
    // the worst case; each example gets min(its RDP epsilon, the PLD worst case).
    let pld = report.worst_case.pld.expect("a PLD worst case").epsilon;
    assert!(pld > 0.0 && pld < w.epsilon, "{pld} vs {}", w.epsilon);
    assert_eq!(report.worst_case.epsilon, pld);
    for (i, e) in report.examples.iter().enumerate() {
        let p = ledger
            .privacy(i as u64, DELTA, Conversion::Improved)
            .unwrap();
        assert_eq!(
            (e.id, e.rdp_epsilon, e.order),
            (i as u64, p.rdp_epsilon, p.order)
        );
        assert_eq!(e.epsilon, p.epsilon.min(pld));
        let by_pld = e.bound == dpledger::ledger::Bound::WorstCasePld;
        assert_eq!(by_pld, pld < p.epsilon, "example {i}");
    }
    // The sampled protocol: every guarantee is the worst case; the first
    // example's lower number is its estimate.
    assert_eq!(report.examples[0].epsilon, report.worst_case.epsilon);
    assert!(report.examples[0].estimate.epsilon < report.worst_case.epsilon);
    let json = serde_json::to_value(&report).unwrap();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["examples", "worst_case"]);
    assert_eq!(json["worst_case"]["method"], "pld");
    assert_eq!(
        json["worst_case"]["rdp"]["epsilon"].as_f64(),
        Some(w.epsilon)
    );
    assert_eq!(json["examples"][3].as_object().unwrap().len(), 8);
    assert_eq!(json["examples"][3]["id"], 3);
    let text = report.to_text();
    assert!(
        text.contains("worst case") && text.contains("median") && text.contains("5 examples"),
        "{text}"
    );
    let classic = replay(TRACE.as_bytes(), DELTA, Conversion::Classic).unwrap();
    assert!(classic.worst_case.epsilon >= report.worst_case.epsilon);
}

#[test]
fn replay_errors_name_the_line() {
    let lines: Vec<&str> = TRACE.lines().collect();
    let with = |line: usize, text: &str| {
        let mut l = lines.clone();
        l[line - 1] = text;
        l.join("\n")
    };
    let cases = [
        (with(3, "{\"step\": 1, \"ids\": [0], \"norms\": [0.1]"), 3, "EOF"),
        (with(2, "{\"step\": 0, \"ids\": [0], \"norms\": [-1.0]}"), 2, "norms"),
        (with(2, "{\"step\": 0, \"ids\": [0], \"norm\": [1.0]}"), 2, "unknown field"),
        (with(2, "{\"step\": 0, \"ids\": [0]}"), 2, "missing"),
        (with(2, "{\"step\": 1, \"ids\": [], \"norms\": []}"), 2, "expects step 0"),
        (with(2, "{\"step\": 0, \"ids\": [9], \"norms\": [0.5]}"), 2, "out of range"),
        (with(2, "{\"step\": 0, \"ids\": [1, 1], \"norms\": [0.5, 0.5]}"), 2, "twice"),
        (with(2, "{\"ids\": [1], \"norms\": [0.5]}"), 2, "expected a step line"),
        (with(5, "{\"refresh\": {\"ids\": [2], \"norms\": [0.2, 0.3]}}"), 5, "refresh"),
        (with(7, "{\"step\": 2, \"ids\": [2, 4], \"norms\": [0.31, 1.0]}"), 7, "conflict"),
        (with(6, "{\"step\": 2, \"ids\": [2, 4], \"norms\": [0.31, 1.0], \"sampling_rate\": 1.5}"), 6, "sampling_rate"),
        (with(1, "{\"dataset\": {\"examples\": 5, \"max_grad_norm\": 1.0, \"noise_multiplier\": 0.0, \"sampling_rate\": 0.4}}"), 1, "noise_multiplier"),
        (with(1, "{\"step\": 0, \"ids\": [], \"norms\": []}"), 1, "first line"),
        (with(4, lines[0]), 4, "only the first line"),
        (with(2, "not json"), 2, "expected"),
        (with(2, "{\"step\": 0, \"ids\": [0], \"norms\": [1e999]}"), 2, "invalid norms: norms[0] = 1e999 is not a finite number"),
        (with(5, "{\"refresh\": {\"ids\": [2], \"norms\": [NaN]}}"), 5, "refresh.norms[0] = NaN is not a finite number"),
    ];
    for (text, line, needle) in cases {
        let err = replay(text.as_bytes(), DELTA, Conversion::Improved).unwrap_err();
        assert_eq!(err.line, line, "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("line {line}: ")), "{msg}");
        assert!(msg.contains(needle), "{msg} lacks {needle:?}");
    }
    assert!(replay("".as_bytes(), DELTA, Conversion::Improved)
        .unwrap_err()
        .to_string()
        .contains("empty"));
    assert_eq!(
        replay(TRACE.as_bytes(), 0.0, Conversion::Improved)
            .unwrap_err()
            .line,
        0
    );
}

#[test]
fn memory_and_id_errors_are_errors_not_panics() {
    let too_many = DatasetConfig::poisson(u32::MAX as u64 + 1, 1.0, 1.0, 0.1, DELTA);
    assert!(Ledger::new(too_many).is_err());
}

#[test]
fn schedules_changing_every_step_compact_automatically_and_stay_exact() {
    let mut rho = Rho::default();
    let mut rng = Pcg64::seed_from_u64(4242);
    let config = DatasetConfig {
        rounding: Some(1.0 / 30.0),
        orders: Some(ORDERS.to_vec()),
        ..DatasetConfig::poisson(6, 1.0, 1.1, 0.3, DELTA)
    };
    let grid = config.grid().unwrap();
    let mut fast = Ledger::new(config).unwrap();
    let mut naive = Naive::new(grid, &ORDERS, 6, 0.3, 1.1);
    let mut max_segments = 0;
    // Each segment holds 31 buckets x 8 orders (about 2 KiB); the automatic
    // compaction starts after 32 MiB of them, some 16,000 changes.
    let steps = 40_000u64;
    for t in 0..steps {
        let sigma = SIGMAS[(t % 3) as usize];
        let ids: Vec<u64> = (0..6).filter(|_| rng.random_bool(0.3)).collect();
        let norms: Vec<f64> = ids
            .iter()
            .map(|_| random_norm(&mut rng, &grid, false))
            .collect();
        fast.step(&StepReport {
            noise_multiplier: Some(sigma),
            ..StepReport::new(t, ids.clone(), norms.clone())
        })
        .unwrap();
        naive.step(&mut rho, 0.3, sigma, &ids, &norms);
        max_segments = max_segments.max(fast.status().segments);
    }
    assert!(fast.status().segments < max_segments, "never compacted");
    for i in 0..6 {
        let p = fast.privacy(i, DELTA, Conversion::Improved).unwrap();
        // 40,000 naive additions carry more rounding than the prefix sums.
        for (f, s) in p.rdp.iter().zip(&naive.acc[i as usize]) {
            assert!(close(*f, *s, 1e-9), "example {i}: {f} vs {s}");
        }
    }
}

#[test]
fn filter_in_shuffle_mode_keeps_examples_within_budget() {
    let n = 40u64;
    let config = DatasetConfig {
        sampling: Sampling::Shuffle {
            batch_size: 10,
            epoch_steps: None,
        },
        orders: Some(ORDERS.to_vec()),
        individual_budget: Some(IndividualBudget {
            epsilon: 3.0,
            delta: 1e-5,
        }),
        ..DatasetConfig::poisson(n, 1.0, 3.0, 0.5, DELTA)
    };
    let mut ledger = Ledger::new(config).unwrap();
    let filter = ledger.status().filter.unwrap();
    let j = ORDERS.iter().position(|&a| a == filter.order).unwrap();
    let mut rng = Pcg64::seed_from_u64(5);
    let mut retired_small = 0;
    let mut retired_large = 0;
    for epoch in 0..60u64 {
        let mut perm: Vec<u64> = (0..n).collect();
        perm.shuffle(&mut rng);
        for s in 0..4u64 {
            let ids = perm[(s * 10) as usize..(s * 10 + 10) as usize].to_vec();
            // Even ids have small gradients.
            let norms = ids
                .iter()
                .map(|&i| if i % 2 == 0 { 0.2 } else { 2.0 })
                .collect();
            let out = ledger
                .step(&StepReport::new(epoch * 4 + s, ids, norms))
                .unwrap();
            for &i in &out.retired {
                if i % 2 == 0 {
                    retired_small += 1;
                } else {
                    retired_large += 1;
                }
            }
            for i in 0..n {
                let p = ledger.privacy(i, DELTA, Conversion::Improved).unwrap();
                assert!(p.rdp[j] <= filter.rdp_budget);
            }
        }
    }
    assert_eq!(retired_large, n / 2);
    assert_eq!(retired_small, 0);
    assert_eq!(ledger.status().over_budget, 0);
}

#[test]
fn a_retry_of_a_step_that_retired_examples_gives_the_same_answer() {
    let mut ledger = Ledger::new(filter_config(5, 1.0)).unwrap();
    let mut t = 0;
    loop {
        let report = StepReport::new(t, vec![0, 1, 2], vec![0.01, 5.0, 5.0]);
        let out = ledger.step(&report).unwrap();
        if !out.retired.is_empty() {
            let before = snapshot(&ledger);
            let again = ledger.step(&report).unwrap();
            assert!(again.duplicate);
            assert_eq!(again.retired, out.retired);
            assert_eq!(again.thresholds, out.thresholds);
            // Ids this step retired get threshold 0 in its answer.
            assert_eq!(out.thresholds[1], 0.0);
            assert_eq!(snapshot(&ledger), before);
            break;
        }
        t += 1;
        assert!(t < 1000);
    }
}

/// The server persists a report between `check_step` and `step`: the contract is
/// that checking changes nothing, refuses exactly what `step` refuses, recognises
/// retries, and that a report it accepts is then applied by `step`.
#[test]
fn check_step_is_a_faithful_dry_run() {
    use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
    let config: DatasetConfig = serde_json::from_value(serde_json::json!({
        "examples": 50, "max_grad_norm": 1.0, "noise_multiplier": 1.0,
        "sampling": {"kind": "poisson", "rate": 0.2}, "delta": 1e-5
    }))
    .unwrap();
    let mut ledger = Ledger::new(config).unwrap();
    let snapshot = |l: &Ledger| {
        (
            l.next_step(),
            l.all_epsilons(1e-5, dpledger::accounting::Conversion::Improved)
                .unwrap(),
            l.thresholds(0..50).unwrap(),
        )
    };
    let good = StepReport::new(0, vec![1, 2, 3], vec![0.5, 0.0, 7.0]);
    let before = snapshot(&ledger);
    assert_eq!(ledger.check_step(&good).unwrap(), None);
    assert_eq!(
        ledger.check_step(&good).unwrap(),
        None,
        "checking twice is still fresh"
    );
    assert_eq!(snapshot(&ledger), before, "check_step changed the ledger");
    let applied = ledger.step(&good).unwrap();
    assert!(!applied.duplicate);
    // A retry is recognised by the check with the same answer step would give.
    let retry = ledger.check_step(&good).unwrap().expect("a retry");
    assert!(retry.duplicate);
    assert_eq!(retry.thresholds, applied.thresholds);
    // Every refusal of step is a refusal of check_step, with the same error.
    for bad in [
        StepReport::new(1, vec![1, 1], vec![0.1, 0.2]),
        StepReport::new(1, vec![99], vec![0.1]),
        StepReport::new(1, vec![1], vec![f64::NAN]),
        StepReport::new(5, vec![], vec![]),
        StepReport::new(0, vec![4], vec![0.1]),
    ] {
        let before = snapshot(&ledger);
        let checked = ledger.check_step(&bad).unwrap_err();
        assert_eq!(snapshot(&ledger), before);
        assert_eq!(ledger.step(&bad).unwrap_err(), checked);
        assert_eq!(snapshot(&ledger), before);
    }
    let next = StepReport::new(1, vec![4, 5], vec![0.3, 0.4]);
    assert_eq!(ledger.check_step(&next).unwrap(), None);
    assert!(ledger.step(&next).unwrap().complete);
    assert!(ledger.check_refresh(&[1, 2], &[0.1, 0.2]).is_ok());
    assert!(ledger.check_refresh(&[1, 1], &[0.1, 0.2]).is_err());
}

/// A retry of an earlier part of a multi-part step, after another part
/// completed it, answers as the step did: complete, with the step's
/// retirements and threshold 0 for its own retired ids (a trainer trusting the
/// retried answer never keeps clipping a retired example at a non-zero
/// threshold; a sharded step's merged answer is built from such retries).
#[test]
fn retried_parts_of_an_applied_step_carry_its_retirements() {
    let mut retirements = 0;
    for seed in 0..20u64 {
        let mut rng = Pcg64::seed_from_u64(91_000 + seed);
        let n = 40;
        let config = filter_config(n, rng.random_range(1.0..2.0));
        let grid = config.grid().unwrap();
        let mut whole = Ledger::new(config.clone()).unwrap();
        let mut parts = Ledger::new(config).unwrap();
        for t in 0..60u64 {
            let ids: Vec<u64> = (0..n)
                .filter(|&i| rng.random_bool(0.5) && whole.thresholds(i..i + 1).unwrap()[0] > 0.0)
                .collect();
            let norms: Vec<f64> = ids
                .iter()
                .map(|_| random_norm(&mut rng, &grid, true))
                .collect();
            let expected = whole
                .step(&StepReport::new(t, ids.clone(), norms.clone()))
                .unwrap();
            retirements += expected.retired.len();
            let half = ids.len() / 2;
            let reports: Vec<StepReport> = [(0, 0..half), (1, half..ids.len())]
                .into_iter()
                .map(|(index, range)| StepReport {
                    part: Some(Part { index, count: 2 }),
                    ..StepReport::new(t, ids[range.clone()].to_vec(), norms[range].to_vec())
                })
                .collect();
            for r in &reports {
                parts.step(r).unwrap();
            }
            let mut thresholds = Vec::new();
            for r in &reports {
                let again = parts.step(r).unwrap();
                assert!(again.duplicate && again.complete, "step {t}");
                assert_eq!(again.retired, expected.retired, "step {t}");
                thresholds.extend(again.thresholds);
            }
            assert_eq!(thresholds, expected.thresholds, "step {t}");
        }
    }
    assert!(
        retirements > 0,
        "the traces retired nobody: the test proves nothing"
    );
}

/// A trace that names the predictable protocol and its schedule replays in
/// it: the refreshes must follow the schedule, steps never move thresholds,
/// and every example is served its ex-post bound, as the live ledger does.
#[test]
fn replay_follows_a_predictable_traces_schedule() {
    let header = r#"{"dataset": {"examples": 4, "max_grad_norm": 1.0, "rounding": 0.1, "noise_multiplier": 1.0, "sampling_rate": 0.5, "thresholds": "predictable", "refresh": {"block": 2}}}"#;
    let lines = [
        header,
        r#"{"refresh": {"ids": [0, 1], "norms": [0.2, 0.3]}}"#,
        r#"{"step": 0, "ids": [0, 2], "norms": [0.0, 5.0]}"#,
        r#"{"refresh": {"ids": [2, 3], "norms": [0.1, 0.9]}}"#,
        r#"{"step": 1, "ids": [1], "norms": [0.0]}"#,
    ];
    let report = replay(lines.join("\n").as_bytes(), DELTA, Conversion::Improved).unwrap();
    let mut config = DatasetConfig {
        rounding: Some(0.1),
        thresholds: Some(ThresholdMode::Predictable),
        refresh: Some(RefreshSchedule {
            full_every: None,
            block: Some(2),
            shard: None,
        }),
        ..DatasetConfig::poisson(4, 1.0, 1.0, 0.5, DELTA)
    };
    config = config.with_creation_defaults().unwrap();
    let mut ledger = Ledger::new(config).unwrap();
    ledger.refresh(&[0, 1], &[0.2, 0.3]).unwrap();
    ledger
        .step(&StepReport::new(0, vec![0, 2], vec![0.0, 5.0]))
        .unwrap();
    ledger.refresh(&[2, 3], &[0.1, 0.9]).unwrap();
    ledger
        .step(&StepReport::new(1, vec![1], vec![0.0]))
        .unwrap();
    assert_eq!(report.steps, 2);
    for e in &report.examples {
        let live = ledger.privacy(e.id, DELTA, Conversion::Improved).unwrap();
        assert_eq!(live.ledger, LedgerKind::Threshold);
        assert!(e.ex_post.is_some(), "example {}: no ex-post bound", e.id);
        assert_eq!(e.ex_post, live.ex_post, "example {}", e.id);
        assert_eq!(e.estimate, live.estimate, "example {}", e.id);
    }
    // A step before the refresh due is refused, naming the line.
    let early = [header, r#"{"step": 0, "ids": [], "norms": []}"#].join("\n");
    let e = replay(early.as_bytes(), DELTA, Conversion::Improved).unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    // Without "thresholds" the same header replays in the sampled protocol.
    let sampled = header.replace(
        r#", "thresholds": "predictable", "refresh": {"block": 2}"#,
        "",
    );
    let report = replay(sampled.as_bytes(), DELTA, Conversion::Improved).unwrap();
    assert!(report.examples.iter().all(|e| e.ex_post.is_none()));
}

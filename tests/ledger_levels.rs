//! Each example's count of steps per (segment, grid level), the input of its
//! PLD estimate (spec §8), against a naive reference written from spec §3.3:
//! every step charges every example at `b_i` (unsampled) or
//! `min(b_i, bucket(g_i))` (sampled), at that step's `(q, sigma)`; shuffle mode
//! charges only processed examples, one Gaussian (`q = 1`) each. Random traces
//! change buckets, hyperparameters (segments), split steps into parts, refresh,
//! retire examples through the individual filter, and charge releases.

use dpledger::accounting::grid::BucketGrid;
use dpledger::ledger::{DatasetConfig, Ledger, Part, StepReport};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde_json::json;
use std::collections::BTreeMap;

#[path = "common/traces.rs"]
mod traces;
use traces::{config, norm};

/// `(q bits, sigma bits, level) -> steps` per example.
type Counts = Vec<BTreeMap<(u64, u64, u32), u64>>;

struct Naive {
    grid: BucketGrid,
    b: Vec<u32>,
    retired: Vec<bool>,
    counts: Counts,
    shuffle: bool,
}

impl Naive {
    fn new(ledger: &Ledger, shuffle: bool) -> Self {
        let n = ledger.examples() as usize;
        let grid = *ledger.grid();
        Naive {
            grid,
            b: vec![grid.top(); n],
            retired: vec![false; n],
            counts: vec![BTreeMap::new(); n],
            shuffle,
        }
    }

    fn charge(&mut self, i: usize, q: f64, sigma: f64, level: u32) {
        if level > 0 && !self.retired[i] {
            *self.counts[i]
                .entry((q.to_bits(), sigma.to_bits(), level))
                .or_default() += 1;
        }
    }

    fn step(&mut self, q: f64, sigma: f64, ids: &[u64], norms: &[f64], retired: &[u64]) {
        let mut reported = vec![None; self.b.len()];
        for (&id, &g) in ids.iter().zip(norms) {
            reported[id as usize] = Some(self.grid.bucket_of(g));
        }
        for (i, report) in reported.iter().enumerate() {
            match (report, self.shuffle) {
                (Some(kg), true) => self.charge(i, 1.0, sigma, self.b[i].min(*kg)),
                (Some(kg), false) => self.charge(i, q, sigma, self.b[i].min(*kg)),
                (None, false) => self.charge(i, q, sigma, self.b[i]),
                (None, true) => {}
            }
        }
        for (i, report) in reported.iter().enumerate() {
            if let Some(kg) = report {
                if !self.retired[i] {
                    self.b[i] = *kg;
                }
            }
        }
        self.retire(retired);
    }

    fn refresh(&mut self, ids: &[u64], norms: &[f64], retired: &[u64]) {
        for (&id, &g) in ids.iter().zip(norms) {
            if !self.retired[id as usize] {
                self.b[id as usize] = self.grid.bucket_of(g);
            }
        }
        self.retire(retired);
    }

    fn retire(&mut self, ids: &[u64]) {
        for &id in ids {
            self.retired[id as usize] = true;
            self.b[id as usize] = 0;
        }
    }
}

fn served(ledger: &Ledger, id: u64) -> BTreeMap<(u64, u64, u32), u64> {
    let input = ledger.estimate_input(id).unwrap().unwrap();
    let grid = ledger.grid();
    let mut out = BTreeMap::new();
    for l in &input.levels {
        // The level is recovered from its threshold; sigma_eff must agree.
        let k = grid.bucket_of(l.threshold);
        assert_eq!(grid.value(k), l.threshold);
        assert_eq!(
            l.effective_noise_multiplier,
            l.noise_multiplier * grid.max_norm() / l.threshold
        );
        assert!(l.steps > 0);
        let prev = out.insert(
            (l.sampling_rate.to_bits(), l.noise_multiplier.to_bits(), k),
            l.steps,
        );
        assert!(prev.is_none(), "one entry per (segment, level)");
    }
    assert_eq!(input.dataset_steps, ledger.next_step());
    out
}

/// Run one random trace, checking the counts; returns how many were retired.
fn run_trace(seed: u64, shuffle: bool, filter: bool) -> usize {
    let mut rng = Pcg64::seed_from_u64(seed);
    let (config, n, batch) = config(&mut rng, shuffle, filter, 40);
    let mut ledger = Ledger::new(config).unwrap();
    let mut naive = Naive::new(&ledger, shuffle);
    let steps_per_epoch = n.div_ceil(batch);
    let mut order: Vec<u64> = (0..n).collect();
    let steps = rng.random_range(5..60);
    for t in 0..steps {
        // Hyperparameters: defaults, or one of a few overrides (new segments).
        let (q, sigma, q_override, s_override) = match rng.random_range(0..4) {
            0 => (0.05, 0.9, Some(0.05), Some(0.9)),
            1 if !shuffle => (0.2, 1.1, Some(0.2), None),
            _ => (0.05, 1.1, None, None),
        };
        let ids: Vec<u64> = if shuffle {
            if t % steps_per_epoch == 0 {
                order.shuffle(&mut rng);
            }
            let e = (t % steps_per_epoch) as usize * batch as usize;
            order[e..(e + batch as usize).min(n as usize)].to_vec()
        } else {
            let mut all: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.3)).collect();
            all.shuffle(&mut rng);
            all
        };
        let norms: Vec<f64> = ids.iter().map(|_| norm(&mut rng)).collect();
        let report = StepReport {
            noise_multiplier: s_override,
            sampling_rate: if shuffle { None } else { q_override },
            ..StepReport::new(t, ids.clone(), norms.clone())
        };
        let count = if ids.len() >= 2 {
            rng.random_range(1..=3u32)
        } else {
            1
        };
        let retired = if count == 1 {
            ledger.step(&report).unwrap().retired
        } else {
            let len = ids.len();
            let mut parts: Vec<StepReport> = (0..count)
                .map(|p| {
                    let r =
                        len * p as usize / count as usize..len * (p as usize + 1) / count as usize;
                    StepReport {
                        ids: ids[r.clone()].to_vec(),
                        norms: norms[r].to_vec(),
                        part: Some(Part { index: p, count }),
                        ..report.clone()
                    }
                })
                .collect();
            parts.shuffle(&mut rng);
            let mut retired = Vec::new();
            for p in &parts {
                let out = ledger.step(p).unwrap();
                if out.complete {
                    retired = out.retired;
                }
            }
            retired
        };
        naive.step(q, sigma, &ids, &norms, &retired);
        if !shuffle && rng.random_range(0..8) == 0 {
            let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
            let norms: Vec<f64> = ids.iter().map(|_| norm(&mut rng)).collect();
            let out = ledger.refresh(&ids, &norms).unwrap();
            naive.refresh(&ids, &norms, &out.retired);
        }
        if rng.random_range(0..20) == 0 {
            let out = ledger.charge_release_with_pld(
                &[0.01; 5],
                Some(&[dpledger::accounting::pld::PldEvent::Gaussian {
                    sigma: 10.0,
                    count: 1,
                }]),
                &[],
            );
            naive.retire(&out.unwrap());
        }
        if t % 7 == 3 {
            for id in 0..n {
                assert_eq!(
                    served(&ledger, id),
                    naive.counts[id as usize],
                    "seed {seed}, step {t}, example {id}"
                );
            }
        }
    }
    for id in 0..n {
        assert_eq!(
            served(&ledger, id),
            naive.counts[id as usize],
            "seed {seed}, example {id}"
        );
    }
    naive.retired.iter().filter(|&&r| r).count()
}

#[test]
fn poisson_counts_match_the_naive_reference() {
    for seed in 0..60 {
        assert_eq!(run_trace(1_000 + seed, false, false), 0);
    }
}

#[test]
fn poisson_counts_match_with_the_filter_retiring_examples() {
    let retired: usize = (0..40).map(|s| run_trace(2_000 + s, false, true)).sum();
    assert!(retired > 0, "the traces should retire examples");
}

#[test]
fn shuffle_counts_match_the_naive_reference() {
    let retired: usize = (0..40)
        .map(|s| run_trace(3_000 + s, true, s % 2 == 0))
        .sum();
    assert!(retired > 0, "the traces should retire examples");
}

#[test]
fn counts_survive_compaction_and_are_empty_for_a_fresh_example() {
    let config: DatasetConfig = serde_json::from_value(json!({"examples": 3,
        "max_grad_norm": 1.0, "rounding": 0.1, "noise_multiplier": 1.0,
        "sampling": {"kind": "poisson", "rate": 0.1}, "delta": 1e-5}))
    .unwrap();
    let mut ledger = Ledger::new(config).unwrap();
    assert!(ledger.estimate_input(0).unwrap().unwrap().levels.is_empty());
    // Example 0 moves to 0.3 at step 0 (charged there), then back to C at step 5.
    ledger
        .step(&StepReport::new(0, vec![0], vec![0.25]))
        .unwrap();
    for t in 1..5 {
        let r = StepReport {
            noise_multiplier: Some(1.0 + t as f64),
            ..StepReport::new(t, vec![], vec![])
        };
        ledger.step(&r).unwrap();
    }
    ledger.compact();
    ledger
        .step(&StepReport::new(5, vec![0], vec![5.0]))
        .unwrap();
    ledger.step(&StepReport::new(6, vec![], vec![])).unwrap();
    let input = ledger.estimate_input(0).unwrap().unwrap();
    let got: Vec<(f64, f64, u64)> = input
        .levels
        .iter()
        .map(|l| (l.noise_multiplier, l.threshold, l.steps))
        .collect();
    // Steps 0..=5 at 0.3 (step 5 charged at min(0.3, C)), step 6 at C; steps
    // 0, 5 and 6 at the default sigma 1, steps 1..5 at sigma 2..5.
    let v3 = ledger.grid().value(3);
    let mut want = vec![(1.0, v3, 2), (1.0, 1.0, 1)];
    for t in 1..5 {
        want.push((1.0 + t as f64, v3, 1));
    }
    want.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut got = got;
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(got, want);
    // Example 1 was never reported: all 7 steps at C, split by segment.
    let one = ledger.estimate_input(1).unwrap().unwrap();
    assert_eq!(one.levels.iter().map(|l| l.steps).sum::<u64>(), 7);
    assert!(one.levels.iter().all(|l| l.threshold == 1.0));
    assert!(ledger.estimate_input(3).is_err());
}

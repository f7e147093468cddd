//! Random ledger traces shared by the ledger-level tests (snapshots, views):
//! Poisson and shuffle configurations with and without the individual filter,
//! steps (some in parts, some changing hyperparameters), refreshes, releases.
#![allow(dead_code)]

use dpledger::accounting::pld::PldEvent;
use dpledger::ledger::{DatasetConfig, Ledger, Part, StepReport};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_pcg::Pcg64;
use serde_json::json;

/// One change to a ledger.
#[derive(Clone)]
pub enum Op {
    Step(StepReport),
    Refresh(Vec<u64>, Vec<f64>),
    Release,
}

pub fn norm(rng: &mut Pcg64) -> f64 {
    match rng.random_range(0..10) {
        0 => 0.0,
        1..=2 => rng.random_range(1.0..3.0),
        _ => rng.random_range(0.0..1.0),
    }
}

/// A random small configuration of fewer than `max_examples` examples, its
/// size and its batch size.
pub fn config(
    rng: &mut Pcg64,
    shuffle: bool,
    filter: bool,
    max_examples: u64,
) -> (DatasetConfig, u64, u64) {
    let n: u64 = rng.random_range(4..max_examples);
    let batch = rng.random_range(1..=n.min(8));
    let sampling = if shuffle {
        json!({"kind": "shuffle", "batch_size": batch})
    } else {
        json!({"kind": "poisson", "rate": 0.05})
    };
    let mut config = json!({"examples": n, "max_grad_norm": 1.0, "rounding": 0.05,
        "noise_multiplier": 1.1, "sampling": sampling, "delta": 1e-5,
        "orders": [2.0, 4.0, 8.0, 16.0, 32.0], "thresholds": "sampled"});
    if filter {
        // Shuffle charges a full Gaussian per processing: a larger budget.
        let epsilon = if shuffle { 8.0 } else { 3.0 };
        config["individual_budget"] = json!({"epsilon": epsilon, "delta": 1e-5});
    }
    (serde_json::from_value(config).unwrap(), n, batch)
}

/// A random trace of operations; multi-part steps are split into their parts.
pub fn trace(rng: &mut Pcg64, n: u64, batch: u64, shuffle: bool) -> Vec<Op> {
    let steps_per_epoch = n.div_ceil(batch);
    let mut order: Vec<u64> = (0..n).collect();
    let mut ops = Vec::new();
    for t in 0..rng.random_range(5..50u64) {
        let (q, s) = match rng.random_range(0..4) {
            0 => (Some(0.05), Some(0.9)),
            1 if !shuffle => (Some(0.2), None),
            _ => (None, None),
        };
        let ids: Vec<u64> = if shuffle {
            if t % steps_per_epoch == 0 {
                order.shuffle(rng);
            }
            let e = (t % steps_per_epoch) as usize * batch as usize;
            order[e..(e + batch as usize).min(n as usize)].to_vec()
        } else {
            let mut all: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.3)).collect();
            all.shuffle(rng);
            all
        };
        let norms: Vec<f64> = ids.iter().map(|_| norm(rng)).collect();
        let report = StepReport {
            noise_multiplier: s,
            sampling_rate: if shuffle { None } else { q },
            ..StepReport::new(t, ids.clone(), norms.clone())
        };
        let count = if ids.len() >= 2 {
            rng.random_range(1..=3u32)
        } else {
            1
        };
        if count == 1 {
            ops.push(Op::Step(report));
        } else {
            let len = ids.len();
            let mut parts: Vec<Op> = (0..count)
                .map(|p| {
                    let r =
                        len * p as usize / count as usize..len * (p as usize + 1) / count as usize;
                    Op::Step(StepReport {
                        ids: ids[r.clone()].to_vec(),
                        norms: norms[r].to_vec(),
                        part: Some(Part { index: p, count }),
                        ..report.clone()
                    })
                })
                .collect();
            parts.shuffle(rng);
            ops.extend(parts);
        }
        if !shuffle && rng.random_range(0..8) == 0 {
            let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
            let norms: Vec<f64> = ids.iter().map(|_| norm(rng)).collect();
            ops.push(Op::Refresh(ids, norms));
        }
        if rng.random_range(0..15) == 0 {
            ops.push(Op::Release);
        }
    }
    ops
}

/// Apply `op`, returning its answer as JSON (errors included) for comparison.
pub fn apply(ledger: &mut Ledger, op: &Op) -> String {
    match op {
        Op::Step(r) => format!("{:?}", ledger.step(r)),
        Op::Refresh(ids, norms) => format!("{:?}", ledger.refresh(ids, norms)),
        Op::Release => format!(
            "{:?}",
            ledger.charge_release_with_pld(
                &[0.01; 5],
                Some(&[PldEvent::Gaussian {
                    sigma: 10.0,
                    count: 1
                }]),
                &[]
            )
        ),
    }
}

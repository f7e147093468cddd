//! The ledger's compact form: what an example costs on a training-like
//! run, and that an RDP value evaluated from sparse counts is never below the
//! exact sum of its table values.

use dpledger::accounting::conversion::Conversion;
use dpledger::accounting::table::{RdpTable, StepMechanism};
use dpledger::ledger::DatasetConfigExt;
use dpledger::ledger::{DatasetConfig, Ledger, StepReport};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

const DELTA: f64 = 1e-5;

/// The demo's norms (`src/cli/demo.rs`): hard examples keep large gradients.
fn norm(i: u64, epoch: f64, u: f64) -> f64 {
    let (scale, decay, floor) = if i % 10 < 3 {
        (2.0, 0.05, 0.6)
    } else {
        (1.2, 0.35, 0.02)
    };
    (scale * (-decay * epoch).exp() + floor) * (0.6 + 0.8 * u)
}

/// 20 epochs of Poisson batches (expected size 256), the noise multiplier and
/// rate changed every epoch, the 64 ledger orders.
#[test]
fn a_training_trace_costs_at_most_200_bytes_per_example() {
    let n = 20_000u64;
    let q0 = 256.0 / n as f64;
    let mut ledger = Ledger::new(DatasetConfig::poisson(n, 1.0, 1.0, q0, DELTA)).unwrap();
    assert_eq!(ledger.orders().len(), 64);
    let mut rng = Pcg64::seed_from_u64(27);
    let steps_per_epoch = n.div_ceil(256);
    for epoch in 0..20u64 {
        let q = q0 * (1.0 - 0.01 * epoch as f64);
        for _ in 0..steps_per_epoch {
            let ids: Vec<u64> = (0..n).filter(|_| rng.random_bool(q)).collect();
            let norms = ids
                .iter()
                .map(|&i| norm(i, epoch as f64, rng.random::<f64>()))
                .collect();
            ledger
                .step(&StepReport {
                    noise_multiplier: Some(1.0 + 0.02 * epoch as f64),
                    sampling_rate: Some(q),
                    ..StepReport::new(ledger.next_step(), ids, norms)
                })
                .unwrap();
        }
    }
    let per_example = ledger.memory_bytes() as f64 / n as f64;
    assert!(per_example <= 200.0, "{per_example} bytes per example");
    // Examples did move: the figure is not that of an idle ledger.
    let now = ledger.next_step();
    let entries: usize = (0..n as usize)
        .map(|i| {
            ledger
                .level_history()
                .example_counts(i, 0, now)
                .unwrap()
                .len()
        })
        .sum();
    assert!(entries as f64 / n as f64 > 5.0, "{entries} entries");
    // The snapshot holds the compact form, not dense rows.
    let image = ledger.to_snapshot();
    assert!(
        (image.len() as f64 / n as f64) < per_example,
        "{} snapshot bytes",
        image.len()
    );
    let back = Ledger::from_snapshot(&image).unwrap();
    for id in [0, 7, n / 2, n - 1] {
        assert_eq!(
            format!(
                "{:?}",
                back.privacy(id, DELTA, Conversion::Improved).unwrap()
            ),
            format!(
                "{:?}",
                ledger.privacy(id, DELTA, Conversion::Improved).unwrap()
            )
        );
    }
}

/// `(hi, lo)` += `c * r` exactly (error-free product and sum).
fn add_exact(acc: &mut (f64, f64), c: f64, r: f64) {
    let p = c * r;
    let pe = c.mul_add(r, -p);
    let s = acc.0 + p;
    let bp = s - acc.0;
    let se = (acc.0 - (s - bp)) + (p - bp);
    acc.0 = s;
    acc.1 += se + pe;
}

/// An example with many `(segment, level)` counts whose open run is at level 0
/// (free): its served RDP is the rounded-up sum of its counts times the table
/// rows, which must be at or above the exact sum and within 1e-12 of it.
#[test]
fn compact_sums_are_never_below_the_exact_sum() {
    let n = 4u64;
    let config = DatasetConfig {
        rounding: Some(0.05),
        ..DatasetConfig::poisson(n, 1.0, 1.0, 0.3, DELTA)
    };
    let grid = config.grid().unwrap();
    let mut ledger = Ledger::new(config).unwrap();
    let mut rng = Pcg64::seed_from_u64(5);
    let sigmas = [0.9, 1.0, 1.3, 2.0];
    for t in 0..600u64 {
        let last = t == 599;
        let norms = (0..n)
            .map(|_| {
                if last {
                    0.0
                } else {
                    rng.random_range(0.0..1.2)
                }
            })
            .collect();
        ledger
            .step(&StepReport {
                noise_multiplier: Some(sigmas[(t / 7 % 4) as usize]),
                ..StepReport::new(t, (0..n).collect(), norms)
            })
            .unwrap();
    }
    let history = ledger.level_history();
    let tables: Vec<RdpTable> = history
        .segments()
        .iter()
        .map(|s| {
            RdpTable::compute(
                &grid,
                StepMechanism::Poisson {
                    q: s.sampling_rate,
                    sigma: s.noise_multiplier,
                },
                ledger.orders(),
            )
        })
        .collect();
    let now = ledger.next_step();
    for id in 0..n {
        let counts = history.example_counts(id as usize, 0, now).unwrap();
        assert!(counts.len() > 30, "{} counts", counts.len());
        let served = ledger.privacy(id, DELTA, Conversion::Improved).unwrap().rdp;
        for (j, &s) in served.iter().enumerate() {
            let mut exact = (0.0, 0.0);
            for c in &counts {
                let r = tables[c.segment as usize].row(c.level)[j];
                add_exact(&mut exact, c.steps as f64, r);
            }
            let exact = exact.0 + exact.1;
            assert!(s >= exact, "example {id} order #{j}: {s} < {exact}");
            assert!(
                s <= exact * (1.0 + 1e-12),
                "example {id} order #{j}: {s} vs {exact}"
            );
        }
    }
}

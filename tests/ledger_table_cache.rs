//! The table cache's bound at the ledger level: a schedule
//! that changes the noise multiplier at every step asks for a new table at every
//! step; with a small bounded cache the cache stays within its bound all along,
//! and the ledger's numbers are bit-identical to those computed with an
//! unbounded cache (ledgers keep their own tables; a recomputed table is equal).

use dpledger::accounting::table::TableCache;
use dpledger::accounting::Conversion;
use dpledger::ledger::{DatasetConfig, IndividualBudget, Ledger, Sampling, StepReport};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use std::sync::Arc;

const N: u64 = 300;
const STEPS: u64 = 400;

/// Run the same sigma-per-step schedule on a ledger of `config` with `cache`.
fn run(config: &DatasetConfig, cache: Arc<TableCache>, shuffle: bool) -> Ledger {
    let mut ledger = Ledger::with_table_cache(config.clone(), cache.clone()).unwrap();
    let mut rng = Pcg64::seed_from_u64(16);
    let per_epoch = 10u64;
    let mut order: Vec<u64> = (0..N).collect();
    for t in 0..STEPS {
        let ids: Vec<u64> = if shuffle {
            let e = (t % per_epoch) as usize;
            let size = N as usize / per_epoch as usize;
            order[e * size..(e + 1) * size].to_vec()
        } else {
            (0..N).filter(|_| rng.random::<f64>() < 0.1).collect()
        };
        let norms: Vec<f64> = ids.iter().map(|_| rng.random::<f64>() * 1.5).collect();
        let mut report = StepReport::new(t, ids, norms);
        // A new sigma at every step, cycling through 37 values: the tables of
        // earlier sigmas come back after they were evicted.
        report.noise_multiplier = Some(0.8 + (t % 37) as f64 * 0.013);
        ledger.step(&report).unwrap();
        let s = cache.stats();
        assert!(s.bytes <= s.bound, "step {t}: {s:?}");
        if shuffle && (t + 1) % per_epoch == 0 {
            order.rotate_left(7);
        }
    }
    ledger
}

fn check(config: DatasetConfig, shuffle: bool) {
    let unbounded = Arc::new(TableCache::with_bound(usize::MAX));
    let reference = run(&config, unbounded.clone(), shuffle);
    assert_eq!(unbounded.stats().evictions, 0);
    // Room for about four tables of this configuration.
    let one = unbounded.stats().bytes / unbounded.stats().tables;
    let bounded = Arc::new(TableCache::with_bound(4 * one + one / 2));
    let ledger = run(&config, bounded.clone(), shuffle);
    let s = bounded.stats();
    assert!(s.tables <= 4 && s.bytes <= s.bound, "{s:?}");
    assert!(s.evictions > 300, "the schedule must evict: {s:?}");
    assert!(
        s.misses > unbounded.stats().misses,
        "evicted tables were recomputed: {s:?}"
    );

    let delta = 1e-5;
    for conversion in [Conversion::default()] {
        let a = reference.epsilons(delta, conversion).unwrap();
        let b = ledger.epsilons(delta, conversion).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.epsilon.to_bits(), y.epsilon.to_bits(), "example {i}");
        }
    }
    for id in 0..N {
        let x = reference.privacy(id, delta, Conversion::default()).unwrap();
        let y = ledger.privacy(id, delta, Conversion::default()).unwrap();
        let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&x.rdp), bits(&y.rdp), "example {id}");
        assert_eq!(x.retired, y.retired, "example {id}");
    }
    let bits = |v: Vec<f64>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(reference.worst_case_rdp()),
        bits(ledger.worst_case_rdp())
    );
}

#[test]
fn poisson_schedule_with_a_new_sigma_every_step_stays_within_the_bound() {
    // With the individual filter, whose bound also comes from the tables.
    let config = DatasetConfig {
        individual_budget: Some(IndividualBudget {
            epsilon: 4.0,
            delta: 1e-5,
        }),
        ..DatasetConfig::poisson(N, 1.0, 1.0, 0.1, 1e-5)
    };
    check(config, false);
}

#[test]
fn shuffled_schedule_with_a_new_sigma_every_step_stays_within_the_bound() {
    let config = DatasetConfig {
        sampling: Sampling::Shuffle {
            batch_size: N / 10,
            epoch_steps: None,
        },
        ..DatasetConfig::poisson(N, 1.0, 1.0, 0.1, 1e-5)
    };
    check(config, true);
}

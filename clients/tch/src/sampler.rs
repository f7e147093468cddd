//! Poisson sampling: every example joins each step's batch independently with
//! probability `q`, so batch sizes vary. This is what the ledger's accounting
//! (amplification by Poisson subsampling) assumes; shuffling into fixed-size
//! batches would not match it.

use rand::Rng;
use rand_distr::{Distribution, Geometric};

/// Draw a Poisson batch of `0..n` at rate `q`, skipping `excluded` ids (retired
/// examples, which the ledger clips to zero anyway). Ids come out increasing.
/// Costs O(q n) by drawing the geometric gaps between sampled ids.
pub fn poisson_batch<R: Rng + ?Sized>(
    rng: &mut R,
    n: u64,
    q: f64,
    excluded: impl Fn(u64) -> bool,
) -> Vec<u64> {
    assert!((0.0..=1.0).contains(&q), "sampling rate {q} outside [0, 1]");
    if q == 0.0 || n == 0 {
        return Vec::new();
    }
    if q == 1.0 {
        return (0..n).filter(|&i| !excluded(i)).collect();
    }
    let gaps = Geometric::new(q).expect("0 < q < 1");
    let mut out = Vec::with_capacity((q * n as f64 * 1.2) as usize + 8);
    let mut next = gaps.sample(rng);
    while next < n {
        if !excluded(next) {
            out.push(next);
        }
        next = next.saturating_add(1).saturating_add(gaps.sample(rng));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn each_example_is_sampled_at_rate_q() {
        let mut rng = StdRng::seed_from_u64(1);
        let (n, q, steps) = (200u64, 0.1, 4000);
        let mut counts = vec![0u32; n as usize];
        let mut sizes = Vec::new();
        for _ in 0..steps {
            let b = poisson_batch(&mut rng, n, q, |_| false);
            assert!(b.windows(2).all(|w| w[0] < w[1]));
            sizes.push(b.len());
            for i in b {
                counts[i as usize] += 1;
            }
        }
        // Each count ~ Binomial(4000, 0.1): mean 400, sd 19.
        for (i, &c) in counts.iter().enumerate() {
            assert!((300..=500).contains(&c), "example {i} sampled {c} times");
        }
        // Batch sizes vary (Poisson sampling, not fixed-size batches).
        let min = *sizes.iter().min().unwrap();
        let max = *sizes.iter().max().unwrap();
        assert!(min < 15 && max > 25, "{min}..{max}");
    }

    #[test]
    fn excluded_ids_and_edge_rates() {
        let mut rng = StdRng::seed_from_u64(2);
        assert!(poisson_batch(&mut rng, 10, 0.0, |_| false).is_empty());
        assert_eq!(
            poisson_batch(&mut rng, 5, 1.0, |i| i == 3),
            vec![0, 1, 2, 4]
        );
        for _ in 0..100 {
            assert!(poisson_batch(&mut rng, 50, 0.5, |i| i % 2 == 0)
                .iter()
                .all(|i| i % 2 == 1));
        }
    }
}

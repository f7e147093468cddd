//! DP mean of values in `[0, B]`: Gaussian noise on the
//! midpoint-centred sum (sensitivity `B/2` under add/remove) and on the count
//! (sensitivity 1), the budget split evenly between the two.

use super::exact_sum::ExactSum;
use super::noise::{add_gaussian, gaussian_sigma};
use rand::Rng;

/// The released mean, defined once with the Rust client.
pub use dpledger_api::release::MeanValue;

/// The noise standard deviations `(sum, count)` that spend `rho` in total.
pub fn mean_sigmas(bound: f64, rho: f64) -> (f64, f64) {
    (
        gaussian_sigma(bound / 2.0, rho / 2.0),
        gaussian_sigma(1.0, rho / 2.0),
    )
}

/// Release the mean of `values` (each in `[0, bound]`) at zCDP cost `rho`.
///
/// Centring at `B/2` halves the sum's sensitivity: adding or removing one value
/// changes `Σ (x − B/2)` by at most `B/2`. The estimate is
/// `B/2 + noisy_sum / max(noisy_count, 1)`, clamped to `[0, B]` (post-processing).
/// The sum is exact (rounded once), so it does not depend on the order of the
/// values nor on how they are split across shards.
pub fn release_mean<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    rho: f64,
) -> MeanValue {
    let centred = centred_sum(values, bound);
    release_mean_of(rng, centred.value(), values.len() as u64, bound, rho)
}

/// The exact sum `Σ (clamp(x, 0, B) − B/2)` of `values`, which a shard computes
/// over its own examples and a coordinator merges exactly
/// ([`ExactSum::merge`]): one ledger and any sharding release the same mean.
pub fn centred_sum(values: &[f64], bound: f64) -> ExactSum {
    let half = bound / 2.0;
    values.iter().map(|&x| x.clamp(0.0, bound) - half).collect()
}

/// [`release_mean`] from its sufficient statistics: the centred sum (rounded
/// once from the exact sum) and the count.
pub fn release_mean_of<R: Rng + ?Sized>(
    rng: &mut R,
    centred: f64,
    count: u64,
    bound: f64,
    rho: f64,
) -> MeanValue {
    let half = bound / 2.0;
    let (s_sum, s_count) = mean_sigmas(bound, rho);
    let noisy_sum = add_gaussian(rng, centred, s_sum);
    let noisy_count = add_gaussian(rng, count as f64, s_count);
    let mean = (half + noisy_sum / noisy_count.max(1.0)).clamp(0.0, bound);
    MeanValue {
        mean,
        count: noisy_count.round().max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::noise::gaussian_rho;
    use rand::SeedableRng;

    #[test]
    fn cost_of_the_configured_noise_is_rho() {
        let (b, rho) = (7.5, 0.003);
        let (s_sum, s_count) = mean_sigmas(b, rho);
        let total = gaussian_rho(b / 2.0, s_sum) + gaussian_rho(1.0, s_count);
        assert!((total - rho).abs() < 1e-15, "{total}");
    }

    #[test]
    fn mean_is_accurate_at_large_n_and_unbiased_in_the_noise() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(1);
        let values: Vec<f64> = (0..50_000).map(|i| (i % 100) as f64 / 10.0).collect();
        let truth = values.iter().sum::<f64>() / values.len() as f64;
        let reps = 200;
        let mut err = 0.0;
        for _ in 0..reps {
            let m = release_mean(&mut rng, &values, 10.0, 0.01);
            assert!((0.0..=10.0).contains(&m.mean));
            err += m.mean - truth;
        }
        // sd of one estimate ≈ (B/2)/sqrt(rho)/n ≈ 1e-3; the average of 200 is far tighter.
        assert!(
            (err / reps as f64).abs() < 1e-3,
            "bias {}",
            err / reps as f64
        );
    }
}

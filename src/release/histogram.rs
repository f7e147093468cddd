//! DP histogram of values in `[0, B]` over equal-width bins.
//! Adding or removing one value changes one bin by 1 (L2 sensitivity 1), so
//! Gaussian noise of `σ = 1/sqrt(2ρ)` on every count costs `ρ`.

use super::noise::{add_gaussian, gaussian_sigma};
use rand::Rng;

/// The released counts, defined once with the Rust client.
pub use dpledger_api::release::HistogramValue;

/// The bin of `x` among `bins` equal bins of `[0, bound]`.
fn bin_of(x: f64, bound: f64, bins: usize) -> usize {
    (((x / bound) * bins as f64).floor().max(0.0) as usize).min(bins - 1)
}

/// Release a histogram of `values` at zCDP cost `rho`.
pub fn release_histogram<R: Rng + ?Sized>(
    rng: &mut R,
    values: &[f64],
    bound: f64,
    bins: usize,
    rho: f64,
) -> HistogramValue {
    release_histogram_of(rng, &bin_counts(values, bound, bins), bound, rho)
}

/// The exact count of `values` in each of `bins` equal bins of `[0, bound]`:
/// a histogram's sufficient statistic (shards' counts add up).
pub fn bin_counts(values: &[f64], bound: f64, bins: usize) -> Vec<u64> {
    let mut exact = vec![0u64; bins];
    for &x in values {
        exact[bin_of(x.clamp(0.0, bound), bound, bins)] += 1;
    }
    exact
}

/// [`release_histogram`] from the exact bin counts ([`bin_counts`]).
pub fn release_histogram_of<R: Rng + ?Sized>(
    rng: &mut R,
    exact: &[u64],
    bound: f64,
    rho: f64,
) -> HistogramValue {
    let bins = exact.len();
    let sigma = gaussian_sigma(1.0, rho);
    HistogramValue {
        edges: (0..=bins).map(|j| bound * j as f64 / bins as f64).collect(),
        counts: exact
            .iter()
            .map(|&c| add_gaussian(rng, c as f64, sigma).round().max(0.0))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn end_points_land_in_the_first_and_last_bins() {
        assert_eq!(bin_of(0.0, 3.0, 10), 0);
        assert_eq!(bin_of(3.0, 3.0, 10), 9);
        assert_eq!(bin_of(0.31, 3.0, 10), 1);
    }

    #[test]
    fn counts_are_close_with_a_large_budget() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(2);
        let values: Vec<f64> = (0..1000).map(|i| i as f64 / 1000.0).collect();
        let h = release_histogram(&mut rng, &values, 1.0, 4, 50.0);
        assert_eq!(h.edges, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        for c in &h.counts {
            assert!((c - 250.0).abs() <= 2.0, "{:?}", h.counts);
        }
    }
}

//! The Gaussian mechanism in zCDP terms: the one place where a noise scale and its
//! privacy cost are tied together, so no release can add less noise than it pays for.

use rand::Rng;
use rand_distr::{Distribution, Normal};

/// The zCDP cost `rho = Δ² / (2 σ²)` of adding `N(0, σ²)` to a query of L2
/// sensitivity `Δ` (Bun & Steinke 2016, Prop. 1.6).
pub fn gaussian_rho(sensitivity: f64, sigma: f64) -> f64 {
    sensitivity * sensitivity / (2.0 * sigma * sigma)
}

/// The standard deviation that makes a query of L2 sensitivity `Δ` cost exactly
/// `rho`: `σ = Δ / sqrt(2 rho)`.
pub fn gaussian_sigma(sensitivity: f64, rho: f64) -> f64 {
    sensitivity / (2.0 * rho).sqrt()
}

/// `value + N(0, σ²)`. `σ = 0` (a query of sensitivity 0) returns `value`.
pub fn add_gaussian<R: Rng + ?Sized>(rng: &mut R, value: f64, sigma: f64) -> f64 {
    if sigma == 0.0 {
        return value;
    }
    // σ is finite and positive here (validated budgets), so `new` cannot fail.
    value + Normal::new(0.0, sigma).map_or(0.0, |n| n.sample(rng))
}

/// `value + Laplace(b)`: density `exp(−|z|/b) / (2b)`. For a query of
/// sensitivity 1 the privacy loss of any output lies in `[−1/b, 1/b]`, so the
/// mechanism is `(1/b)`-DP and `(2/b)`-bounded-range (hence `1/(2b²)`-zCDP by
/// Cesar & Rogers 2021): the atom count of the quantile recursion uses it so
/// that a depth stays a pure-DP event for the PLD worst case (`super::pld`).
pub fn add_laplace<R: Rng + ?Sized>(rng: &mut R, value: f64, b: f64) -> f64 {
    if b == 0.0 {
        return value;
    }
    // Inverse CDF on u uniform in (−1/2, 1/2): z = −b·sgn(u)·ln(1 − 2|u|).
    loop {
        let u: f64 = rng.random::<f64>() - 0.5;
        let r = 1.0 - 2.0 * u.abs();
        if r > 0.0 {
            return value - b * u.signum() * r.ln();
        }
    }
}

/// A standard Gumbel variate `-ln(-ln U)`, `U` uniform on (0, 1): the Gumbel-max
/// trick samples the exponential mechanism in log space without normalising.
pub fn gumbel<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    loop {
        let u: f64 = rng.random();
        if u > 0.0 {
            return -(-u.ln()).ln();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn sigma_and_rho_are_inverse() {
        for &(d, rho) in &[(1.0, 0.5), (3.5, 1e-4), (0.25, 2.0)] {
            let s = gaussian_sigma(d, rho);
            assert!((gaussian_rho(d, s) - rho).abs() <= 1e-15 * rho.max(1.0));
        }
    }

    #[test]
    fn laplace_noise_has_the_configured_spread() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
        let n = 200_000;
        let b = 2.5;
        let xs: Vec<f64> = (0..n).map(|_| add_laplace(&mut rng, 4.0, b)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let mad = xs.iter().map(|x| (x - 4.0).abs()).sum::<f64>() / n as f64;
        // E|z| = b (sd b), Var z = 2b²: five standard errors each.
        let se = b * (2.0 / n as f64).sqrt();
        assert!((mean - 4.0).abs() < 5.0 * se, "mean {mean}");
        assert!(
            (mad - b).abs() < 5.0 * b / (n as f64).sqrt(),
            "mean |z| {mad}"
        );
        assert_eq!(add_laplace(&mut rng, 4.0, 0.0), 4.0);
    }

    #[test]
    fn noise_has_the_configured_spread() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
        let n = 200_000;
        let sigma = 3.0;
        let xs: Vec<f64> = (0..n)
            .map(|_| add_gaussian(&mut rng, 10.0, sigma))
            .collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        // Five standard errors.
        assert!(
            (mean - 10.0).abs() < 5.0 * sigma / (n as f64).sqrt(),
            "mean {mean}"
        );
        assert!(
            (var.sqrt() - sigma).abs() < 5.0 * sigma / (2.0 * n as f64).sqrt(),
            "sd {}",
            var.sqrt()
        );
    }
}

//! Log-space special functions used by the RDP computations.
//!
//! Every privacy number in dpledger is computed from sums of terms whose
//! magnitudes span hundreds of orders of magnitude (alpha up to 1024, tiny
//! sampling rates), so everything here works with logarithms and avoids the
//! cancellations that would make a privacy loss look smaller than it is.

use std::sync::OnceLock;

/// `ln(exp(a) + exp(b))` without overflow.
pub fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// `ln(1 + exp(x))` (softplus), accurate for every `x`.
pub fn log1p_exp(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// `ln(exp(x) - 1)` for `x > 0`, accurate for tiny and huge `x`.
pub fn log_expm1(x: f64) -> f64 {
    if x > 40.0 {
        // exp(-40) < 5e-18: the correction is below half an ulp of x.
        x + (-(-x).exp()).ln_1p()
    } else {
        x.exp_m1().ln()
    }
}

/// `ln(erfc(x))`, finite for every finite `x` (erfc underflows past x ≈ 26.5).
pub fn log_erfc(x: f64) -> f64 {
    if x < 26.0 {
        return libm::erfc(x).ln();
    }
    // Asymptotic expansion erfc(x) = exp(-x²)/(x√π) · Σ (-1)^n (2n-1)!! / (2x²)^n.
    // At x ≥ 26 the first omitted term is below 1e-16 relative.
    let inv = 1.0 / (2.0 * x * x);
    let mut term = 1.0;
    let mut series = 1.0;
    for n in 1..=8 {
        term *= -((2 * n - 1) as f64) * inv;
        series += term;
    }
    -x * x - (x * std::f64::consts::PI.sqrt()).ln() + series.ln()
}

const LOG_FACTORIAL_TABLE_LEN: usize = 4097;

fn log_factorial_table() -> &'static [f64] {
    static TABLE: OnceLock<Vec<f64>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Vec::with_capacity(LOG_FACTORIAL_TABLE_LEN);
        table.push(0.0);
        let mut acc = 0.0f64;
        for k in 1..LOG_FACTORIAL_TABLE_LEN {
            acc += (k as f64).ln();
            table.push(acc);
        }
        table
    })
}

/// `ln(k!)`: exact summation table up to 4096, log-gamma beyond.
pub fn log_factorial(k: u64) -> f64 {
    let table = log_factorial_table();
    if (k as usize) < table.len() {
        table[k as usize]
    } else {
        libm::lgamma(k as f64 + 1.0)
    }
}

/// A slice of `ln(k!)` for `k = 0..=n`, borrowed from the static table where possible.
pub fn log_factorials_upto(n: u64) -> std::borrow::Cow<'static, [f64]> {
    let table = log_factorial_table();
    if (n as usize) < table.len() {
        std::borrow::Cow::Borrowed(&table[..=n as usize])
    } else {
        let mut v = table.to_vec();
        let mut acc = *v.last().expect("table is non-empty");
        for k in table.len() as u64..=n {
            acc += (k as f64).ln();
            v.push(acc);
        }
        std::borrow::Cow::Owned(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        ((a - b) / b).abs()
    }

    #[test]
    fn log_erfc_matches_known_values() {
        // Reference values from mpmath at 30 digits.
        assert!(log_erfc(0.0).abs() < 1e-15);
        assert!(rel(log_erfc(10.0), (2.088_487_583_762_545e-45_f64).ln()) < 1e-13);
        assert!(rel(log_erfc(20.0), (5.395_865_611_607_901e-176_f64).ln()) < 1e-13);
        // Continuity across the switch to the asymptotic series.
        let below = log_erfc(26.0 - 1e-9);
        let above = log_erfc(26.0);
        assert!((below - above).abs() < 1e-6);
        // ln erfc(30) = -903.974...; erfc(30) itself underflows in f64.
        assert!(rel(log_erfc(30.0), -903.974_117_110_643_9) < 1e-13);
        assert!(rel(log_erfc(-3.0), (1.999_977_909_503_001_4_f64).ln()) < 1e-14);
    }

    #[test]
    fn log_factorial_agrees_with_gamma() {
        for k in [0u64, 1, 2, 10, 170, 1024, 4096, 5000] {
            let lg = libm::lgamma(k as f64 + 1.0);
            assert!(
                (log_factorial(k) - lg).abs() <= 1e-12 * lg.abs().max(1.0),
                "k={k}"
            );
        }
        let v = log_factorials_upto(5000);
        assert!((v[5000] - log_factorial(5000)).abs() < 1e-9);
    }

    #[test]
    fn log_add_and_softplus() {
        assert!((log_add(0.0, 0.0) - 2f64.ln()).abs() < 1e-15);
        assert_eq!(log_add(f64::NEG_INFINITY, 3.0), 3.0);
        assert!((log1p_exp(-50.0) - (-50f64).exp()).abs() < 1e-30);
        assert!((log1p_exp(800.0) - 800.0).abs() < 1e-12);
        assert!((log_expm1(1e-20) - (1e-20f64).ln()).abs() < 1e-12);
        assert!((log_expm1(700.0) - 700.0).abs() < 1e-12);
    }
}

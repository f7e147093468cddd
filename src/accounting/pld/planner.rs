//! Sizing the FFT domain of a composition from Chernoff bounds.
//!
//! FFT convolution is circular: the composed mass at index `k` outside the
//! window `[lo, lo + n)` lands on `k mod n` inside it. That never lowers any
//! `delta(eps)` computed on the window except by moving mass that belongs ABOVE
//! the window onto lower losses; the total of such mass is bounded here by
//! `P(S > top) <= exp(sum_i c_i ln M_i(lambda) - lambda (top + 1) h)`, with
//! `M_i` the moment generating function of each discrete PLD's finite part, and
//! that bound is added to the mass at infinity (so to every delta). Mass wrapped
//! up from below the window only raises losses (pessimistic, costs accuracy), so
//! the lower edge is chosen by the same bound with `-lambda`, for tightness only.

use super::pmf::DiscretePld;
use crate::accounting::error::{InvalidArgument, Result};

/// Largest FFT domain (grid points) a composition may use.
pub const MAX_DOMAIN: usize = 1 << 23;

/// `lambda` values (per unit of loss) tried by the Chernoff bounds.
fn lambdas() -> impl Iterator<Item = f64> {
    (0..48).map(|i| 10f64.powf(-2.5 + 6.0 * i as f64 / 47.0))
}

/// `ln M(lambda)` and `ln M(-lambda)` of one PLD's finite part, for all lambdas.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMgf {
    /// `ln E[e^{lambda L}; L finite]` per lambda.
    pub upper: Vec<f64>,
    /// `ln E[e^{-lambda L}; L finite]` per lambda.
    pub lower: Vec<f64>,
}

impl LogMgf {
    /// Evaluate on `pld` by two Horner passes (one multiply-add per grid point
    /// and lambda; no overflow: factors are `<= 1`).
    pub fn of(pld: &DiscretePld) -> Self {
        let h = pld.step;
        let lam: Vec<f64> = lambdas().collect();
        let down: Vec<f64> = lam.iter().map(|l| (-l * h).exp()).collect();
        let mut up_acc = vec![0.0f64; lam.len()];
        for &p in &pld.probs {
            for (a, f) in up_acc.iter_mut().zip(&down) {
                *a = *a * f + p;
            }
        }
        let mut lo_acc = vec![0.0f64; lam.len()];
        for &p in pld.probs.iter().rev() {
            for (a, f) in lo_acc.iter_mut().zip(&down) {
                *a = *a * f + p;
            }
        }
        let top = pld.last() as f64 * h;
        let bottom = pld.first as f64 * h;
        LogMgf {
            upper: lam
                .iter()
                .zip(&up_acc)
                .map(|(l, a)| l * top + a.ln())
                .collect(),
            lower: lam
                .iter()
                .zip(&lo_acc)
                .map(|(l, a)| -l * bottom + a.ln())
                .collect(),
        }
    }
}

/// An FFT window: grid indices `lo .. lo + size`, and the proven bound on the
/// composed mass above it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// First grid index.
    pub lo: i64,
    /// Domain size (FFT length).
    pub size: usize,
    /// Upper bound on the composed probability of losses above the window.
    pub mass_above: f64,
}

/// `sum_i c_i v_i[j]` for each lambda j.
fn combine(parts: &[(&[f64], u64)], j: usize) -> f64 {
    parts
        .iter()
        .filter(|(_, c)| *c > 0)
        .map(|(v, c)| *c as f64 * v[j])
        .sum()
}

/// Smallest size >= n of the form 2^a or 3 * 2^a (fast real FFTs).
fn fft_size(n: usize) -> usize {
    let p = n.next_power_of_two();
    if p / 4 * 3 >= n {
        p / 4 * 3
    } else {
        p
    }
}

/// Plan the window for `sum_i c_i` copies of PLDs with the given MGFs, so that
/// the composed mass outside it is at most `tail` on either side. With `fixed`,
/// the domain size is that (a cache's) and must hold the window.
pub fn plan(mgfs: &[(&LogMgf, u64)], h: f64, tail: f64, fixed: Option<usize>) -> Result<Window> {
    let lam: Vec<f64> = lambdas().collect();
    let up: Vec<(&[f64], u64)> = mgfs.iter().map(|(m, c)| (m.upper.as_slice(), *c)).collect();
    let down: Vec<(&[f64], u64)> = mgfs.iter().map(|(m, c)| (m.lower.as_slice(), *c)).collect();
    let ln_tail = tail.ln();
    let mut top = f64::INFINITY;
    let mut bottom = f64::NEG_INFINITY;
    for (j, l) in lam.iter().enumerate() {
        top = top.min((combine(&up, j) - ln_tail) / l);
        bottom = bottom.max(-(combine(&down, j) - ln_tail) / l);
    }
    let span = (top - bottom) / h + 3.0;
    let cap = fixed.unwrap_or(MAX_DOMAIN);
    if !span.is_finite() || span > cap as f64 {
        return Err(InvalidArgument::new(
            "steps",
            format!(
                "the composed privacy loss spans {span:.0} grid points, more than the {cap} the grid can hold; use a coarser value discretisation or fewer steps"
            ),
        ));
    }
    let (lo, hi) = ((bottom / h).floor() as i64, (top / h).ceil() as i64);
    let size = fixed.unwrap_or_else(|| fft_size((hi - lo + 1).max(2) as usize));
    let edge = (lo + size as i64) as f64 * h; // first loss above the window
    let mass_above = lam
        .iter()
        .enumerate()
        .map(|(j, l)| (combine(&up, j) - l * edge).exp())
        .fold(1.0f64, f64::min);
    Ok(Window {
        lo,
        size,
        mass_above,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mgf_of_a_point_mass_is_exact() {
        let pld = DiscretePld {
            step: 0.1,
            first: 3,
            probs: vec![0.0, 0.5, 0.0],
            infinity_mass: 0.5,
        };
        let m = LogMgf::of(&pld);
        for (l, v) in lambdas().zip(&m.upper) {
            assert!((v - (0.5f64.ln() + 0.4 * l)).abs() < 1e-9);
        }
    }

    #[test]
    fn window_holds_the_sum_and_refuses_huge_horizons() {
        let pld = DiscretePld {
            step: 0.01,
            first: -2,
            probs: vec![0.25, 0.0, 0.5, 0.0, 0.25],
            infinity_mass: 0.0,
        };
        let m = LogMgf::of(&pld);
        let w = plan(&[(&m, 100)], 0.01, 1e-12, None).unwrap();
        // the sum of 100 steps lies in [-200, 200] grid units; mean 0, sd ~14.
        assert!(w.lo < -100 && w.lo + w.size as i64 > 100, "{w:?}");
        assert!(w.lo >= -200 && w.size < 512, "{w:?}");
        assert!(w.mass_above <= 1e-12);
        assert!(plan(&[(&m, u64::MAX / 4)], 0.01, 1e-12, None).is_err());
    }
}

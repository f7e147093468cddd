//! The discretised privacy loss distribution and its two queries.
//!
//! A [`DiscretePld`] is the distribution of the privacy loss `L = ln(P/Q)(x)`,
//! `x ~ P`, of a (dominating) pair `(P, Q)`, on the grid `k * h`, plus an atom at
//! `+inf`. Its hockey-stick divergence is exact for the discrete pair:
//!
//! `delta(eps) = mass(+inf) + sum_{l_k > eps} p_k (1 - e^{eps - l_k})`,
//!
//! a non-increasing function of `eps`; both queries below evaluate it without
//! ever forming `e^{l_k}` (no overflow for any horizon).

use crate::accounting::error::{InvalidArgument, Result};

/// Privacy loss distribution on the grid `(first + j) * step`, `j = 0..probs.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscretePld {
    /// Grid spacing `h` of the privacy loss (the value discretisation).
    pub step: f64,
    /// Grid index of `probs[0]`.
    pub first: i64,
    /// Probability (under the upper distribution) of each grid loss.
    pub probs: Vec<f64>,
    /// Mass at `+inf` loss (truncated tails, bounded wrap-around): counts fully to delta.
    pub infinity_mass: f64,
}

impl DiscretePld {
    /// Grid index of the last entry.
    pub fn last(&self) -> i64 {
        self.first + self.probs.len() as i64 - 1
    }

    /// `delta(eps)`: the hockey-stick divergence at `e^eps`.
    pub fn delta_for_epsilon(&self, epsilon: f64) -> f64 {
        let mut sum = 0.0;
        for (j, &p) in self.probs.iter().enumerate().rev() {
            let l = (self.first + j as i64) as f64 * self.step;
            if l <= epsilon {
                break;
            }
            sum += p * -(epsilon - l).exp_m1();
        }
        (sum + self.infinity_mass).min(1.0)
    }

    /// The smallest `eps >= 0` with `delta(eps) <= delta`. Fails when the mass at
    /// infinity alone exceeds `delta` (no finite epsilon holds).
    ///
    /// Scans from the largest loss down keeping `A = mass(L >= l_k)` and
    /// `C = sum_{j>=k} p_j e^{l_{k-1} - l_j}` (both bounded by 1), so that on
    /// `[l_{k-1}, l_k]` the curve is exactly `A - C e^{eps - l_{k-1}}`.
    pub fn epsilon_for_delta(&self, delta: f64) -> Result<f64> {
        if self.infinity_mass > delta {
            return Err(InvalidArgument::new(
                "delta",
                format!(
                    "{delta} is below the mass at infinite privacy loss ({:.3e}); no finite epsilon holds",
                    self.infinity_mass
                ),
            ));
        }
        let shrink = (-self.step).exp();
        let (mut a, mut c) = (self.infinity_mass, 0.0f64);
        let mut k = self.last();
        for &p in self.probs.iter().rev() {
            a += p;
            c = shrink * (p + c);
            if a - c > delta {
                return Ok(self.solve(k, a, c, delta));
            }
            k -= 1;
        }
        Ok(self.solve(k + 1, a, c, delta))
    }

    /// Solve `A - C e^{eps - l_{k-1}} = delta` for eps (clamped at 0).
    fn solve(&self, k: i64, a: f64, c: f64, delta: f64) -> f64 {
        let base = (k - 1) as f64 * self.step;
        if c <= 0.0 {
            return base.max(0.0);
        }
        (base + ((a - delta) / c).ln()).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rr(eps0_steps: i64, h: f64) -> DiscretePld {
        // Randomized response with loss +-e0 on the grid.
        let e0 = eps0_steps as f64 * h;
        let p = 1.0 / (1.0 + (-e0).exp());
        let mut probs = vec![0.0; (2 * eps0_steps + 1) as usize];
        probs[0] = 1.0 - p;
        probs[2 * eps0_steps as usize] = p;
        DiscretePld {
            step: h,
            first: -eps0_steps,
            probs,
            infinity_mass: 0.0,
        }
    }

    #[test]
    fn randomized_response_is_pure_dp() {
        let pld = rr(100, 0.01);
        assert!(pld.delta_for_epsilon(1.0) == 0.0);
        assert!(pld.delta_for_epsilon(0.5) > 0.0);
        let eps = pld.epsilon_for_delta(1e-9).unwrap();
        assert!((eps - 1.0).abs() < 1e-6, "{eps}");
    }

    #[test]
    fn epsilon_and_delta_queries_are_inverse() {
        let pld = rr(37, 0.013);
        for &d in &[0.2, 0.1, 0.01] {
            let e = pld.epsilon_for_delta(d).unwrap();
            assert!((pld.delta_for_epsilon(e) - d).abs() < 1e-12, "{d} {e}");
        }
    }

    #[test]
    fn infinite_mass_above_delta_is_refused() {
        let mut pld = rr(10, 0.1);
        pld.infinity_mass = 1e-3;
        assert!(pld.epsilon_for_delta(1e-4).is_err());
        assert!(pld.delta_for_epsilon(100.0) >= 1e-3);
    }
}

//! The rounded-norm grid (spec §1, §3.6): buckets `k = 0..=K`, `v_k = k r`, `v_K = C`.

use super::error::{InvalidArgument, Result};
use super::validate;
use serde::{Deserialize, Serialize};

/// Largest number of buckets we accept: the per-bucket table is `(K+1) × orders`.
pub const MAX_BUCKETS: u32 = 100_000;

/// A validated grid of clipping thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BucketGrid {
    max_norm: f64,
    rounding: f64,
    top: u32,
}

impl BucketGrid {
    /// Grid for maximum clipping norm `C` and rounding precision `r` (`K = ceil(C/r)`).
    pub fn new(max_norm: f64, rounding: f64) -> Result<Self> {
        validate::positive("max_grad_norm", max_norm)?;
        validate::positive("rounding", rounding)?;
        let k = (max_norm / rounding).ceil();
        if k > MAX_BUCKETS as f64 {
            return Err(InvalidArgument::new(
                "rounding",
                format!("max_grad_norm / rounding = {k} buckets, more than {MAX_BUCKETS}"),
            ));
        }
        let mut top = k as u32;
        // ceil() of an inexact quotient may overshoot by one bucket (e.g. 1.0 / 0.01).
        if top > 1 && (top - 1) as f64 * rounding >= max_norm {
            top -= 1;
        }
        Ok(Self {
            max_norm,
            rounding,
            top: top.max(1),
        })
    }

    /// `K`: the index of the top bucket (value `C`).
    pub fn top(&self) -> u32 {
        self.top
    }

    /// Number of buckets, `K + 1`.
    pub fn len(&self) -> usize {
        self.top as usize + 1
    }

    /// Always false: a grid has at least buckets 0 and K.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Maximum clipping norm `C`.
    pub fn max_norm(&self) -> f64 {
        self.max_norm
    }

    /// Rounding precision `r`.
    pub fn rounding(&self) -> f64 {
        self.rounding
    }

    /// Threshold value of bucket `k`.
    pub fn value(&self, k: u32) -> f64 {
        if k >= self.top {
            self.max_norm
        } else {
            k as f64 * self.rounding
        }
    }

    /// The smallest bucket whose value is `>= norm` (rounding only ever goes up);
    /// `K` for norms `>= C`. `norm` must be finite and non-negative.
    pub fn bucket_of(&self, norm: f64) -> u32 {
        if norm >= self.max_norm {
            return self.top;
        }
        if norm <= 0.0 {
            return 0;
        }
        let mut k = ((norm / self.rounding).ceil() as u32).min(self.top);
        while k < self.top && self.value(k) < norm {
            k += 1;
        }
        while k > 0 && self.value(k - 1) >= norm {
            k -= 1;
        }
        k
    }

    /// Effective noise multiplier of bucket `k` for a step with noise multiplier
    /// `sigma`: `sigma C / v_k` (exactly `sigma` at the top bucket, infinite at 0).
    pub fn effective_sigma(&self, sigma: f64, k: u32) -> f64 {
        if k >= self.top {
            sigma
        } else if k == 0 {
            f64::INFINITY
        } else {
            sigma * (self.max_norm / self.value(k))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_and_cap_at_c() {
        let g = BucketGrid::new(1.0, 0.01).unwrap();
        assert_eq!(g.top(), 100);
        assert_eq!(g.bucket_of(0.0), 0);
        assert_eq!(g.bucket_of(1.0), 100);
        assert_eq!(g.bucket_of(7.0), 100);
        assert_eq!(g.bucket_of(0.5), 50);
        assert_eq!(g.bucket_of(0.500001), 51);
        assert_eq!(g.bucket_of(1e-300), 1);
        for i in 0..10_000 {
            let norm = i as f64 * 1.37e-4;
            let k = g.bucket_of(norm);
            assert!(g.value(k) >= norm.min(1.0), "norm {norm} -> {k}");
            assert!(
                k == 0 || g.value(k - 1) < norm,
                "not minimal: {norm} -> {k}"
            );
        }
    }

    #[test]
    fn uneven_grid_has_top_value_c() {
        let g = BucketGrid::new(1.0, 0.3).unwrap();
        assert_eq!(g.top(), 4);
        assert_eq!(g.value(3), 0.8999999999999999);
        assert_eq!(g.value(4), 1.0);
        assert_eq!(g.bucket_of(0.95), 4);
    }

    #[test]
    fn rejects_bad_grids() {
        assert_eq!(BucketGrid::new(0.0, 0.1).unwrap_err().name, "max_grad_norm");
        assert_eq!(BucketGrid::new(1.0, -1.0).unwrap_err().name, "rounding");
        assert!(BucketGrid::new(1.0, 1e-9).is_err());
    }
}

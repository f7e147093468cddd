//! An exact, order-independent sum of floats (Shewchuk's partials, as Python's
//! `math.fsum`), so that a release's mean is the same whether one ledger sums
//! every example or shards sum their ranges and the sums are merged:
//! the partials represent the exact real sum, and [`ExactSum::value`] rounds it
//! once, correctly, whatever the order of the additions and merges.

use serde::{Deserialize, Serialize};

/// The exact sum of finite floats added so far, as non-overlapping partials of
/// increasing magnitude.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExactSum {
    partials: Vec<f64>,
}

impl ExactSum {
    /// Add a finite `x` exactly.
    pub fn add(&mut self, mut x: f64) {
        let mut i = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        self.partials.truncate(i);
        self.partials.push(x);
    }

    /// Add another exact sum (a shard's), exactly.
    pub fn merge(&mut self, other: &ExactSum) {
        for &p in &other.partials {
            self.add(p);
        }
    }

    /// The exact sum rounded to the nearest float (ties to even): the same
    /// for every order of additions and merges.
    pub fn value(&self) -> f64 {
        let p = &self.partials;
        let mut n = p.len();
        if n == 0 {
            return 0.0;
        }
        n -= 1;
        let mut hi = p[n];
        let mut lo = 0.0;
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = p[n];
            hi = x + y;
            let yr = hi - x;
            lo = y - yr;
            if lo != 0.0 {
                break;
            }
        }
        // Round half-even correctly when the rest would push it over.
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            let yr = x - hi;
            if y == yr {
                hi = x;
            }
        }
        hi
    }
}

impl FromIterator<f64> for ExactSum {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        let mut s = ExactSum::default();
        for x in iter {
            s.add(x);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn sums_exactly_where_naive_summation_loses_bits() {
        let s: ExactSum = [1e16, 1.0, -1e16, 1.0].into_iter().collect();
        assert_eq!(s.value(), 2.0);
        let s: ExactSum = [0.1; 10].into_iter().collect();
        assert_eq!(s.value(), 1.0);
    }

    #[test]
    fn any_split_and_order_gives_the_same_value() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        let xs: Vec<f64> = (0..5000)
            .map(|_| rng.random::<f64>() * 7.3 - 3.65)
            .collect();
        let whole: ExactSum = xs.iter().copied().collect();
        for cuts in [[1, 2, 3], [1250, 2500, 3750], [7, 4000, 4999]] {
            let mut parts = Vec::new();
            let mut from = 0;
            for &c in cuts.iter().chain(std::iter::once(&xs.len())) {
                parts.push(xs[from..c].iter().copied().collect::<ExactSum>());
                from = c;
            }
            let mut merged = ExactSum::default();
            for p in parts.iter().rev() {
                merged.merge(p);
            }
            assert_eq!(merged.value().to_bits(), whole.value().to_bits());
        }
        let mut rev: Vec<f64> = xs.clone();
        rev.reverse();
        let r: ExactSum = rev.into_iter().collect();
        assert_eq!(r.value().to_bits(), whole.value().to_bits());
    }
}

//! RDP-to-epsilon conversion with the per-order constants precomputed.
//!
//! [`epsilon_from_rdp`](crate::accounting::conversion::epsilon_from_rdp) evaluates two
//! logarithms per order; over a million examples and 64 orders that is most of the
//! cost of a release. The constants depend only on the order and delta, so we compute
//! them once and evaluate the very same expression (same operations in the same
//! order), which keeps results bit-identical to `epsilon_from_rdp`.

use crate::accounting::conversion::{Conversion, EpsilonAtOrder};

/// Precomputed `epsilon_at` for fixed orders and delta (`0 < delta < 1`).
#[derive(Debug, Clone)]
pub(crate) struct Converter {
    orders: Vec<f64>,
    /// Improved: `ln1p(-1/alpha)`; classic: unused (0).
    add: Vec<f64>,
    /// Improved: `(ln delta + ln alpha)/(alpha-1)`; classic: `ln delta/(alpha-1)`.
    sub: Vec<f64>,
    conversion: Conversion,
}

impl Converter {
    /// Constants for `orders` (finite, `> 1`) at `delta` in `(0, 1)`.
    pub(crate) fn new(orders: &[f64], delta: f64, conversion: Conversion) -> Self {
        let (add, sub) = match conversion {
            Conversion::Improved => (
                orders.iter().map(|&a| (-1.0 / a).ln_1p()).collect(),
                orders
                    .iter()
                    .map(|&a| (delta.ln() + a.ln()) / (a - 1.0))
                    .collect(),
            ),
            Conversion::Classic => (
                vec![0.0; orders.len()],
                orders.iter().map(|&a| delta.ln() / (a - 1.0)).collect(),
            ),
        };
        Self {
            orders: orders.to_vec(),
            add,
            sub,
            conversion,
        }
    }

    /// The optimal epsilon (clamped at 0) and its order, as `epsilon_from_rdp`.
    pub(crate) fn epsilon(&self, rdp: &[f64]) -> EpsilonAtOrder {
        let mut best = EpsilonAtOrder {
            epsilon: f64::INFINITY,
            order: self.orders.first().copied().unwrap_or(f64::NAN),
        };
        for (j, &r) in rdp.iter().enumerate().take(self.orders.len()) {
            let eps = if !r.is_finite() {
                f64::INFINITY
            } else {
                match self.conversion {
                    Conversion::Improved => r + self.add[j] - self.sub[j],
                    Conversion::Classic => r - self.sub[j],
                }
            };
            if eps < best.epsilon {
                best = EpsilonAtOrder {
                    epsilon: eps,
                    order: self.orders[j],
                };
            }
        }
        best.epsilon = best.epsilon.max(0.0);
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::conversion::epsilon_from_rdp;
    use crate::accounting::orders::ledger_orders;

    #[test]
    fn bit_identical_to_the_accounting_conversion() {
        let orders = ledger_orders();
        for conversion in [Conversion::Improved, Conversion::Classic] {
            for &delta in &[1e-5, 0.3, 1e-12] {
                let c = Converter::new(&orders, delta, conversion);
                for scale in [0.0, 1e-9, 1e-3, 0.1, 7.0, 1e4] {
                    let rdp: Vec<f64> =
                        orders.iter().map(|a| scale * a * (1.0 + a.sin())).collect();
                    let fast = c.epsilon(&rdp);
                    let slow = epsilon_from_rdp(&orders, &rdp, delta, conversion);
                    assert_eq!(fast.epsilon.to_bits(), slow.epsilon.to_bits());
                    assert_eq!(fast.order, slow.order);
                }
            }
        }
    }
}

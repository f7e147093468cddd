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
    /// Set: the ex-post bound (spec §10) instead of the optimal conversion.
    ex_post: Option<ExPostSpec>,
}

/// The ex-post bound's orders (as indexes into the ledger's orders), their
/// weights and delta.
#[derive(Debug, Clone)]
struct ExPostSpec {
    indexes: Vec<usize>,
    orders: Vec<f64>,
    weights: Vec<f64>,
    delta: f64,
}

impl ExPostSpec {
    /// The subset `set` names of `orders`, located once.
    fn new(orders: &[f64], set: &crate::ledger::config::ExPostOrders, delta: f64) -> Self {
        Self {
            indexes: set
                .orders
                .iter()
                .filter_map(|a| orders.iter().position(|b| b == a))
                .collect(),
            orders: set.orders.clone(),
            weights: set.weights.clone(),
            delta,
        }
    }

    /// The ex-post bound of `rdp` (over the ledger's orders).
    fn epsilon(&self, rdp: &[f64]) -> f64 {
        let values: Vec<f64> = self.indexes.iter().map(|&j| rdp[j]).collect();
        crate::accounting::ex_post::ex_post_epsilon(
            &self.orders,
            &self.weights,
            &values,
            self.delta,
        )
    }
}

/// The ex-post bound (spec §10) of one RDP vector over `orders` at the subset
/// `set` names: what [`Converter::ex_post`] computes for every example of a
/// release, without the optimal conversion's per-order constants that one
/// query would not use.
pub(crate) fn ex_post_epsilon_of(
    orders: &[f64],
    set: &crate::ledger::config::ExPostOrders,
    rdp: &[f64],
    delta: f64,
) -> f64 {
    ExPostSpec::new(orders, set, delta).epsilon(rdp)
}

impl Converter {
    /// The ex-post bound (spec §10) of RDP vectors over `orders` at `delta`,
    /// at the subset `ex_post` names (validated at creation: a subset of
    /// `orders`). The order reported is the subset's first.
    pub(crate) fn ex_post(
        orders: &[f64],
        ex_post: &crate::ledger::config::ExPostOrders,
        delta: f64,
    ) -> Self {
        Self {
            ex_post: Some(ExPostSpec::new(orders, ex_post, delta)),
            ..Self::new(orders, delta, Conversion::Improved)
        }
    }

    /// The ex-post bound of `rdp`, when this converter computes it.
    #[inline]
    fn ex_post_of(&self, rdp: &[f64]) -> Option<EpsilonAtOrder> {
        let spec = self.ex_post.as_ref()?;
        Some(EpsilonAtOrder {
            epsilon: spec.epsilon(rdp),
            order: spec.orders.first().copied().unwrap_or(f64::NAN),
        })
    }

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
            ex_post: None,
        }
    }

    /// Heap bytes held (a view keeps one for its release).
    pub(crate) fn bytes(&self) -> usize {
        (self.orders.capacity() + self.add.capacity() + self.sub.capacity()) * 8
    }

    /// The optimal epsilon (clamped at 0) and its order, as `epsilon_from_rdp`.
    pub(crate) fn epsilon(&self, rdp: &[f64]) -> EpsilonAtOrder {
        if let Some(e) = self.ex_post_of(rdp) {
            return e;
        }
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

    /// [`Converter::epsilon`] for exactly `M` orders, bit for bit (same value,
    /// same order), written so that it vectorises: every order's epsilon is
    /// computed by the same two operations, the minimum is taken lane-wise
    /// (`if e < b { b = e }` never picks a NaN, as the scalar scan), and the
    /// order reported is the first whose epsilon equals the minimum, which is
    /// the one the scalar scan's strict `<` keeps. The all-epsilons pass
    /// (`ledger/dataset/pass.rs`) calls it once per example.
    #[inline(always)]
    pub(crate) fn epsilon_fixed<const M: usize>(&self, rdp: &[f64; M]) -> EpsilonAtOrder {
        if let Some(e) = self.ex_post_of(rdp) {
            return e;
        }
        const LANES: usize = 8;
        let add: &[f64; M] = self.add[..M].try_into().expect("M orders");
        let sub: &[f64; M] = self.sub[..M].try_into().expect("M orders");
        let mut eps = [0.0f64; M];
        match self.conversion {
            Conversion::Improved => {
                for j in 0..M {
                    let r = rdp[j];
                    eps[j] = if r.is_finite() {
                        r + add[j] - sub[j]
                    } else {
                        f64::INFINITY
                    };
                }
            }
            Conversion::Classic => {
                for j in 0..M {
                    let r = rdp[j];
                    eps[j] = if r.is_finite() {
                        r - sub[j]
                    } else {
                        f64::INFINITY
                    };
                }
            }
        }
        let mut lanes = [f64::INFINITY; LANES];
        let whole = M - M % LANES;
        for chunk in eps[..whole].chunks_exact(LANES) {
            for (b, &e) in lanes.iter_mut().zip(chunk) {
                if e < *b {
                    *b = e;
                }
            }
        }
        let mut min = f64::INFINITY;
        for &e in lanes.iter().chain(&eps[whole..]) {
            if e < min {
                min = e;
            }
        }
        if min < f64::INFINITY {
            // `min` is one of the values, so some order equals it.
            let j = eps.iter().position(|&e| e == min).unwrap_or(0);
            EpsilonAtOrder {
                epsilon: eps[j].max(0.0),
                order: self.orders[j],
            }
        } else {
            EpsilonAtOrder {
                epsilon: f64::INFINITY.max(0.0),
                order: self.orders.first().copied().unwrap_or(f64::NAN),
            }
        }
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

    /// The vectorised form agrees with the scalar scan bit for bit, ties,
    /// signed zeros, NaN and infinities included.
    #[test]
    fn fixed_width_form_is_the_scalar_scan() {
        let orders = ledger_orders();
        assert_eq!(orders.len(), 64);
        let specials = [
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
            f64::MAX,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for conversion in [Conversion::Improved, Conversion::Classic] {
            for &delta in &[1e-5, 0.3, 1e-12] {
                let c = Converter::new(&orders, delta, conversion);
                for case in 0..4000 {
                    let scale = [0.0, 1e-9, 1e-3, 0.1, 7.0, 1e4][case % 6];
                    let mut rdp = [0.0f64; 64];
                    for (j, r) in rdp.iter_mut().enumerate() {
                        *r = scale * orders[j] * (1.0 + orders[j].sin());
                    }
                    // Perturb a few orders: specials, ties with a neighbour, or
                    // values that make an arbitrary order the minimum.
                    for _ in 0..(next() % 5) {
                        let j = (next() % 64) as usize;
                        rdp[j] = match next() % 4 {
                            0 => specials[(next() % specials.len() as u64) as usize],
                            1 => rdp[(j + 1) % 64],
                            2 => -c.add[j] + c.sub[j],
                            _ => f64::from_bits(next() >> 2),
                        };
                    }
                    let fast = c.epsilon_fixed(&rdp);
                    let slow = c.epsilon(&rdp);
                    assert_eq!(fast.epsilon.to_bits(), slow.epsilon.to_bits(), "{rdp:?}");
                    assert_eq!(fast.order.to_bits(), slow.order.to_bits(), "{rdp:?}");
                }
                let all_nan = [f64::NAN; 64];
                assert_eq!(
                    c.epsilon_fixed(&all_nan).order.to_bits(),
                    c.epsilon(&all_nan).order.to_bits()
                );
            }
        }
    }
}

//! The numerical core: the Hölder composition of seed 001 evaluated for every
//! example, in log space, sharing work across examples.
//!
//! Between two checkpoint positions every run's level of an example is constant,
//! so an example's share of an interval depends only on its *tuple* of levels
//! (one per run; sorted, since the mean over runs is symmetric). Per interval we
//! compute each step's per-level exponents `p (alpha_j - 1) R` once (steps x
//! orders x levels used, the only SGM evaluations), then for each distinct tuple
//! the weighted log-mean-exp over runs. The log-mean-exp is a shifted sum of
//! precomputed exponentials with one logarithm; where that sum would underflow it
//! falls back to a direct logsumexp, so no value is ever lost to underflow.

use super::runs::RunSet;
use crate::accounting::sgm::{gaussian_rdp, sgm_rdp};
use crate::accounting::validate::MAX_ORDER;
use std::collections::HashMap;

/// Sums of shifted exponentials below this are recomputed by a direct logsumexp.
const UNDERFLOW_GUARD: f64 = 1e-280;

/// Composed data-dependent RDP of every example at every order.
#[derive(Debug, Clone, PartialEq)]
pub struct Composition {
    /// The orders `alpha`, as given.
    pub orders: Vec<f64>,
    /// The Hölder exponent `p`.
    pub holder: f64,
    /// Interval boundaries (see [`RunSet::boundaries`]).
    pub boundaries: Vec<u64>,
    /// `rdp[e * orders.len() + o]`: example `e`'s composed RDP at `orders[o]`.
    pub rdp: Vec<f64>,
}

impl Composition {
    /// Example `e`'s RDP curve (one value per order).
    pub fn example(&self, e: usize) -> &[f64] {
        let o = self.orders.len();
        &self.rdp[e * o..(e + 1) * o]
    }
}

/// Order at which step `t` of `steps` is charged: `alpha (p/(p-1))^j`, `j = T-1-t`,
/// and the step's weight `(p-1)^j / p^(j+1)` (both from the Hölder recursion; see
/// `docs/data-dependent.md`).
pub fn step_order_and_weight(alpha: f64, holder: f64, steps: usize, t: usize) -> (f64, f64) {
    let j = (steps - 1 - t) as f64;
    let growth = (1.0 / (holder - 1.0)).ln_1p(); // ln(p/(p-1))
    let order = alpha * (j * growth).exp();
    let weight = (j * (holder - 1.0).ln() - (j + 1.0) * holder.ln()).exp();
    (order, weight)
}

/// Compose every example at every order with Hölder exponent `holder` (> 1),
/// using `threads` worker threads. Works for one run too (then it is a plain,
/// reweighted RDP composition); callers that report an expectation over runs
/// must require at least two (see [`super::analyze`]).
pub fn compose(runs: &RunSet, orders: &[f64], holder: f64, threads: usize) -> Composition {
    let n = runs.examples();
    let o = orders.len();
    let boundaries = runs.boundaries();
    let mut rdp = vec![0.0; n * o];
    let all: Vec<usize> = (0..n).collect();
    for w in boundaries.windows(2) {
        let (tuples, of_example) = distinct_tuples(runs, &all, w[0]);
        let values = interval_values(runs, (w[0], w[1]), orders, holder, &tuples, threads);
        for (e, &ti) in of_example.iter().enumerate() {
            let src = &values[ti * o..(ti + 1) * o];
            for (dst, v) in rdp[e * o..(e + 1) * o].iter_mut().zip(src) {
                *dst += v;
            }
        }
    }
    Composition {
        orders: orders.to_vec(),
        holder,
        boundaries,
        rdp,
    }
}

/// Each example's share of each interval at one order per example
/// (`order_of[e]`): `out[e * intervals + i]`, in RDP units (already divided by
/// `alpha - 1`). Examples sharing an order share the work.
pub fn interval_contributions(
    runs: &RunSet,
    order_of: &[f64],
    holder: f64,
    threads: usize,
) -> Vec<f64> {
    let boundaries = runs.boundaries();
    let intervals = boundaries.len().saturating_sub(1);
    let mut out = vec![0.0; runs.examples() * intervals];
    let mut by_order: Vec<(f64, Vec<usize>)> = Vec::new();
    let mut sorted: Vec<usize> = (0..order_of.len()).collect();
    sorted.sort_by(|&a, &b| order_of[a].total_cmp(&order_of[b]));
    for e in sorted {
        match by_order.last_mut() {
            Some((a, members)) if *a == order_of[e] => members.push(e),
            _ => by_order.push((order_of[e], vec![e])),
        }
    }
    for (alpha, members) in &by_order {
        for (i, w) in boundaries.windows(2).enumerate() {
            let (tuples, of_member) = distinct_tuples(runs, members, w[0]);
            let values = interval_values(runs, (w[0], w[1]), &[*alpha], holder, &tuples, threads);
            for (&e, &ti) in members.iter().zip(&of_member) {
                out[e * intervals + i] = values[ti];
            }
        }
    }
    out
}

/// The distinct sorted level tuples of `examples` at step `at`, flattened (stride:
/// number of runs), and each example's tuple index.
fn distinct_tuples(runs: &RunSet, examples: &[usize], at: u64) -> (Vec<u32>, Vec<usize>) {
    let r = runs.runs();
    let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
    let mut flat = Vec::new();
    let mut of_example = Vec::with_capacity(examples.len());
    let mut key = vec![0u32; r];
    for &e in examples {
        for (run, k) in key.iter_mut().enumerate() {
            *k = runs.level(run, e, at);
        }
        key.sort_unstable();
        let next = index.len();
        let ti = *index.entry(key.clone()).or_insert_with(|| {
            flat.extend_from_slice(&key);
            next
        });
        of_example.push(ti);
    }
    (flat, of_example)
}

/// Per-step, per-order data of one interval over the levels it uses.
struct StepTable {
    /// `a[(s * orders + o) * levels + l]` = `p (alpha_j - 1) R_t(alpha_j; v_l)`.
    a: Vec<f64>,
    /// `exp(a - shift)`, with `shift[s * orders + o]` the largest `a` (if finite).
    e: Vec<f64>,
    shift: Vec<f64>,
    /// `weight / (alpha - 1)` of each (step, order).
    scale: Vec<f64>,
}

/// Sum over the interval's steps of each tuple's weighted log-mean-exp:
/// `out[tuple * orders.len() + o]`.
fn interval_values(
    runs: &RunSet,
    (start, end): (u64, u64),
    orders: &[f64],
    holder: f64,
    tuples: &[u32],
    threads: usize,
) -> Vec<f64> {
    let r = runs.runs();
    let n_tuples = tuples.len() / r.max(1);
    let mut levels: Vec<u32> = tuples.to_vec();
    levels.sort_unstable();
    levels.dedup();
    let slot: HashMap<u32, usize> = levels.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let local: Vec<usize> = tuples.iter().map(|k| slot[k]).collect();
    let table = step_table(runs, (start, end), orders, holder, &levels, threads);
    let no = orders.len();
    let nl = levels.len();
    let steps = (end - start) as usize;
    let log_r = (r as f64).ln();
    let mut out = vec![0.0; n_tuples * no];
    let chunk = n_tuples.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for (c, out_chunk) in out.chunks_mut(chunk * no).enumerate() {
            let (table, local) = (&table, &local);
            scope.spawn(move || {
                for (i, acc) in out_chunk.chunks_mut(no).enumerate() {
                    let ks = &local[(c * chunk + i) * r..(c * chunk + i + 1) * r];
                    for s in 0..steps {
                        for (o, acc_o) in acc.iter_mut().enumerate() {
                            let so = s * no + o;
                            let base = so * nl;
                            let shift = table.shift[so];
                            let mut lme = f64::NAN;
                            if shift.is_finite() {
                                let sum: f64 = ks.iter().map(|&l| table.e[base + l]).sum();
                                if sum >= UNDERFLOW_GUARD {
                                    lme = shift + sum.ln() - log_r;
                                }
                            }
                            if lme.is_nan() {
                                lme = log_mean_exp(ks.iter().map(|&l| table.a[base + l]), log_r);
                            }
                            *acc_o += if lme == f64::INFINITY {
                                f64::INFINITY
                            } else {
                                table.scale[so] * lme
                            };
                        }
                    }
                }
            });
        }
    });
    out
}

/// One step's RDP at a step order. Orders above [`MAX_ORDER`] (reached only with
/// a small Hölder exponent and many steps) are beyond the exact SGM computation;
/// there the unsampled Gaussian's `alpha / (2 sigma²)`, an upper bound, is used,
/// so the composition only ever loosens.
fn step_rdp(q: f64, sigma: f64, alpha: f64) -> f64 {
    if q == 0.0 || alpha <= MAX_ORDER {
        sgm_rdp(q, sigma, alpha)
    } else {
        gaussian_rdp(sigma, alpha)
    }
}

/// `log(mean(exp(x)))` of a few values, stably (`inf` if any is `inf`).
fn log_mean_exp(xs: impl Iterator<Item = f64> + Clone, log_n: f64) -> f64 {
    let m = xs.clone().fold(f64::NEG_INFINITY, f64::max);
    if !m.is_finite() {
        return m;
    }
    m + xs.map(|x| (x - m).exp()).sum::<f64>().ln() - log_n
}

/// The SGM evaluations of one interval, split over threads by step.
fn step_table(
    runs: &RunSet,
    (start, end): (u64, u64),
    orders: &[f64],
    holder: f64,
    levels: &[u32],
    threads: usize,
) -> StepTable {
    let total = runs.steps().len();
    let (no, nl) = (orders.len(), levels.len());
    let steps = (end - start) as usize;
    let mut a = vec![0.0; steps * no * nl];
    let mut scale = vec![0.0; steps * no];
    let per = (steps * no).div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for (c, (a_chunk, s_chunk)) in a
            .chunks_mut(per * nl)
            .zip(scale.chunks_mut(per))
            .enumerate()
        {
            scope.spawn(move || {
                for (i, (row, sc)) in a_chunk.chunks_mut(nl).zip(s_chunk.iter_mut()).enumerate() {
                    let so = c * per + i;
                    let (s, o) = (so / no, so % no);
                    let t = start as usize + s;
                    let p = runs.steps()[t];
                    let (alpha_j, w) = step_order_and_weight(orders[o], holder, total, t);
                    *sc = w / (orders[o] - 1.0);
                    for (x, &k) in row.iter_mut().zip(levels) {
                        let sigma = runs.grid().effective_sigma(p.noise_multiplier, k);
                        let rho = step_rdp(p.sampling_rate, sigma, alpha_j);
                        *x = if rho == 0.0 {
                            0.0
                        } else {
                            holder * (alpha_j - 1.0) * rho
                        };
                    }
                }
            });
        }
    });
    let mut shift = vec![f64::NAN; steps * no];
    let mut e = vec![0.0; a.len()];
    for (so, m) in shift.iter_mut().enumerate() {
        let row = &a[so * nl..(so + 1) * nl];
        *m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m.is_finite() {
            for (x, &v) in e[so * nl..(so + 1) * nl].iter_mut().zip(row) {
                *x = (v - *m).exp();
            }
        }
    }
    StepTable { a, e, shift, scale }
}

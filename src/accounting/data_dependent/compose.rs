//! The numerical core: the Hölder composition of seed 001 evaluated for every
//! example, in log space, sharing work across examples, steps and orders.
//!
//! Two observations make it cheap:
//! - every SGM evaluation `p (alpha_j - 1) R(q_t, sigma_t C / v_k, alpha_j)` depends
//!   only on the step's `(q, sigma)`, its step order `alpha_j` and the level `k`:
//!   a table computes each distinct `(q, sigma, alpha_j)` × level once, shared
//!   by the composition and by the per-interval contributions;
//! - between two checkpoint positions every run's level of an example is constant,
//!   so an example's share of an interval depends only on its *tuple* of levels
//!   (one per run; sorted, since the mean over runs is symmetric), and steps of the
//!   interval with the same table row share one log-mean-exp (their weights add).
//!
//! [`Rounding`] optionally rounds step orders UP to a geometric grid (many steps
//! then share a row) and levels UP to a coarser grid (fewer distinct tuples). Both
//! only loosen the bound: each term `log E exp(p (alpha_j - 1) R(alpha_j))` grows
//! with `alpha_j` (`(alpha - 1) D_alpha` is nondecreasing) and with the
//! sensitivity. [`Rounding::EXACT`] evaluates the derivation exactly.
//!
//! The log-mean-exp is a shifted sum of precomputed exponentials with one
//! logarithm; where that sum would underflow it falls back to a direct logsumexp,
//! so no value is ever lost to underflow.

use super::runs::RunSet;
use crate::accounting::sgm::{gaussian_rdp, sgm_rdp};
use crate::accounting::validate::MAX_ORDER;
use std::collections::HashMap;

/// Sums of shifted exponentials below this are recomputed by a direct logsumexp.
const UNDERFLOW_GUARD: f64 = 1e-280;

/// How step orders and sensitivity levels are evaluated. Rounding only loosens
/// the estimate (never makes it smaller than the exact composition).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rounding {
    /// Step orders are rounded UP to the grid `order_ratio^k` (`1` = exact).
    pub order_ratio: f64,
    /// Levels are rounded UP to multiples of `level_stride` (at most the top
    /// level `K`, i.e. `C`); `1` = the ledger's grid.
    pub level_stride: u32,
}

impl Rounding {
    /// The derivation evaluated exactly (fractional orders, the ledger's grid).
    pub const EXACT: Rounding = Rounding {
        order_ratio: 1.0,
        level_stride: 1,
    };

    /// The default of the CLI and HTTP analysis: step orders rounded up to a
    /// 1% geometric grid, levels as in the ledger (see `docs/performance.md`).
    pub const FAST: Rounding = Rounding {
        order_ratio: 1.01,
        level_stride: 1,
    };

    /// Whether this is the exact evaluation.
    pub fn is_exact(&self) -> bool {
        self.order_ratio == 1.0 && self.level_stride <= 1
    }

    /// `Err` naming the field when out of range (`order_ratio` in `[1, 2]`,
    /// `level_stride` in `1..=1000`).
    pub fn check(&self) -> Result<(), String> {
        if !(self.order_ratio >= 1.0 && self.order_ratio <= 2.0) {
            return Err(format!(
                "order_ratio: must be in [1, 2], got {}",
                self.order_ratio
            ));
        }
        if !(1..=1000).contains(&self.level_stride) {
            return Err(format!(
                "level_stride: must be in 1..=1000, got {}",
                self.level_stride
            ));
        }
        Ok(())
    }

    /// `alpha` rounded up to the order grid (never below `alpha`).
    pub fn round_order(&self, alpha: f64) -> f64 {
        if self.order_ratio == 1.0 {
            return alpha;
        }
        let step = self.order_ratio.ln();
        let mut k = (alpha.ln() / step).ceil();
        let mut v = (k * step).exp();
        while v < alpha {
            k += 1.0;
            v = (k * step).exp();
        }
        v
    }

    /// Level `k` rounded up to the level grid, at most `top`.
    pub fn round_level(&self, k: u32, top: u32) -> u32 {
        let s = self.level_stride.max(1);
        if s == 1 {
            return k;
        }
        (k.div_ceil(s).saturating_mul(s)).min(top)
    }
}

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
/// exactly, using `threads` worker threads. Works for one run too (then it is a
/// plain, reweighted RDP composition); callers that report an expectation over
/// runs must require at least two (see [`super::analyze`]).
pub fn compose(runs: &RunSet, orders: &[f64], holder: f64, threads: usize) -> Composition {
    compose_rounded(runs, orders, holder, Rounding::EXACT, threads)
}

/// [`compose`] with orders and levels rounded as `rounding` says.
pub fn compose_rounded(
    runs: &RunSet,
    orders: &[f64],
    holder: f64,
    rounding: Rounding,
    threads: usize,
) -> Composition {
    Core::new(runs, orders, holder, rounding, threads).compose(threads)
}

/// Each example's share of each interval at one order per example
/// (`order_of[e]`): `out[e * intervals + i]`, in RDP units (already divided by
/// `alpha - 1`), evaluated exactly.
pub fn interval_contributions(
    runs: &RunSet,
    order_of: &[f64],
    holder: f64,
    threads: usize,
) -> Vec<f64> {
    let mut distinct: Vec<f64> = order_of.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let index: Vec<usize> = order_of
        .iter()
        .map(|a| distinct.partition_point(|b| b < a))
        .collect();
    Core::new(runs, &distinct, holder, Rounding::EXACT, threads).contributions(&index, threads)
}

/// The SGM evaluations and per-step bookkeeping shared by the composition and
/// the contributions.
pub(super) struct Core<'a> {
    runs: &'a RunSet,
    orders: Vec<f64>,
    holder: f64,
    boundaries: Vec<u64>,
    /// Row of the table charged by step `t` at base order `o`: `row[t * no + o]`.
    row: Vec<u32>,
    /// `weight / (alpha - 1)` of step `t` at base order `o`.
    scale: Vec<f64>,
    /// Column of each level (after rounding) in the table.
    column: Vec<u32>,
    /// Columns per row.
    width: usize,
    /// `a[row * width + column]` = `p (alpha_j - 1) R(q, sigma C / v, alpha_j)`.
    a: Vec<f64>,
    /// `exp(a - shift[row])`.
    e: Vec<f64>,
    /// The largest `a` of each row (may be `inf`; then the direct logsumexp is used).
    shift: Vec<f64>,
}

impl<'a> Core<'a> {
    /// Plan the step orders and evaluate every distinct SGM term once.
    pub(super) fn new(
        runs: &'a RunSet,
        orders: &[f64],
        holder: f64,
        rounding: Rounding,
        threads: usize,
    ) -> Self {
        let steps = runs.steps();
        let total = steps.len();
        let no = orders.len();
        let top = runs.grid().top();
        // Distinct rows: (q bits, sigma bits, step order bits).
        let mut rows: HashMap<(u64, u64, u64), u32> = HashMap::new();
        let mut row_keys: Vec<(f64, f64, f64)> = Vec::new();
        let mut row = Vec::with_capacity(total * no);
        let mut scale = Vec::with_capacity(total * no);
        for (t, s) in steps.iter().enumerate() {
            for &alpha in orders {
                let (alpha_j, w) = step_order_and_weight(alpha, holder, total, t);
                let alpha_j = rounding.round_order(alpha_j);
                let key = (
                    s.sampling_rate.to_bits(),
                    s.noise_multiplier.to_bits(),
                    alpha_j.to_bits(),
                );
                let next = rows.len() as u32;
                let r = *rows.entry(key).or_insert_with(|| {
                    row_keys.push((s.sampling_rate, s.noise_multiplier, alpha_j));
                    next
                });
                row.push(r);
                scale.push(w / (alpha - 1.0));
            }
        }
        // Columns: the (rounded) levels any run uses, and the top level.
        let mut used = vec![false; top as usize + 1];
        used[top as usize] = true;
        for r in 0..runs.runs() {
            for c in &runs.runs[r] {
                for &k in &c.levels {
                    used[rounding.round_level(k, top) as usize] = true;
                }
            }
        }
        let mut column = vec![u32::MAX; top as usize + 1];
        let mut levels = Vec::new();
        for (k, &u) in used.iter().enumerate() {
            if u {
                column[k] = levels.len() as u32;
                levels.push(k as u32);
            }
        }
        // Map every raw level straight to the column of its rounded level.
        let column: Vec<u32> = (0..=top)
            .map(|k| column[rounding.round_level(k, top) as usize])
            .collect();
        let width = levels.len();
        let mut a = vec![0.0; row_keys.len() * width];
        let per = row_keys.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|scope| {
            for (c, chunk) in a.chunks_mut(per * width).enumerate() {
                let (row_keys, levels) = (&row_keys, &levels);
                scope.spawn(move || {
                    for (i, out) in chunk.chunks_mut(width).enumerate() {
                        let (q, sigma, alpha_j) = row_keys[c * per + i];
                        for (x, &k) in out.iter_mut().zip(levels) {
                            let sigma_eff = runs.grid().effective_sigma(sigma, k);
                            let rho = step_rdp(q, sigma_eff, alpha_j);
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
        let mut shift = vec![f64::NEG_INFINITY; row_keys.len()];
        let mut e = vec![0.0; a.len()];
        for (r, m) in shift.iter_mut().enumerate() {
            let vals = &a[r * width..(r + 1) * width];
            *m = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m.is_finite() {
                for (x, &v) in e[r * width..(r + 1) * width].iter_mut().zip(vals) {
                    *x = (v - *m).exp();
                }
            }
        }
        Core {
            runs,
            orders: orders.to_vec(),
            holder,
            boundaries: runs.boundaries(),
            row,
            scale,
            column,
            width,
            a,
            e,
            shift,
        }
    }

    /// Steps of interval `[start, end)` grouped by row, per base order `o` in
    /// `which`: `groups[k]` = `(row, summed scale)` lists, one per entry of `which`.
    fn groups(&self, (start, end): (u64, u64), which: &[usize]) -> Vec<Vec<(u32, f64)>> {
        let no = self.orders.len();
        which
            .iter()
            .map(|&o| {
                let mut g: Vec<(u32, f64)> = Vec::new();
                for t in start as usize..end as usize {
                    let (r, s) = (self.row[t * no + o], self.scale[t * no + o]);
                    match g.iter_mut().find(|(gr, _)| *gr == r) {
                        Some((_, acc)) => *acc += s,
                        None => g.push((r, s)),
                    }
                }
                g
            })
            .collect()
    }

    /// `sum_groups scale * log mean_runs exp(a[row, column])` of one tuple.
    fn value(&self, cols: &[u32], groups: &[(u32, f64)], log_r: f64) -> f64 {
        let mut acc = 0.0;
        for &(r, s) in groups {
            let base = r as usize * self.width;
            let shift = self.shift[r as usize];
            let mut lme = f64::NAN;
            if shift.is_finite() {
                let sum: f64 = cols.iter().map(|&c| self.e[base + c as usize]).sum();
                if sum >= UNDERFLOW_GUARD {
                    lme = shift + sum.ln() - log_r;
                }
            }
            if lme.is_nan() {
                lme = log_mean_exp(cols.iter().map(|&c| self.a[base + c as usize]), log_r);
            }
            if lme == f64::INFINITY {
                return f64::INFINITY;
            }
            acc += s * lme;
        }
        acc
    }

    /// Every example's composed RDP at every order.
    pub(super) fn compose(&self, threads: usize) -> Composition {
        let n = self.runs.examples();
        let no = self.orders.len();
        let mut rdp = vec![0.0; n * no];
        let all: Vec<usize> = (0..n).collect();
        let which: Vec<usize> = (0..no).collect();
        let r = self.runs.runs();
        let log_r = (r as f64).ln();
        for w in self.boundaries.windows(2) {
            let (tuples, of_example) = self.distinct_tuples(&all, w[0]);
            let groups = self.groups((w[0], w[1]), &which);
            let n_tuples = tuples.len() / r.max(1);
            let mut values = vec![0.0; n_tuples * no];
            let chunk = n_tuples.div_ceil(threads.max(1)).max(1);
            std::thread::scope(|scope| {
                for (c, out) in values.chunks_mut(chunk * no).enumerate() {
                    let (tuples, groups) = (&tuples, &groups);
                    scope.spawn(move || {
                        for (i, acc) in out.chunks_mut(no).enumerate() {
                            let cols = &tuples[(c * chunk + i) * r..(c * chunk + i + 1) * r];
                            for (o, x) in acc.iter_mut().enumerate() {
                                *x = self.value(cols, &groups[o], log_r);
                            }
                        }
                    });
                }
            });
            for (e, &ti) in of_example.iter().enumerate() {
                let src = &values[ti * no..(ti + 1) * no];
                for (dst, v) in rdp[e * no..(e + 1) * no].iter_mut().zip(src) {
                    *dst += v;
                }
            }
        }
        Composition {
            orders: self.orders.clone(),
            holder: self.holder,
            boundaries: self.boundaries.clone(),
            rdp,
        }
    }

    /// Each example's share of each interval at base order `order_index[e]`:
    /// `out[e * intervals + i]`, in RDP units.
    pub(super) fn contributions(&self, order_index: &[usize], threads: usize) -> Vec<f64> {
        let n = order_index.len();
        let intervals = self.boundaries.len().saturating_sub(1);
        let r = self.runs.runs();
        let log_r = (r as f64).ln();
        let mut out = vec![0.0; n * intervals];
        let which: Vec<usize> = (0..self.orders.len()).collect();
        let per_interval: Vec<Vec<Vec<(u32, f64)>>> = self
            .boundaries
            .windows(2)
            .map(|w| self.groups((w[0], w[1]), &which))
            .collect();
        let chunk = n.div_ceil(threads.max(1)).max(1);
        std::thread::scope(|scope| {
            for (c, block) in out.chunks_mut(chunk * intervals.max(1)).enumerate() {
                let per_interval = &per_interval;
                scope.spawn(move || {
                    let mut cols = vec![0u32; r];
                    for (i, row) in block.chunks_mut(intervals.max(1)).enumerate() {
                        let e = c * chunk + i;
                        for (iv, (x, w)) in
                            row.iter_mut().zip(self.boundaries.windows(2)).enumerate()
                        {
                            for (run, col) in cols.iter_mut().enumerate() {
                                *col = self.column[self.runs.level(run, e, w[0]) as usize];
                            }
                            *x = self.value(&cols, &per_interval[iv][order_index[e]], log_r);
                        }
                    }
                });
            }
        });
        out
    }

    /// The distinct sorted column tuples of `examples` at step `at`, flattened
    /// (stride: number of runs), and each example's tuple index.
    fn distinct_tuples(&self, examples: &[usize], at: u64) -> (Vec<u32>, Vec<usize>) {
        let r = self.runs.runs();
        let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut flat = Vec::new();
        let mut of_example = Vec::with_capacity(examples.len());
        let mut key = vec![0u32; r];
        for &e in examples {
            for (run, k) in key.iter_mut().enumerate() {
                *k = self.column[self.runs.level(run, e, at) as usize];
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

//! Per-example gradient norms and clipping factors.
//!
//! **Why the margin.** The gradient the optimizer receives is computed in `f32`,
//! the norms here in `f64` from the same `f32` tensors; the two differ by
//! floating-point rounding (about 1e-7 relative per operation). So that rounding
//! can never make an example's contribution exceed its threshold, or exceed the
//! norm the ledger charges it at, each example is clipped to
//! `threshold * (1 - CLIP_MARGIN)` and reported with norm `norm * (1 + CLIP_MARGIN)`:
//! for `CLIP_MARGIN = 1e-5` the contribution stays below both as long as the
//! rounding error of a per-example gradient is below 1e-6 relative. Reporting a
//! slightly larger norm only charges slightly more.

use crate::error::{Error, Result};
use crate::model::LinearTape;
use tch::{Kind, Tensor};

/// Relative safety margin of clipping and reporting (see the module docs).
pub const CLIP_MARGIN: f64 = 1e-5;

/// How per-example gradient norms are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormMethod {
    /// Per-layer (one backward pass) when the model records a tape, else per
    /// example.
    #[default]
    Auto,
    /// One backward pass per example, for any model (slow; the reference).
    PerExample,
}

fn to_vec(t: &Tensor) -> Result<Vec<f64>> {
    Ok(Vec::<f64>::try_from(
        &t.to_kind(Kind::Double).to_device(tch::Device::Cpu),
    )?)
}

fn ptr(t: &Tensor) -> usize {
    t.data_ptr() as usize
}

/// Check that every parameter is the weight or bias of exactly one taped layer and
/// that the tape holds nothing else: a parameter outside the tape would be missing
/// from the norms, and its gradient would escape clipping.
pub fn check_tape_covers(tape: &[LinearTape], params: &[Tensor]) -> Result<()> {
    let mut taped: Vec<usize> = Vec::new();
    for (i, t) in tape.iter().enumerate() {
        if t.input.dim() != 2 || t.output.dim() != 2 {
            return Err(Error::Model(format!(
                "taped layer {i} has input of {} and output of {} dimensions; the per-layer \
                 method needs (batch, features)",
                t.input.dim(),
                t.output.dim()
            )));
        }
        taped.push(ptr(&t.weight));
        taped.extend(t.bias.iter().map(ptr));
    }
    let mut sorted = taped.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::Model(
            "a parameter appears in two taped layers (shared weights): use NormMethod::PerExample"
                .into(),
        ));
    }
    let mut params_sorted: Vec<usize> = params.iter().map(ptr).collect();
    params_sorted.sort_unstable();
    if params_sorted != sorted {
        return Err(Error::Model(format!(
            "the tape covers {} parameter tensors but the model lists {} (or different ones): \
             every trainable parameter must be the weight or bias of exactly one taped layer",
            sorted.len(),
            params_sorted.len()
        )));
    }
    Ok(())
}

/// Per-example gradient norms from one backward pass through the taped linear
/// layers. `losses` are the per-example losses `(batch,)` of the forward pass that
/// recorded `tape`; the graph is kept for a later backward pass.
pub fn per_layer_norms(
    losses: &Tensor,
    tape: &[LinearTape],
    params: &[Tensor],
) -> Result<Vec<f64>> {
    check_tape_covers(tape, params)?;
    let batch = losses.size1()?;
    if batch == 0 {
        return Ok(Vec::new());
    }
    let total = losses.sum(losses.kind());
    let outputs: Vec<&Tensor> = tape.iter().map(|t| &t.output).collect();
    let grads = Tensor::f_run_backward(&[&total], &outputs, true, false)?;
    let mut squared = Tensor::zeros([batch], (Kind::Double, losses.device()));
    for (t, g) in tape.iter().zip(&grads) {
        if g.size()[0] != batch || t.input.size()[0] != batch {
            return Err(Error::Model(
                "a taped layer's batch dimension differs from the losses'".into(),
            ));
        }
        let g2 = g
            .to_kind(Kind::Double)
            .square()
            .sum_dim_intlist(1, false, Kind::Double);
        let mut x2 = t
            .input
            .to_kind(Kind::Double)
            .square()
            .sum_dim_intlist(1, false, Kind::Double);
        if t.bias.is_some() {
            x2 += 1.0;
        }
        squared += g2 * x2;
    }
    to_vec(&squared.sqrt())
}

/// Per-example gradient norms by one backward pass per example over `params`
/// (every parameter must take part in the loss). Keeps the graph.
pub fn per_example_norms(losses: &Tensor, params: &[Tensor]) -> Result<Vec<f64>> {
    let batch = losses.size1()?;
    let mut norms = Vec::with_capacity(batch as usize);
    for i in 0..batch {
        let grads = Tensor::f_run_backward(&[losses.get(i)], params, true, false)?;
        let mut sq = 0.0;
        for g in &grads {
            sq += g
                .to_kind(Kind::Double)
                .square()
                .sum(Kind::Double)
                .double_value(&[]);
        }
        norms.push(sq.sqrt());
    }
    Ok(norms)
}

/// The factor each example's gradient is scaled by so that its norm stays below
/// `threshold * (1 - CLIP_MARGIN)`: 1 when it already does, 0 for a zero threshold.
pub fn clip_factors(norms: &[f64], thresholds: &[f64]) -> Vec<f64> {
    norms
        .iter()
        .zip(thresholds)
        .map(|(&norm, &threshold)| {
            let target = threshold * (1.0 - CLIP_MARGIN);
            if threshold <= 0.0 {
                0.0
            } else if norm <= target {
                1.0
            } else {
                target / norm
            }
        })
        .collect()
}

/// The norm reported to the ledger for an observed norm: rounded up by the margin.
pub fn reported_norm(norm: f64) -> f64 {
    norm * (1.0 + CLIP_MARGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_bound_the_clipped_norm() {
        let norms = [0.0, 0.5, 0.99999, 1.0, 3.0, 2.0, 1e-30];
        let thresholds = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5];
        let f = clip_factors(&norms, &thresholds);
        for ((n, t), f) in norms.iter().zip(&thresholds).zip(&f) {
            assert!(
                n * f <= t * (1.0 - CLIP_MARGIN) * (1.0 + 1e-15),
                "{n} {t} {f}"
            );
            assert!((0.0..=1.0).contains(f));
        }
        assert_eq!(f[1], 1.0);
        assert_eq!(f[5], 0.0);
        assert!(reported_norm(0.3) > 0.3);
    }
}

//! Models the trainer can compute per-example gradient norms for.
//!
//! Any model works through the per-example backward pass ([`AnyModule`]). A model
//! built from linear layers can also record a [`LinearTape`] during its forward
//! pass, which gives every example's gradient norm from one backward pass (the
//! per-layer method of Opacus, without materialising per-example gradients): for
//! `z = x Wᵀ + b` and `g = ∂loss_i/∂z_i`, the example's gradient of `W` is `g xᵀ`,
//! whose squared norm is `|g|² |x|²`, and that of `b` is `g`.

use tch::nn::{self, Module};
use tch::Tensor;

/// One linear layer's record of a forward pass.
#[derive(Debug)]
pub struct LinearTape {
    /// The layer's input `x`, shape `(batch, in)`, detached.
    pub input: Tensor,
    /// The layer's output `z = x Wᵀ + b`, shape `(batch, out)`, in the graph.
    pub output: Tensor,
    /// The weight `W` (to check that the tape covers every parameter).
    pub weight: Tensor,
    /// The bias `b`, when the layer has one.
    pub bias: Option<Tensor>,
}

impl LinearTape {
    /// Apply `layer` to `xs` and record it.
    pub fn record(layer: &nn::Linear, xs: &Tensor) -> (Tensor, LinearTape) {
        let z = xs.linear(&layer.ws, layer.bs.as_ref());
        let tape = LinearTape {
            input: xs.detach(),
            output: z.shallow_clone(),
            weight: layer.ws.shallow_clone(),
            bias: layer.bs.as_ref().map(Tensor::shallow_clone),
        };
        (z, tape)
    }
}

/// A model trained with DP-SGD: every trainable parameter is listed by
/// [`DpModule::parameters`] (each receives noise), and examples do not interact in
/// the forward pass (no batch normalisation), so that the gradient of example
/// `i`'s loss is its own.
pub trait DpModule {
    /// Logits (or predictions) for a batch.
    fn forward(&self, xs: &Tensor) -> Tensor;

    /// The forward pass with a tape of its linear layers, when every parameter
    /// belongs to one of them. `None` selects the per-example backward pass.
    fn forward_tape(&self, _xs: &Tensor) -> Option<(Tensor, Vec<LinearTape>)> {
        None
    }

    /// Every trainable parameter.
    fn parameters(&self) -> Vec<Tensor>;
}

/// Activation between the layers of an [`Mlp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// tanh(x): bounded, often better for DP-SGD (Papernot et al. 2021).
    Tanh,
}

impl Activation {
    fn apply(self, xs: &Tensor) -> Tensor {
        match self {
            Activation::Relu => xs.relu(),
            Activation::Tanh => xs.tanh(),
        }
    }
}

/// A multilayer perceptron with per-layer gradient norms.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<nn::Linear>,
    activation: Activation,
}

impl Mlp {
    /// Layers of sizes `dims[0] -> dims[1] -> ... -> dims[last]` under `path`,
    /// with `activation` between them (none after the last).
    pub fn new(path: &nn::Path, dims: &[i64], activation: Activation) -> Self {
        assert!(dims.len() >= 2, "an MLP needs an input and an output size");
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| nn::linear(path / format!("layer{i}"), w[0], w[1], Default::default()))
            .collect();
        Self { layers, activation }
    }
}

impl DpModule for Mlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h);
            if i + 1 < self.layers.len() {
                h = self.activation.apply(&h);
            }
        }
        h
    }

    fn forward_tape(&self, xs: &Tensor) -> Option<(Tensor, Vec<LinearTape>)> {
        let mut h = xs.shallow_clone();
        let mut tape = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let (z, t) = LinearTape::record(layer, &h);
            tape.push(t);
            h = if i + 1 < self.layers.len() {
                self.activation.apply(&z)
            } else {
                z
            };
        }
        Some((h, tape))
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.layers
            .iter()
            .flat_map(|l| {
                std::iter::once(l.ws.shallow_clone()).chain(l.bs.iter().map(Tensor::shallow_clone))
            })
            .collect()
    }
}

/// Any `tch` module with its parameters; norms by per-example backward passes.
#[derive(Debug)]
pub struct AnyModule<M> {
    /// The module.
    pub module: M,
    /// Its trainable parameters (e.g. `vs.trainable_variables()`).
    pub params: Vec<Tensor>,
}

impl<M: Module> DpModule for AnyModule<M> {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.params.iter().map(Tensor::shallow_clone).collect()
    }
}

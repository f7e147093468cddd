//! DP-SGD for `tch` (libtorch) models with per-example privacy accounting by
//! dpledger.
//!
//! [`DpSgd`] draws Poisson batches (the sampling the accounting assumes), computes
//! every sampled example's gradient norm ([`grad`]: per layer for models built from
//! linear layers such as [`Mlp`], by per-example backward passes for any other
//! model), clips each example at the threshold dpledger holds for it, adds Gaussian
//! noise of standard deviation `noise_multiplier * C`, reports the step and only
//! then steps the optimizer. Optional full-batch refreshes move thresholds to the
//! examples' current norms.
//!
//! ```no_run
//! use dpledger_client::Client;
//! use dpledger_tch::{Activation, DpSgd, DpSgdConfig, Examples, Mlp};
//! use tch::nn::{self, OptimizerConfig};
//!
//! # fn main() -> dpledger_tch::Result<()> {
//! let data = Examples::from_csv("target/digits.csv".as_ref(), 16.0)?;
//! let vs = nn::VarStore::new(tch::Device::Cpu);
//! let model = Mlp::new(&vs.root(), &[64, 64, 10], Activation::Tanh);
//! let mut opt = nn::Sgd::default().build(&vs, 0.5)?;
//! let client = Client::new("http://127.0.0.1:8080", "TRAINER-TOKEN")?;
//! let mut trainer = DpSgd::new(client, "digits", DpSgdConfig::default())?;
//! for _ in 0..trainer.steps_per_epoch() {
//!     trainer.step(&model, &mut opt, &data)?;
//! }
//! # Ok(()) }
//! ```

pub mod data;
mod error;
pub mod grad;
pub mod model;
pub mod sampler;
mod trainer;

pub use data::{accuracy, Examples};
pub use error::{Error, Result};
pub use grad::NormMethod;
pub use model::{Activation, AnyModule, DpModule, LinearTape, Mlp};
pub use trainer::{DpSgd, DpSgdConfig, StepStats};

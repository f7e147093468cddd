//! What the tch integration tests share: the server binary and a small
//! synthetic classification task.

use dpledger_client::local::locate_binary;
use dpledger_tch::{Activation, Examples, Mlp};
use std::path::{Path, PathBuf};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// `$DPLEDGER_BIN`, else `target/<profile>/dpledger`, else the workspace's release
/// build; a missing binary fails the test.
pub fn binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    locate_binary(&[workspace.join("target/release/dpledger")]).unwrap_or_else(|e| panic!("{e}"))
}

/// Four well-separated Gaussian classes in 16 dimensions.
pub fn blobs(n: i64, seed: i64) -> Examples {
    tch::manual_seed(seed);
    let centers = Tensor::randn([4, 16], (Kind::Float, Device::Cpu)) * 1.5;
    let ys = Tensor::arange(n, (Kind::Int64, Device::Cpu)).remainder(4);
    let xs =
        centers.index_select(0, &ys) + Tensor::randn([n, 16], (Kind::Float, Device::Cpu)) * 0.5;
    Examples::new(xs, ys).unwrap()
}

/// The task's training set, a small MLP over it and plain SGD at rate 1 (the
/// trainer adds the noise). The variable store is kept: it owns the weights.
pub struct Task {
    pub train: Examples,
    pub vs: nn::VarStore,
    pub model: Mlp,
    pub opt: nn::Optimizer,
}

/// [`Task`] for `n` examples of [`blobs`] (seed 3).
pub fn task(n: i64) -> Task {
    let train = blobs(n, 3);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Mlp::new(&vs.root(), &[16, 32, 4], Activation::Tanh);
    let opt = nn::Sgd::default().build(&vs, 1.0).unwrap();
    Task {
        train,
        vs,
        model,
        opt,
    }
}

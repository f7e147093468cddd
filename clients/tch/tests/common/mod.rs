//! What the tch integration tests share: the server binary and a small
//! synthetic classification task.

use dpledger_client::local::locate_binary;
use dpledger_tch::Examples;
use std::path::{Path, PathBuf};
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

//! Shared by the integration tests: the real `dpledger` binary on a free loopback
//! port with a temporary data directory, and an admin client for it.
#![allow(dead_code)]

pub mod proxy;

use dpledger_client::local::{locate_binary, LocalServer};
use dpledger_client::{Client, DatasetConfig};
use std::path::{Path, PathBuf};

/// The server binary: `$DPLEDGER_BIN`, else `target/<profile>/dpledger` of this test
/// executable, else `<workspace>/target/release/dpledger`. A missing binary fails
/// the test with instructions; it never skips it.
pub fn binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    locate_binary(&[workspace.join("target/release/dpledger")]).unwrap_or_else(|e| panic!("{e}"))
}

/// A server on a temporary data directory.
pub struct Env {
    pub server: LocalServer,
    pub admin: Client,
    // Dropped last: the server is killed before its directory goes.
    pub dir: tempfile::TempDir,
}

impl Env {
    /// Start a server; `admin` acts under its admin token.
    pub fn start() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = LocalServer::start(&binary(), dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let admin =
            Client::new(server.url(), &server.admin_token().expect("admin token")).expect("client");
        Env { server, admin, dir }
    }

    /// A client acting under a freshly minted token.
    pub fn client_as(&self, role: &str, dataset: Option<&str>, examples: Option<&str>) -> Client {
        let token = self
            .server
            .token(role, dataset, examples)
            .unwrap_or_else(|e| panic!("{e}"));
        self.admin.with_token(&token).expect("client")
    }
}

/// A small Poisson configuration with rounding 0.01 and C = 1, of the
/// sampled protocol (a step report moves a sampled example's threshold),
/// which these tests of the client's protocol handling exercise.
pub fn config(n: u64, q: f64, sigma: f64) -> DatasetConfig {
    let mut c = DatasetConfig::poisson(n, 1.0, sigma, q, 1e-5);
    c.rounding = Some(0.01);
    c.thresholds = Some(dpledger_client::ThresholdMode::Sampled);
    c
}

/// Relative difference.
pub fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        ((a - b) / b).abs()
    }
}

/// A deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Poisson batch of `0..n` at rate `q`, ids increasing.
    pub fn batch(&mut self, n: u64, q: f64) -> Vec<u64> {
        (0..n).filter(|_| self.uniform() < q).collect()
    }
}

//! dpledger: per-instance Rényi-DP accounting for DP-SGD training runs.
//!
//! See `README.md` for the service, and `docs/architecture.md` for its layers:
//! `api` → `engine` → `store` → `ledger` → `accounting`, and `release` →
//! `accounting`, without cycles.

pub mod accounting;
pub mod api;
pub mod cli;
pub mod dashboard;
pub mod engine;
pub mod ledger;
pub mod release;
pub mod store;

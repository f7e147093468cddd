//! dpledger: per-instance Rényi-DP accounting for DP-SGD training runs.
//!
//! See `README.md` for the service and the accounting contract it implements.

pub mod accounting;
pub mod api;
pub mod cli;
pub mod ledger;
pub mod release;
pub mod store;

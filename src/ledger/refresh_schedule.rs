//! The predictable mode's public refresh schedule (spec §3.2), as a dataset's
//! configuration declares it: full passes every `E` steps and/or a
//! round-robin block of `m` ids per step, and which part of the block a shard
//! of a sharded dataset is due. The types and the block rule are part of the
//! configuration, defined once with the Rust client in the workspace crate
//! `dpledger-api`. The ledger's bookkeeping of what arrived is
//! `dataset/schedule.rs`.

pub use dpledger_api::config::{RefreshSchedule, ShardSpan};

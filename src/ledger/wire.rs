//! Compact binary encoding of one step report (or one part of it): format `DPLS`,
//! version 1.
//!
//! The same bytes are the payload of `StepPart` records in the store (which reuses
//! this module as `store::codec`) and the binary body of the step endpoint. The
//! format and its codec are defined once, with the Rust client that writes it, in
//! the workspace crate `dpledger-api` (`dpledger_api::codec`, where the layout is
//! documented byte by byte); this module re-exports them under the server's paths.

pub use dpledger_api::codec::{encode_step, CodecError, HexBytes, StepPayload, MAGIC, VERSION};

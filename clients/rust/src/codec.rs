//! The compact binary encoding of a step report (`DPLS`, version 1), the body of
//! `POST /v1/datasets/{d}/steps` with `Content-Type: application/octet-stream`.
//!
//! A 4096-example step is about 64 KiB instead of ~150 KiB of JSON, and the server
//! stores exactly these bytes. The encoder is the server's own, from the workspace
//! crate `dpledger-api` ([`dpledger_api::codec`], where the layout is documented
//! byte by byte), so the two cannot disagree on a byte:
//!
//! `DPLS`, version `1`, flags (bit 0 part, bit 1 noise multiplier, bit 2 sampling
//! rate, bit 3 delta-encoded ids), `step` u64, [part index u32, count u32],
//! [noise multiplier f64], [sampling rate f64], `n_ids` u64, `n_norms` u64, ids
//! (u64 each, or LEB128 varints of the first id and the positive gaps when the ids
//! are strictly increasing), norms (f64 bits), CRC-32 of everything before it.
//!
//! Norms travel bit for bit, so a binary report and the same report in JSON are the
//! same report to the ledger (a retry in either encoding is recognised).

pub use dpledger_api::codec::{encode_step, CONTENT_TYPE};

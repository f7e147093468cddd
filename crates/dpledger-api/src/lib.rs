//! The wire of dpledger's step protocol, written once for the two sides that
//! speak it: the server (`dpledger`) and the Rust client (`dpledger-client`).
//!
//! A step report is the one message whose bytes matter beyond their meaning: the
//! server stores the binary encoding as its log record, recognises a resent
//! report by a hash of its content, and a sharded dataset's parts must be cut
//! identically wherever they are cut. Two copies of these rules could drift
//! apart silently (a client encoding a report the server then hashes or
//! decodes differently); one crate cannot. So this crate owns:
//!
//! * [`step`]: the step protocol's messages ([`StepReport`], [`Part`],
//!   [`StepOutcome`], [`RefreshDue`], [`RefreshOutcome`]) as JSON bodies, with
//!   the retry hash and the merge of a sharded dataset's due refreshes;
//! * [`codec`]: the compact binary step encoding (`DPLS`, version 1), byte by
//!   byte;
//! * [`status`]: the parts of a dataset's status both sides read (a step in
//!   progress, the individual filter's budgets);
//! * [`shard_rule`]: the rule that splits a step's batch over a sharded
//!   dataset's shards.
//!
//! With the `openapi` feature (the server's) the messages derive
//! `utoipa::ToSchema` for the server's OpenAPI document; the client leaves it
//! off and never builds utoipa.

pub mod codec;
pub mod shard_rule;
pub mod status;
pub mod step;

pub use step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

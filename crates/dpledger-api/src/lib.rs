//! The wire of dpledger (its step protocol first), written once for the two
//! sides that speak it: the server (`dpledger`) and the Rust client (`dpledger-client`).
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
//!   dataset's shards, and [`split_step`]: a step report split by it and its
//!   shards' answers merged back;
//! * [`config`]: a dataset's configuration (and the RDP-to-DP
//!   [`config::Conversion`] its queries name), with the pure rules that read
//!   it;
//! * [`views`]: the answers of the dataset and privacy queries (a dataset's
//!   view, thresholds, an example's privacy, the worst case, the PLD
//!   estimate), reading the server's `null` for an unbounded value as
//!   infinity ([`null_inf`]);
//! * [`storage`]: the storage report of `GET /v1/admin/storage`;
//! * [`release`]: the DP releases' requests (with their validation and
//!   cost), what they publish, the release budget and the policy;
//! * [`accountant`]: the stateless accountant's requests and answers;
//! * [`analysis`]: the report of the data-dependent analysis over runs;
//! * [`error`]: the refusal of a malformed field that validation returns;
//! * [`problem`]: the problem document of every error answer;
//! * [`cluster`]: the cluster map and the answer to a drain.
//!
//! The server adds its own rules beside these types (validation against its
//! limits, the accounting that fills them in) as free functions and
//! extension traits; what is here is the data and what needs nothing else.
//!
//! With the `openapi` feature (the server's) the messages derive
//! `utoipa::ToSchema` for the server's OpenAPI document; the client leaves it
//! off and never builds utoipa. With the `cli` feature (the server's too) the
//! accountant's choices derive `clap::ValueEnum` for its CLI flags.

pub mod accountant;
pub mod analysis;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod error;
pub mod null_inf;
pub mod problem;
pub mod release;
pub mod shard_rule;
pub mod split_step;
pub mod status;
pub mod step;
pub mod storage;
pub mod views;

pub use step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

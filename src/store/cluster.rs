//! Cluster coordination in PostgreSQL: the node registry with its
//! heartbeats, and one lease per dataset with an epoch that every write of the
//! log is fenced by.
//!
//! The database is the only judge of time and ownership: expiries are computed
//! with PostgreSQL's `now()`, never a node's clock, and a takeover is one
//! `UPDATE` that bumps the epoch. Every record a cluster node appends carries
//! its epoch ([`Store::append_fenced`](super::Store::append_fenced)); a trigger
//! on `dpledger_events` takes the dataset's lease row `FOR SHARE` in the same
//! transaction and refuses the insert (SQLSTATE `DPF01`, surfaced as
//! [`StoreError::Fenced`](super::StoreError::Fenced)) unless that epoch is the
//! current one. The argument that this makes a stale owner harmless is in
//! `docs/cluster.md`.
//!
//! ```sql
//! dpledger_nodes(node_id TEXT PRIMARY KEY, advertise TEXT, heartbeat TIMESTAMPTZ,
//!                draining BOOLEAN, memory_free BIGINT NULL, ledger_bytes BIGINT NULL)
//! dpledger_leases(dataset TEXT PRIMARY KEY, owner TEXT NULL, epoch BIGINT,
//!                 expires_at TIMESTAMPTZ)
//! dpledger_events.epoch BIGINT NULL   -- the writer's epoch, checked by the trigger
//! dpledger_shards(dataset TEXT PRIMARY KEY, examples BIGINT, shards INT, spec TEXT)
//!                                     -- sharded datasets: the layout
//! dpledger_decisions(id TEXT PRIMARY KEY, outcome TEXT, created TIMESTAMPTZ)
//!                                     -- a change across shards: 'commit' or 'abort'
//!                                     -- (rows older than DECISIONS_KEPT pruned)
//! dpledger_node_secret(id SMALLINT PRIMARY KEY CHECK (id = 1), secret BYTEA)
//!                                     -- the key of node marks, made by the first node
//! ```

pub use super::pg::cluster::{ClusterDb, LeaseRow, NodeMemory, NodeRow};
pub use super::pg::shard_commit::{
    new_change_id, CrossCommit, Decision, CHANGE_COMMITS_WITHIN, DECISIONS_KEPT,
};
pub use super::pg::shards::{LayoutClaim, LayoutRow};

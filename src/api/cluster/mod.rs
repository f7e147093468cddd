//! The HTTP side of cluster mode's node-to-node calls: the client every
//! node-to-node request goes through (`node_client.rs`), the engine's
//! [`Peers`](crate::engine::sharding::Peers) over it (`peers.rs`: the
//! coordinator's prepare and decide calls to the owners of shards on other
//! nodes, node-marked), and the owners' side of those calls (`owner.rs`:
//! checked, then handed to the engine).

pub mod node_client;
mod owner;
mod peers;

pub(super) use owner::{is_owner_call, routes};
pub use peers::HttpPeers;

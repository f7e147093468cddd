//! The shard map of a sharded dataset as `GET /v1/datasets/{dataset}` shows it.
//! A leaf: the dataset view embeds it, the shard routes fill it. The type is
//! defined once, with the Rust client, in the workspace crate `dpledger-api`.

pub use dpledger_api::views::ShardView;

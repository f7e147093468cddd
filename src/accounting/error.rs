//! Errors of the accounting layer: always name the argument that was wrong.
//! The error type is the wire types' too (their validation returns it), so it
//! is defined once, with the Rust client, in the workspace crate
//! `dpledger-api`.

pub use dpledger_api::error::InvalidArgument;

/// Result type of the accounting layer.
pub type Result<T> = std::result::Result<T, InvalidArgument>;

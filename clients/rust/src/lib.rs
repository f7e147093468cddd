//! Typed async client for dpledger (skeleton; see issue 7).

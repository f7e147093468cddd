//! What a release asks for, its validation, and its zCDP cost: the cost depends
//! only on the request (never on the data), so it is known and checked against
//! the budget before any data is touched. The request, its validation and its
//! cost are part of the wire, defined once with the Rust client in the
//! workspace crate `dpledger-api` and re-exported here.

pub use dpledger_api::release::{
    HistogramRequest, MeanRequest, QuantileMethod, QuantilesRequest, ReleaseRequest, MAX_BINS,
    MAX_GRADIENT_STEPS, MAX_LEVELS,
};

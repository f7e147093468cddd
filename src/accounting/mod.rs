//! Pure privacy mathematics (spec §2, §4, §5): no I/O, no clocks.
//!
//! Everything the service reports is computed here; the rest of dpledger only
//! stores inputs and composes these results.

pub mod calibrate;
pub mod compare;
pub mod composition;
pub mod conversion;
pub mod data_dependent;
pub mod error;
pub mod ex_post;
pub mod grid;
pub mod orders;
pub mod pld;
pub mod quadrature;
pub mod schedule;
pub mod sgm;
pub mod special;
pub mod table;
pub mod trace_line;
pub mod validate;

pub use conversion::{Conversion, EpsilonAtOrder};
pub use error::InvalidArgument;
pub use grid::BucketGrid;

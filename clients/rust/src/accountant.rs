//! Bodies of the stateless accountant endpoints (`/v1/accountant/*`): the same
//! computations as the `dpledger` CLI, for planning a run before it starts.
//! Unbounded results are `None` (the server's `null`).
//!
//! The bodies are defined once with the server in the workspace crate
//! `dpledger-api`. The requests leave an absent option out of the JSON; the
//! accountant's choice is [`AccountantMethod`] (the server's `Method`), also
//! in the answers' `method`.

/// The requests and answers, as the server reads and writes them.
pub use dpledger_api::accountant::{
    BatchingKind, CompareRequest, CompareResponse, CompareRow, EpsilonRequest, EpsilonResponse,
    NoiseRequest, NoiseResponse, RdpRequest, RdpResponse, ScheduleEpoch, ScheduleKind,
    ScheduleRequest, ScheduleResponse,
};

/// Which accountant computes a worst-case number: PLD (the tightest, the
/// server's default) or exact RDP.
pub use dpledger_api::accountant::Method as AccountantMethod;

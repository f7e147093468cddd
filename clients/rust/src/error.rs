//! Errors of the client. A refusal by the server keeps its RFC 9457 problem
//! document, so the caller sees exactly what the server said was wrong (the
//! `detail`, and the `field` at fault when there is one).

use crate::release::BudgetRefusal;

/// An `application/problem+json` document as dpledger answers every
/// refusal: the server's own type, defined once in the workspace crate
/// `dpledger-api` (`detail`, the `field` at fault, and the `budget` and
/// `owner` extensions).
pub use dpledger_api::problem::Problem;

/// Everything a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request and said why. Not retried unless the status
    /// is a transient one (5xx, 429) and the call is idempotent; then this is the
    /// answer to the last attempt.
    #[error("dpledger refused the request: {problem}")]
    Api {
        /// The server's problem document (for a non-problem error body, one
        /// synthesised from the status and the body text).
        problem: Problem,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The request never got an answer (connection refused or reset, timeout, TLS).
    /// For idempotent calls this is the error of the last of `attempts` attempts.
    #[error("could not reach dpledger after {attempts} attempt(s): {source}")]
    Transport {
        /// The last transport error.
        #[source]
        source: reqwest::Error,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The server answered 2xx with a body this client cannot read (a version
    /// mismatch between client and server).
    #[error("unexpected response body from {endpoint} (status {status}): {message}")]
    Decode {
        /// The endpoint called.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// What did not parse.
        message: String,
    },
    /// The request was refused before it was sent (a malformed base URL or dataset
    /// id, mismatched lengths, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The threshold mirror cannot apply an answer: it is out of step with the
    /// ledger (e.g. an answer for a step other than the one it expects).
    #[error("threshold mirror out of sync: {0}")]
    Mirror(String),
    /// A step was about to be sent while the refresh the public schedule calls
    /// for before it (predictable mode, spec §3.2) had not been sent: the server
    /// would refuse the step (409), so the session refuses it before sending.
    /// Send [`crate::TrainingSession::due`]'s ids with their norms first.
    #[error("step {step} needs the scheduled refresh first: {detail}")]
    RefreshDue {
        /// The step that was refused.
        step: u64,
        /// What is still due.
        detail: String,
    },
    /// Writing the local trace failed.
    #[error("trace: {0}")]
    Trace(#[from] std::io::Error),
}

impl Error {
    /// The server's problem document, when the server refused the request.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api { problem, .. } => Some(problem),
            _ => None,
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<u16> {
        self.problem().map(|p| p.status)
    }

    /// For a release refused because the release budget does not allow it (409):
    /// the spend, the request and the budget.
    pub fn budget(&self) -> Option<&BudgetRefusal> {
        self.problem().and_then(|p| p.budget.as_deref())
    }
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, Error>;

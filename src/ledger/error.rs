//! Errors of the ledger. Every mutating call validates completely before it changes
//! anything, so any of these errors means "nothing happened".

use crate::accounting::InvalidArgument;
use serde::Serialize;

/// How a front end should answer an error: a malformed request or one that
/// contradicts the ledger's state. Kept separate from HTTP so that the ledger does
/// not depend on the server; the server maps these to 400 and 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request itself is wrong (HTTP 400): fixing the request fixes it.
    BadRequest,
    /// The request contradicts what the ledger already holds (HTTP 409): a different
    /// step was already applied, a step is out of order, or parts disagree.
    Conflict,
}

/// Everything a ledger call can refuse. No variant is ever returned after a partial
/// mutation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerError {
    /// A field is malformed or out of range; `name` says which.
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// Steps are applied exactly once and in order; this one is not the next.
    #[error("step {got} is out of order: the ledger expects step {expected} next")]
    OutOfOrder {
        /// The step the ledger will accept next.
        expected: u64,
        /// The step that was reported.
        got: u64,
    },
    /// The report contradicts what was already received for this step (different
    /// content for an applied step or part, parts that disagree or overlap).
    #[error("conflict at step {step}: {reason}")]
    Conflict {
        /// The step concerned.
        step: u64,
        /// What disagrees.
        reason: String,
    },
    /// A retry of a step so old that its answer is no longer kept.
    #[error(
        "step {step} was applied long ago: only the last {window} applied steps can be retried"
    )]
    Archived {
        /// The step that was retried.
        step: u64,
        /// How many recent steps keep their answers.
        window: u64,
    },
    /// Shuffle mode: an example was reported twice within one epoch, which breaks
    /// the one-charge-per-epoch analysis the worst case relies on.
    #[error(
        "example {id} was already processed in epoch {epoch} (steps {first_step}..={last_step}); \
         a shuffled epoch processes each example at most once (step {step} refused)"
    )]
    EpochViolation {
        /// The refused step.
        step: u64,
        /// The example reported twice.
        id: u64,
        /// The epoch in which it was already processed.
        epoch: u64,
        /// First step of that epoch.
        first_step: u64,
        /// Last step of that epoch.
        last_step: u64,
    },
    /// A multi-part step is half received; `action` cannot run until it completes.
    #[error(
        "step {step} is in progress ({received} of {count} parts received): \
         {action} must wait until all its parts have arrived"
    )]
    StepInProgress {
        /// The incomplete step.
        step: u64,
        /// Parts received so far.
        received: u32,
        /// Parts announced.
        count: u32,
        /// What was refused (e.g. "a refresh").
        action: &'static str,
    },
    /// Predictable mode: the refresh scheduled before this step has not fully
    /// arrived, so the trainer may not have clipped at the thresholds the
    /// ledger charges (spec §3.2).
    #[error(
        "step {step} needs the scheduled refresh first: {missing} of the {count} ids due \
         ({due}) have not arrived; send POST .../refresh with their unclipped norms, \
         computed at the model before step {step}"
    )]
    RefreshDue {
        /// The refused step.
        step: u64,
        /// Due ids not received (retired ids excepted).
        missing: u64,
        /// Ids due before the step.
        count: u64,
        /// Which ids are due, in words.
        due: String,
    },
    /// Predictable mode: a refresh that the public schedule does not call for
    /// (another time, other ids, or ids already refreshed); thresholds may
    /// change only on the schedule declared at creation (spec §3.2).
    #[error("refresh refused before step {step}: {reason}")]
    OffSchedule {
        /// The step the refresh would take effect at.
        step: u64,
        /// Why it is off the schedule.
        reason: String,
    },
}

impl LedgerError {
    /// The class of the error, for mapping to a transport status code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LedgerError::Invalid(_) => ErrorKind::BadRequest,
            LedgerError::OutOfOrder { .. }
            | LedgerError::Conflict { .. }
            | LedgerError::Archived { .. }
            | LedgerError::EpochViolation { .. }
            | LedgerError::StepInProgress { .. }
            | LedgerError::RefreshDue { .. }
            | LedgerError::OffSchedule { .. } => ErrorKind::Conflict,
        }
    }

    /// Shorthand for an [`LedgerError::Invalid`] naming field `name`.
    pub(crate) fn invalid(name: &str, reason: impl Into<String>) -> Self {
        LedgerError::Invalid(InvalidArgument::new(name, reason))
    }
}

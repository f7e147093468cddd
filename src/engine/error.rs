//! The engine's domain errors. Each says what was refused and why, in words a
//! client can act on, and carries the facts a front end needs to classify it
//! (malformed, not found, contradicts the state, over budget, unavailable) —
//! but no HTTP: `api::errors` maps them to problem documents in one place.
//!
//! The `Display` text of every variant is the detail served to clients (and kept
//! as a release policy's refusal), so it must never contain a secret or a
//! per-example privacy value.

use crate::accounting::InvalidArgument;
use crate::ledger::LedgerError;
use crate::store::StoreError;

/// A refused release: what was spent and what was asked (a problem
/// extension, defined with the problem document in `dpledger-api`).
pub use dpledger_api::problem::BudgetRefusal;

/// Everything the engine can refuse. An error means nothing was acknowledged; where
/// a change may have reached the log anyway, the dataset is marked stale and
/// reloaded before it is touched again.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The ledger refused (malformed input, or a contradiction of its state).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A field is malformed or out of range; its name says which.
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// The request is malformed in a way only the engine can see.
    #[error("{detail}")]
    BadRequest {
        /// What is wrong.
        detail: String,
        /// The field at fault.
        field: Option<&'static str>,
    },
    /// No such dataset (or nothing of the kind asked for in it).
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts the current state (archived, taken id, ...).
    #[error("{detail}")]
    Conflict {
        /// What it contradicts.
        detail: String,
        /// The field at fault, when one is.
        field: Option<&'static str>,
    },
    /// A release the release budget does not allow, with the numbers.
    #[error("{detail}")]
    OverBudget {
        /// Why, in words.
        detail: String,
        /// What was spent and what was asked.
        refusal: BudgetRefusal,
    },
    /// A release that would bring examples it does not leave out so close to
    /// their individual budget that the filter would retire them, or past it
    /// (releases never retire examples). Examples near their budget are left
    /// out of a release's input (spec §6) by their ledgers at the step the
    /// release read; this happens when steps since brought others near. The
    /// count depends on individual epsilons: only curators may read it.
    #[error(
        "this release would push {would_retire} examples that it does not leave out of its \
         input so close to their individual budget that the filter would retire them (steps \
         applied while it was computed brought them near it); releases never retire examples \
         (trainers learn of retirements only from step answers): retry, or spend less rho"
    )]
    WouldRetire {
        /// How many examples the filter would retire.
        would_retire: u64,
    },
    /// A release whose cost would pass the individual budget of every example:
    /// it would leave them all out of its input and tell nothing.
    #[error(
        "this release's cost would pass the individual budget of all {examples} examples, so \
         it would leave every example out of its input and tell nothing: spend less rho"
    )]
    LeavesOutEveryone {
        /// The dataset's number of examples.
        examples: u64,
    },
    /// The store refused or failed an append; nothing was acknowledged. With
    /// [`StoreError::OutcomeUnknown`] the change may nevertheless be in the log
    /// (the client is told so, never that nothing was applied).
    #[error("{}", store_detail(.0))]
    Store(StoreError),
    /// The idempotency key was used for another request on this dataset.
    #[error(
        "Idempotency-Key {key:?} was already used with a different request on this dataset: \
         send a new key for a new request"
    )]
    KeyReused {
        /// The key.
        key: String,
    },
    /// The dataset is not servable right now (memory may be behind the log, or the
    /// log could not be read back): retrying later helps.
    #[error("{0}")]
    Unavailable(String),
    /// Cluster mode: this node does not own the dataset (any more, or not yet):
    /// another node serves it, or will once its lease moves. Retrying, at the
    /// owner, helps.
    #[error("{0}")]
    NotOwner(String),
    /// The engine could not do its part (a task failed, a persisted change could
    /// not be applied); nothing was acknowledged.
    #[error("{0}")]
    Internal(String),
    /// A change across shards found its shards unable to agree now (steps in
    /// flight at every try, budgets or label names that differ): nothing was
    /// charged, and a retry may find them level.
    #[error("{0}")]
    ShardsApart(String),
    /// Another node's refusal of this node's call on the caller's behalf (a
    /// shard's owner refused a prepare, or could not be reached), kept as it
    /// was answered so that the caller is told exactly what the owner said.
    #[error("{0}")]
    Peer(PeerRefusal),
    /// A step of a sharded dataset that some shards applied while another
    /// refused its part: neither whole nor absent, which a plain refusal
    /// would misstate. The detail names both.
    #[error("{0}")]
    PartiallyApplied(String),
    /// A request that a sharded dataset cannot answer exactly across its
    /// shards (or a change sent to one shard that only its dataset may make):
    /// refused rather than answered wrongly.
    #[error("{0}")]
    ShardedUnsupported(String),
}

/// Shards' answers that do not fit the parts they answer: the engine's
/// failure (a shard or a peer answered wrongly), never the caller's.
impl From<dpledger_api::split_step::MismatchedAnswers> for EngineError {
    fn from(e: dpledger_api::split_step::MismatchedAnswers) -> Self {
        EngineError::Internal(e.to_string())
    }
}

impl EngineError {
    /// A conflict without a field.
    pub(crate) fn conflict(detail: impl Into<String>) -> Self {
        EngineError::Conflict {
            detail: detail.into(),
            field: None,
        }
    }

    /// Why a release was refused, in words that depend on no individual's data:
    /// what viewers and owners read of a refused policy release. Budget
    /// figures are public (they depend only on the requests); counts of examples
    /// near their individual budget are not, so they are left out.
    pub fn public_reason(&self) -> &'static str {
        match self {
            EngineError::OverBudget { .. } => {
                "the release budget does not cover this release: a curator can raise the \
                 budget or lower the policy's rho"
            }
            EngineError::WouldRetire { .. } => {
                "this release would bring examples too close to their individual budget \
                 (releases never retire examples): a curator can lower the policy's rho"
            }
            EngineError::LeavesOutEveryone { .. } => {
                "this release's cost passes every example's individual budget, so it would \
                 leave every example out: a curator can lower the policy's rho"
            }
            EngineError::Store(_)
            | EngineError::Unavailable(_)
            | EngineError::NotOwner(_)
            | EngineError::Internal(_)
            | EngineError::ShardsApart(_) => {
                "the server could not record this release; the policy tries again at its next step"
            }
            _ => "the policy's release was refused; a curator of the dataset can read why",
        }
    }

    /// Whether the refusal is the server's side not doing its part now (what
    /// a front end answers 5xx): retrying may help, unlike a refusal of the
    /// request itself. A sharded policy release retries on these and records
    /// them as unavailability.
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineError::Store(_) => !self.is_duplicate() && !self.is_key_in_use(),
            EngineError::Unavailable(_)
            | EngineError::NotOwner(_)
            | EngineError::Internal(_)
            | EngineError::ShardsApart(_) => true,
            EngineError::Peer(p) => p.status >= 500,
            _ => false,
        }
    }

    /// Whether another process stored the same step first: a conflict for the
    /// client, not an outage.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, EngineError::Store(StoreError::Duplicate { .. }))
    }

    /// Whether the store could not tell if the change was committed: it may be
    /// in the log, so the answer must not say "nothing was applied".
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, EngineError::Store(StoreError::OutcomeUnknown { .. }))
    }

    /// Whether another request with the same idempotency key is being applied.
    pub fn is_key_in_use(&self) -> bool {
        matches!(self, EngineError::Store(StoreError::KeyUsed { .. }))
    }

    /// A store failure, logged where it happens (the client only hears "retry").
    pub(crate) fn store(e: StoreError) -> Self {
        if !matches!(e, StoreError::Duplicate { .. } | StoreError::KeyUsed { .. }) {
            tracing::error!(error = %e, "store append failed; nothing was acknowledged");
        }
        EngineError::Store(e)
    }
}

/// What a client is told of a store failure: a duplicate means another process
/// wrote this step (this one's view is stale); anything else, that nothing was
/// made durable. The store's own message (paths, URLs) is logged, never served.
fn store_detail(e: &StoreError) -> String {
    match e {
        StoreError::Duplicate {
            dataset,
            step,
            part,
        } => format!(
            "step {step} part {} of dataset {dataset} is already recorded in the store by another \
             dpledger process; this process's view is stale (restart it to reload the log)",
            part.unwrap_or(0)
        ),
        StoreError::OutcomeUnknown { .. } => "the store did not confirm the commit of this change: \
             it may or may not have been applied (the dataset is being reloaded from the log). \
             Retry with the same Idempotency-Key: the retry is answered from the change if it \
             was applied, and applies it once if it was not"
            .to_string(),
        StoreError::KeyUsed { key, .. } => format!(
            "Idempotency-Key {key:?} is being used by another request on this dataset: retry"
        ),
        _ => "the store could not make this change durable; nothing was applied or acknowledged: retry"
            .to_string(),
    }
}

/// Another node's refusal of a call, kept as it answered: its status, media
/// type, `Retry-After` and body. The HTTP layer answers it verbatim; the
/// engine reads only whether it is the server's side ([`Self::status`] 5xx)
/// and its detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRefusal {
    /// The answer's status code.
    pub status: u16,
    /// Its media type, when it had one.
    pub content_type: Option<String>,
    /// Its `Retry-After`, when it had one.
    pub retry_after: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

impl PeerRefusal {
    /// The body as JSON (a problem document), or `null`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

impl std::fmt::Display for PeerRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.json()["detail"].as_str() {
            Some(detail) => f.write_str(detail),
            None => write!(f, "refused with {}", self.status),
        }
    }
}

/// Result of engine calls.
pub type EngineResult<T> = Result<T, EngineError>;

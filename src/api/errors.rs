//! The one place where domain errors become problem documents: the engine's, the
//! ledger's and invalid arguments. Keeping the mapping here means the engine and
//! the ledger never learn HTTP status codes, and a new domain error gets its
//! status in exactly one match.

use super::problem::Problem;
use crate::accounting::InvalidArgument;
use crate::engine::EngineError;
use crate::ledger::{ErrorKind, LedgerError};
use axum::http::StatusCode;

impl From<InvalidArgument> for Problem {
    fn from(e: InvalidArgument) -> Self {
        let field = e.name.clone();
        Problem::bad_request(e.to_string()).with_field(field)
    }
}

impl From<LedgerError> for Problem {
    fn from(e: LedgerError) -> Self {
        match (&e, e.kind()) {
            (LedgerError::Invalid(inner), _) => inner.clone().into(),
            (_, ErrorKind::BadRequest) => Problem::bad_request(e.to_string()),
            (_, ErrorKind::Conflict) => Problem::conflict(e.to_string()),
        }
    }
}

impl From<EngineError> for Problem {
    fn from(e: EngineError) -> Self {
        let detail = e.to_string();
        let duplicate = e.is_duplicate();
        let outcome_unknown = e.is_outcome_unknown();
        let key_in_use = e.is_key_in_use();
        let with_field = |p: Problem, field: Option<&str>| match field {
            Some(f) => p.with_field(f),
            None => p,
        };
        match e {
            EngineError::Ledger(e) => e.into(),
            EngineError::Invalid(e) => e.into(),
            EngineError::BadRequest { field, .. } => {
                with_field(Problem::bad_request(detail), field)
            }
            EngineError::NotFound(_) => Problem::not_found(detail),
            EngineError::Conflict { field, .. } => with_field(Problem::conflict(detail), field),
            EngineError::WouldRetire { .. } | EngineError::LeavesOutEveryone { .. } => {
                Problem::conflict(detail)
            }
            EngineError::OverBudget { refusal, .. } => {
                Problem::conflict(detail).with_budget(refusal)
            }
            EngineError::Store(_) if duplicate => Problem::conflict(detail),
            // Never "nothing was applied": the change may be in the log.
            EngineError::Store(_) if outcome_unknown => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown", detail)
            }
            // Another request with the same key is being applied (the draft's 409).
            EngineError::Store(_) if key_in_use => {
                Problem::new(StatusCode::CONFLICT, "idempotency-key-in-use", detail)
                    .with_field("Idempotency-Key")
            }
            EngineError::KeyReused { .. } => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                detail,
            )
            .with_field("Idempotency-Key"),
            EngineError::Store(_) | EngineError::Unavailable(_) => {
                Problem::internal(StatusCode::SERVICE_UNAVAILABLE, detail)
            }
            EngineError::NotOwner(_) => Problem::not_owner(detail, None),
            EngineError::Internal(_) => {
                Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, detail)
            }
            EngineError::ShardsApart(_) => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "shards-apart", detail)
            }
            EngineError::PartiallyApplied(_) => {
                Problem::new(StatusCode::CONFLICT, "partially-applied", detail)
            }
            EngineError::ShardedUnsupported(_) => {
                Problem::new(StatusCode::CONFLICT, "sharded-unsupported", detail)
            }
            // Answered as the peer answered it.
            EngineError::Peer(p) => Problem::passed_on(p),
        }
    }
}

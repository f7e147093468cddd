//! RFC 9457 `application/problem+json` errors: every refusal says what was wrong.
//!
//! A leaf of `api`: it imports nothing else of the HTTP layer, so every module may
//! use it. How domain errors become problems is in `errors.rs`.

use crate::engine::sharding::PeerRefusal;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of error bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answered to the client. `detail` must never contain a secret or a
/// per-example privacy value.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URN naming the kind of problem (stable, machine-readable).
    #[serde(rename = "type")]
    pub kind: String,
    /// Short human-readable summary of the kind.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What exactly was wrong with this request.
    pub detail: String,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For a release refused by its budget: what was spent and what was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::engine::BudgetRefusal>)]
    pub budget: Option<Box<crate::engine::BudgetRefusal>>,
    /// For `urn:dpledger:problem:not-owner` (cluster mode): the node that owns
    /// the dataset, when it is known. Answered with `Retry-After`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<OwnerRef>)]
    pub owner: Option<Box<OwnerRef>>,
    /// Another node's refusal passed on (a shard's owner answered this
    /// node's call on the caller's behalf): answered exactly as that node
    /// answered it (status, media type, `Retry-After`, body), so that the
    /// caller hears what the owner said. Never part of the document itself.
    #[serde(skip)]
    pub passed_on: Option<Box<PeerRefusal>>,
}

/// A cluster node as named in a not-owner problem.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OwnerRef {
    /// The node's id.
    pub node_id: String,
    /// Its advertised base URL (send the dataset's requests there).
    pub advertise: String,
}

/// Slug of the retryable refusal of a node that cannot serve or forward a
/// dataset's request (cluster mode).
pub const NOT_OWNER: &str = "not-owner";

impl Problem {
    /// A problem with the given status, slug (for the type URN) and detail.
    pub fn new(status: StatusCode, slug: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("urn:dpledger:problem:{slug}"),
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            budget: None,
            owner: None,
            passed_on: None,
        }
    }

    /// Another node's refusal, answered as that node answered it; its
    /// status, type and detail as far as its body says them.
    pub fn passed_on(refusal: PeerRefusal) -> Self {
        let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut p = Self::new(status, "internal", refusal.to_string());
        if let Some(kind) = refusal.json()["type"].as_str() {
            p.kind = kind.to_string();
        }
        p.passed_on = Some(Box::new(refusal));
        p
    }

    /// The retryable refusal of a node that cannot serve or forward a
    /// dataset's request (cluster mode), naming the owner when known.
    pub fn not_owner(detail: impl Into<String>, owner: Option<OwnerRef>) -> Self {
        let mut p = Self::new(StatusCode::SERVICE_UNAVAILABLE, NOT_OWNER, detail);
        p.owner = owner.map(Box::new);
        p
    }

    /// Attach the name of the field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Attach the budget state that made a release impossible.
    pub fn with_budget(mut self, budget: crate::engine::BudgetRefusal) -> Self {
        self.budget = Some(Box::new(budget));
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    /// 401: no valid credentials.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }

    /// 403: the credentials do not cover this object. The detail names the
    /// missing permission, never anything about the object itself.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 404: no such object.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// 409: the request contradicts the current state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 415: unsupported request body type.
    pub fn unsupported_media_type(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            detail,
        )
    }

    /// 500/503: the server could not do its part; nothing was acknowledged.
    pub fn internal(status: StatusCode, detail: impl Into<String>) -> Self {
        Self::new(status, "internal", detail)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        if let Some(refusal) = self.passed_on {
            return passed_on_response(*refusal);
        }
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (status, [(header::CONTENT_TYPE, PROBLEM_JSON)], body).into_response();
        if self.kind.ends_with(NOT_OWNER) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Another node's answer as it came.
fn passed_on_response(p: PeerRefusal) -> Response {
    let mut response = Response::builder()
        .status(StatusCode::from_u16(p.status).unwrap_or(StatusCode::BAD_GATEWAY));
    if let Some(media) = &p.content_type {
        response = response.header(header::CONTENT_TYPE, media.as_str());
    }
    if let Some(after) = &p.retry_after {
        response = response.header(header::RETRY_AFTER, after.as_str());
    }
    response
        .body(axum::body::Body::from(p.body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, Problem>;

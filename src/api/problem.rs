//! RFC 9457 `application/problem+json` errors: every refusal says what was wrong.
//!
//! The document itself is `dpledger_api::problem::Problem`, defined once with
//! the Rust client, which reads it back. [`Problem`] here is the server's
//! answer built from it: constructors per kind, the axum response (with
//! `Retry-After` for a not-owner refusal), and another node's refusal passed
//! on verbatim. It is boxed, so that every `Result` carrying it stays small.
//!
//! A leaf of `api`: it imports nothing else of the HTTP layer, so every module may
//! use it. How domain errors become problems is in `errors.rs`.

use crate::engine::sharding::PeerRefusal;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use dpledger_api::problem::{BudgetRefusal, Problem as Document, NOT_OWNER};
pub use dpledger_api::problem::{OwnerRef, PROBLEM_JSON};
use std::borrow::Cow;

/// An error answered to the client: its problem document (read through
/// `Deref`), or another node's answer to pass on as it came.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    document: Box<Document>,
    /// Another node's refusal passed on (a shard's owner answered this
    /// node's call on the caller's behalf): answered exactly as that node
    /// answered it (status, media type, `Retry-After`, body), so that the
    /// caller hears what the owner said.
    passed_on: Option<Box<PeerRefusal>>,
}

impl std::ops::Deref for Problem {
    type Target = Document;
    fn deref(&self) -> &Document {
        &self.document
    }
}

impl std::ops::DerefMut for Problem {
    fn deref_mut(&mut self) -> &mut Document {
        &mut self.document
    }
}

/// The OpenAPI schema of [`Problem`] is the document's, under its name.
impl utoipa::PartialSchema for Problem {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <Document as utoipa::PartialSchema>::schema()
    }
}

impl utoipa::ToSchema for Problem {
    fn name() -> Cow<'static, str> {
        <Document as utoipa::ToSchema>::name()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <Document as utoipa::ToSchema>::schemas(schemas)
    }
}

impl Problem {
    /// A problem with the given status, slug (for the type URN) and detail.
    pub fn new(status: StatusCode, slug: &str, detail: impl Into<String>) -> Self {
        Self {
            document: Box::new(Document {
                kind: format!("urn:dpledger:problem:{slug}"),
                title: status.canonical_reason().unwrap_or("Error").to_string(),
                status: status.as_u16(),
                detail: detail.into(),
                field: None,
                budget: None,
                owner: None,
            }),
            passed_on: None,
        }
    }

    /// The document as it is answered.
    pub fn document(&self) -> &Document {
        &self.document
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
        let mut p = Self::new(StatusCode::SERVICE_UNAVAILABLE, "not-owner", detail);
        p.owner = owner.map(Box::new);
        p
    }

    /// Whether this is the retryable not-owner refusal (answered with
    /// `Retry-After`).
    pub fn is_not_owner(&self) -> bool {
        self.kind == NOT_OWNER
    }

    /// Attach the name of the field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Attach the budget state that made a release impossible.
    pub fn with_budget(mut self, budget: BudgetRefusal) -> Self {
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
        let not_owner = self.is_not_owner();
        let body = serde_json::to_vec(&*self.document).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (status, [(header::CONTENT_TYPE, PROBLEM_JSON)], body).into_response();
        if not_owner {
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

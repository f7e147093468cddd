//! Extractors that turn every rejection into an RFC 9457 problem naming what was
//! wrong, instead of axum's plain-text defaults.

use super::auth::Claims;
use super::problem::Problem;
use super::state::AppState;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// The verified claims of the request's bearer token (401 without a valid one).
#[derive(Debug, Clone)]
pub struct Auth(pub Claims);

impl FromRequestParts<Arc<AppState>> for Auth {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Problem> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| Problem::unauthorized("missing Authorization: Bearer <token> header"))?;
        let value = header
            .to_str()
            .map_err(|_| Problem::unauthorized("malformed Authorization header"))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| {
                Problem::unauthorized("the Authorization header must use the Bearer scheme")
            })?;
        state.auth.verify(token.trim()).map(Auth)
    }
}

/// Path parameters; a malformed one (e.g. a non-numeric example id) is a 400.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e: PathRejection| {
                Problem::bad_request(format!("invalid path: {}", e.body_text()))
            })
    }
}

/// Query parameters, kept raw until the handler has authorised the request: a
/// caller without access to the object gets 403 whatever its query says (and
/// learns nothing from validation). [`ApiQuery::parse`] then answers 400 for a
/// malformed one.
#[derive(Debug)]
pub struct ApiQuery<T> {
    raw: Option<String>,
    wanted: std::marker::PhantomData<fn() -> T>,
}

impl<T, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        Ok(ApiQuery {
            raw: parts.uri.query().map(String::from),
            wanted: std::marker::PhantomData,
        })
    }
}

impl<T: DeserializeOwned> ApiQuery<T> {
    /// Decode the query; call only after authorising. A malformed one is a 400.
    pub fn parse(&self) -> Result<T, Problem> {
        let uri: axum::http::Uri = match &self.raw {
            Some(q) => format!("/?{q}").parse(),
            None => "/".parse(),
        }
        .map_err(|_| Problem::bad_request("invalid query: not a valid URI query"))?;
        axum::extract::Query::<T>::try_from_uri(&uri)
            .map(|q| q.0)
            .map_err(|e: QueryRejection| {
                Problem::bad_request(format!("invalid query: {}", e.body_text()))
            })
    }
}

/// Media type of the compact binary step encoding (see `ledger::wire`).
pub const BINARY_STEP: &str = "application/octet-stream";

/// A request body kept raw until the handler has authorised the request, so an
/// unauthorised caller gets 403 whatever it sent (and learns nothing from
/// validation). Only the size limit applies before authorisation.
#[derive(Debug)]
pub struct RawBody {
    content_type: String,
    bytes: axum::body::Bytes,
}

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| Problem::new(e.status(), "body", e.body_text()))?;
        Ok(RawBody {
            content_type,
            bytes,
        })
    }
}

impl RawBody {
    /// Parse as JSON; a wrong media type is 415, a malformed body 400 naming where.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Problem> {
        let media = self.content_type.split(';').next().unwrap_or("").trim();
        if !(media == "application/json" || media.ends_with("+json")) {
            return Err(Problem::unsupported_media_type(
                "expected Content-Type: application/json",
            ));
        }
        let mut de = serde_json::Deserializer::from_slice(&self.bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            Problem::bad_request(format!("invalid JSON body at {}: {}", e.path(), e.inner()))
        })?;
        de.end()
            .map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))?;
        Ok(value)
    }

    /// The body as received (what an idempotency key is bound to).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A step report, as JSON or in the compact binary encoding.
    pub fn step_report(&self) -> Result<crate::ledger::StepReport, Problem> {
        if self.content_type.starts_with(BINARY_STEP) {
            let payload = crate::ledger::wire::StepPayload::decode(&self.bytes)
                .map_err(|e| Problem::bad_request(format!("invalid binary step body: {e}")))?;
            Ok(crate::engine::report_from_payload(payload))
        } else {
            self.json()
        }
    }
}

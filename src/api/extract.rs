//! Extractors that turn every rejection into an RFC 9457 problem naming what was
//! wrong, instead of axum's plain-text defaults.

use super::auth::Claims;
use super::problem::Problem;
use super::state::AppState;
use crate::engine::sharding::Credential;
use axum::extract::rejection::PathRejection;
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

/// The caller's `Authorization` header as presented: what a sharded dataset's
/// requests pass on to the owners of its shards on other nodes, which
/// authorise it again for their shard (never logged; opaque to the engine).
#[derive(Debug, Clone)]
pub struct PassedOn(pub Option<Credential>);

impl<S: Send + Sync> FromRequestParts<S> for PassedOn {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let credential = parts
            .headers
            .get(AUTHORIZATION)
            .map(|value| Credential(value.as_bytes().to_vec()));
        Ok(PassedOn(credential))
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

impl<T> ApiQuery<T> {
    /// The value of parameter `name` (its first occurrence), unvalidated:
    /// what a handler reads to authorise the objects a query names (the runs
    /// of an analysis) before it parses the rest.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.raw.as_deref()?.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    }
}

impl<T: DeserializeOwned> ApiQuery<T> {
    /// Decode the query; call only after authorising. A malformed one is a 400
    /// naming the parameter at fault (`field`).
    pub fn parse(&self) -> Result<T, Problem> {
        let raw = self.raw.as_deref().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = field_of(&e.path().to_string(), &e.inner().to_string());
            let detail = match &field {
                Some(f) => format!("invalid query parameter `{f}`: {}", e.inner()),
                None => format!("invalid query: {}", e.inner()),
            };
            let problem = Problem::bad_request(detail);
            match field {
                Some(f) => problem.with_field(f),
                None => problem,
            }
        })
    }
}

/// The field a deserialisation error is about: its path when known (`.` is the
/// top level, `?` unknown), extended by the name in "missing field `x`" and
/// "unknown field `x`" messages (which serde reports on the enclosing object).
fn field_of(path: &str, message: &str) -> Option<String> {
    let named = ["missing field `", "unknown field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| {
            let rest = &message[message.find(prefix)? + prefix.len()..];
            Some(rest[..rest.find('`')?].to_string())
        });
    let path = match path {
        "." | "?" | "" => None,
        p => Some(p.to_string()),
    };
    match (path, named) {
        // An unknown field's path already ends with its name.
        (Some(p), Some(n)) if p == n || p.ends_with(&format!(".{n}")) => Some(p),
        (Some(p), Some(n)) => Some(format!("{p}.{n}")),
        (p, n) => p.or(n),
    }
}

/// A JSON body's error in words: where (line, column and the field path) and
/// what, instead of serde's `at ?: EOF`.
fn describe_json_error(
    e: &serde_path_to_error::Error<serde_json::Error>,
) -> (String, Option<String>) {
    use serde_json::error::Category;
    let inner = e.inner();
    let text = inner.to_string();
    // serde_json appends " at line L column C"; it is said in words below.
    let message = match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    };
    let at = format!("line {}, column {}", inner.line(), inner.column());
    let field = field_of(&e.path().to_string(), &message);
    let within = field
        .as_deref()
        .map(|f| format!(" in `{f}`"))
        .unwrap_or_default();
    let detail = match inner.classify() {
        Category::Eof => format!("invalid JSON body: it ends early{within} ({at}): {message}"),
        Category::Syntax => format!("invalid JSON body: syntax error{within} at {at}: {message}"),
        Category::Data | Category::Io => match &field {
            Some(f) => format!("invalid JSON body: field `{f}`: {message} ({at})"),
            None => format!("invalid JSON body: {message} ({at})"),
        },
    };
    (detail, field)
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
            .map_err(|e| {
                if super::listener::is_body_timeout(&e) {
                    Problem::new(
                        axum::http::StatusCode::REQUEST_TIMEOUT,
                        "request-timeout",
                        "the request body did not arrive within the body timeout",
                    )
                } else {
                    Problem::new(e.status(), "body", e.body_text())
                }
            })?;
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
            let (detail, field) = describe_json_error(&e);
            let problem = Problem::bad_request(detail);
            match field {
                Some(f) => problem.with_field(f),
                None => problem,
            }
        })?;
        de.end().map_err(|e| {
            Problem::bad_request(format!(
                "invalid JSON body: trailing characters after the JSON value at line {}, \
                 column {}",
                e.line(),
                e.column()
            ))
        })?;
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
            Ok(payload.into())
        } else {
            self.json()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        rate: f64,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        examples: u64,
        sampling: Inner,
    }

    fn json_error(text: &str) -> Problem {
        RawBody {
            content_type: "application/json".into(),
            bytes: axum::body::Bytes::from(text.to_string()),
        }
        .json::<Outer>()
        .unwrap_err()
    }

    #[test]
    fn json_errors_name_the_field_and_the_place() {
        let missing = json_error(r#"{"sampling": {"rate": 0.1}}"#);
        assert_eq!(missing.field.as_deref(), Some("examples"), "{missing:?}");
        assert!(missing.detail.contains("missing field `examples`"));
        assert!(!missing.detail.contains("at ."), "{}", missing.detail);
        let nested = json_error(r#"{"examples": 3, "sampling": {"rate": "x"}}"#);
        assert_eq!(nested.field.as_deref(), Some("sampling.rate"));
        let eof = json_error(r#"{"examples": 3, "sampling": {"#);
        assert!(eof.detail.contains("ends early"), "{}", eof.detail);
        assert!(eof.detail.contains("line 1, column"), "{}", eof.detail);
        assert!(!eof.detail.contains("at ?"), "{}", eof.detail);
        let syntax = json_error("{\n  \"examples\": 3,\n  oops\n}");
        assert!(
            syntax.detail.contains("line 3, column"),
            "{}",
            syntax.detail
        );
        let unknown = json_error(r#"{"examples": 3, "sampling": {"rate": 1}, "x": 1}"#);
        assert_eq!(unknown.field.as_deref(), Some("x"));
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Query {
        delta: Option<f64>,
    }

    #[test]
    fn query_errors_name_the_parameter() {
        let query = ApiQuery::<Query> {
            raw: Some("delta=abc".into()),
            wanted: std::marker::PhantomData,
        };
        let problem = query.parse().unwrap_err();
        assert_eq!(problem.field.as_deref(), Some("delta"));
        assert!(problem.detail.contains("delta"), "{}", problem.detail);
        let fine = ApiQuery::<Query> {
            raw: Some("delta=0.5".into()),
            wanted: std::marker::PhantomData,
        };
        assert_eq!(fine.parse().unwrap().delta, Some(0.5));
    }
}

//! Request ids and the access log.
//!
//! Every response carries `X-Request-Id`: the client's own (when it is 1 to
//! [`MAX_REQUEST_ID_LEN`] characters of `A-Z a-z 0-9 - _ . : /`, so that it can
//! neither forge log lines nor grow them without bound) or a fresh random one.
//! One access-log line per request, at INFO under the target
//! `dpledger::access`: method, the route's *template* (`/v1/datasets/{dataset}`,
//! never the raw path, whose ids may be personal), status, latency and the
//! request id. Never a header (tokens), a query string or a body (per-example
//! epsilons).

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The request-id header, in and out.
pub const REQUEST_ID: &str = "x-request-id";

/// Longest client request id kept; a longer one is replaced.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// The route template a request matched, handed from inside the router to the
/// access log outside it.
#[derive(Debug, Clone)]
struct Route(MatchedPath);

/// The request id of the request being served (in the request's extensions).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The client's request id when it is safe to log and echo, else `None`.
pub fn sanitize_request_id(value: &[u8]) -> Option<String> {
    let ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/');
    (!value.is_empty() && value.len() <= MAX_REQUEST_ID_LEN && value.iter().all(ok))
        .then(|| String::from_utf8_lossy(value).into_owned())
}

/// A fresh random request id (128 bits, hex).
pub fn new_request_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = rand::random();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Inside the router (a route layer): remember the matched route's template.
pub async fn record_route(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(Route(route));
    }
    response
}

/// Outside the router: the request id in and out, and the access-log line.
pub async fn request_id_and_log(mut request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| sanitize_request_id(v.as_bytes()))
        .unwrap_or_else(new_request_id);
    let header = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("invalid"));
    request.headers_mut().insert(REQUEST_ID, header.clone());
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let mut response = next.run(request).await;
    response.headers_mut().insert(REQUEST_ID, header);
    let route = response
        .extensions()
        .get::<Route>()
        .map(|r| r.0.as_str().to_string());
    let status = response.status().as_u16();
    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::info!(
        target: "dpledger::access",
        method = %method,
        route = %route.as_deref().unwrap_or("(unmatched)"),
        status,
        latency_ms = format_args!("{latency_ms:.3}"),
        request_id = %id,
        "request"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_bounded_and_plain() {
        assert_eq!(sanitize_request_id(b"abc-123").as_deref(), Some("abc-123"));
        assert!(sanitize_request_id(b"").is_none());
        assert!(sanitize_request_id(b"a b").is_none());
        assert!(sanitize_request_id(b"x\r\ninjected: 1").is_none());
        assert!(sanitize_request_id(&[b'a'; MAX_REQUEST_ID_LEN + 1]).is_none());
        assert_eq!(new_request_id().len(), 32);
    }
}

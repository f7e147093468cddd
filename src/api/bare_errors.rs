//! Every error answer is a problem document, including the ones no handler wrote.
//!
//! Handlers and extractors answer [`Problem`]s, but the router itself answers some
//! requests before any of them runs: a known path with a method it does not serve
//! (405, with an `Allow` header) and body-size rejections from layers. Those come
//! with an empty or plain-text body. This layer rewrites any 4xx/5xx response that
//! is not already `application/problem+json` into one, keeping its status and
//! headers (`Allow` stays: it is what tells the client which methods exist).

use super::problem::{Problem, PROBLEM_JSON};
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Middleware (`axum::middleware::from_fn`): wrap bare error answers.
pub async fn problem_for_bare_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_problem(&response) {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let problem = describe(status, &method, &path, &parts.headers);
    let fresh = problem.into_response();
    let (fresh_parts, body) = fresh.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        fresh_parts.headers[header::CONTENT_TYPE].clone(),
    );
    Response::from_parts(parts, body)
}

fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(PROBLEM_JSON))
}

/// A problem for a status the router produced on its own.
fn describe(
    status: StatusCode,
    method: &Method,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Problem {
    match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            Problem::new(
                status,
                "method-not-allowed",
                format!("{method} is not allowed on {path}; allowed: {allowed}"),
            )
        }
        StatusCode::NOT_FOUND => Problem::not_found(format!("no such endpoint: {method} {path}")),
        StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
            status,
            "payload-too-large",
            "the request body is larger than this server accepts (--max-body-bytes)",
        ),
        other => Problem::new(
            other,
            "http",
            format!(
                "{method} {path}: {}",
                other.canonical_reason().unwrap_or("error")
            ),
        ),
    }
}

//! Requests a node sends to another node (or to itself) on a caller's behalf
//! (cluster mode): forwarding to a dataset's owner, placing a creation, and a
//! sharded dataset's requests to its shards' owners. One HTTP client with
//! bounded timeouts; every such request is marked as forwarded, so that the
//! receiving node answers it itself or refuses it, never forwards it again.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::OnceLock;
use std::time::Duration;

/// Marks a forwarded request: the receiving node answers it itself or
/// refuses it, never forwards it again (no loops while leases move).
pub const FORWARDED: &str = "x-dpledger-forwarded-by";
/// Bound on a forwarded request, body and answer included.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The one client of node-to-node requests.
pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default()
    })
}

/// A node's answer, read whole.
#[derive(Debug, Clone)]
pub struct NodeAnswer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

impl NodeAnswer {
    /// Whether the node answered 2xx.
    pub fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The answer passed on as this node's (status, media type, `Retry-After`,
    /// body).
    pub fn into_response(self) -> Response {
        let mut response = Response::builder().status(self.status);
        for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
            if let Some(value) = self.headers.get(&name) {
                response = response.header(name, value);
            }
        }
        response
            .body(Body::from(self.body))
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
    }
}

/// Sends one request to the node at `base` (its advertised URL), as node `me`,
/// with the caller's `Authorization` (the receiving node authorises it) and an
/// optional body of the given media type; reads the whole answer.
pub async fn call(
    base: &str,
    me: &str,
    method: Method,
    path_and_query: &str,
    authorization: Option<&HeaderValue>,
    body: Option<(&'static str, Vec<u8>)>,
) -> Result<NodeAnswer, reqwest::Error> {
    call_keyed(base, me, method, path_and_query, authorization, None, body).await
}

/// [`call`] with the caller's `Idempotency-Key` passed on (a sharded refresh:
/// each shard recognises a retry of its part by the same key).
pub async fn call_keyed(
    base: &str,
    me: &str,
    method: Method,
    path_and_query: &str,
    authorization: Option<&HeaderValue>,
    idempotency_key: Option<&HeaderValue>,
    body: Option<(&'static str, Vec<u8>)>,
) -> Result<NodeAnswer, reqwest::Error> {
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    let mut request = client().request(method, url).header(FORWARDED, me);
    if let Some(auth) = authorization {
        request = request.header(header::AUTHORIZATION, auth);
    }
    if let Some(key) = idempotency_key {
        request = request.header(super::idempotency::HEADER, key);
    }
    let mut sent = 0;
    if let Some((media, bytes)) = body {
        sent = bytes.len() as u64;
        request = request.header(header::CONTENT_TYPE, media).body(bytes);
    }
    let answer = request.send().await?;
    metrics::counter!("dpledger_cluster_forwarded_total").increment(1);
    let (status, headers) = (answer.status(), answer.headers().clone());
    let body = answer.bytes().await?;
    // Bodies moved between nodes (headers not counted): what a sharded
    // dataset's steps, queries and releases cost the network (issue 26;
    // the streamed forwarding of `cluster_routes` is not counted).
    metrics::counter!("dpledger_cluster_node_request_bytes_total").increment(sent);
    metrics::counter!("dpledger_cluster_node_answer_bytes_total").increment(body.len() as u64);
    Ok(NodeAnswer {
        status,
        headers,
        body,
    })
}

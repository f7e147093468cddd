//! Requests a node sends to another node (or to itself) on a caller's behalf
//! (cluster mode): forwarding to a dataset's owner, placing a creation, and a
//! sharded dataset's requests to its shards' owners. One HTTP client with
//! bounded timeouts; every such request is marked as forwarded, so that the
//! receiving node answers it itself or refuses it, never forwards it again.
//!
//! A call the receiving node must know comes from a node of the cluster (the
//! cross-shard change protocol's prepare and decide) also carries a node
//! mark ([`NODE_MARK`], made by [`sign_node_call`]; `docs/cluster.md`,
//! "Node-to-node authentication"); [`call_marked`] sends one.

use crate::engine::cluster::ClusterNode;
use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use std::sync::OnceLock;
use std::time::Duration;

/// Marks a forwarded request: the receiving node answers it itself or
/// refuses it, never forwards it again (no loops while leases move).
pub const FORWARDED: &str = "x-dpledger-forwarded-by";
/// The header of a node mark: an HMAC with the cluster's secret over the
/// call's method, path, body and time, which only the cluster's nodes can make
/// (`engine::cluster::NodeMarks`).
pub const NODE_MARK: &str = "x-dpledger-node-mark";
/// Path segment of the cross-shard change protocol's calls.
pub const SHARD_CHANGES: &str = "shard-changes";

/// Whether `path` (its query ignored) is a call of the cross-shard change
/// protocol to a shard, `/v1/datasets/{shard}/shard-changes/{id}/{action}`:
/// the calls that carry a node mark.
pub fn is_marked_path(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.split('/').collect();
    // ["", "v1", "datasets", shard, SHARD_CHANGES, id, action]
    segments.len() == 7
        && segments[1] == "v1"
        && segments[2] == "datasets"
        && segments[4] == SHARD_CHANGES
}

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
    let headers = [
        authorization.map(|a| (header::AUTHORIZATION, a.clone())),
        idempotency_key.map(|k| {
            (
                HeaderName::from_static(crate::api::idempotency::HEADER),
                k.clone(),
            )
        }),
    ];
    send(
        base,
        me,
        method,
        path_and_query,
        headers.into_iter().flatten(),
        body,
    )
    .await
}

/// The node mark of a call this node makes: the value of [`NODE_MARK`] for
/// `method` on `path_and_query` (as sent, query included) with `body` (empty
/// when none), signed now with the cluster's key as node `node`. A node
/// receiving a call of the cross-shard change protocol
/// (`POST /v1/datasets/{shard}/shard-changes/{id}/{prepare|decide}`) refuses
/// it without a valid mark made within the last minute, and accepts each mark
/// once; it authorises the call's `Authorization` too when one is sent (a
/// coordinator passes its caller's on), and trusts the mark alone when none is
/// (a node acting on its own, e.g. an automatic release). Never logs the key.
pub fn sign_node_call(
    node: &ClusterNode,
    method: &Method,
    path_and_query: &str,
    body: &[u8],
) -> HeaderValue {
    let mark = node
        .marks()
        .mark(&node.config.node_id, method.as_str(), path_and_query, body);
    // Digits, hex and the node id (`--node-id`: A-Z a-z 0-9 . _ -).
    HeaderValue::from_str(&mark).unwrap_or_else(|_| HeaderValue::from_static("v1:invalid"))
}

/// Sends a node-marked call ([`sign_node_call`]) as node `node` to the node at
/// `base`, with the caller's `Authorization` when there is one (`None`: the
/// node's own call); reads the whole answer, as [`call`].
pub async fn call_marked(
    base: &str,
    node: &ClusterNode,
    method: Method,
    path_and_query: &str,
    authorization: Option<&HeaderValue>,
    body: Option<(&'static str, Vec<u8>)>,
) -> Result<NodeAnswer, reqwest::Error> {
    let bytes = body.as_ref().map_or(&[][..], |(_, b)| &b[..]);
    let mark = sign_node_call(node, &method, path_and_query, bytes);
    let headers = [
        authorization.map(|a| (header::AUTHORIZATION, a.clone())),
        Some((HeaderName::from_static(NODE_MARK), mark)),
    ];
    let me = node.config.node_id.clone();
    send(
        base,
        &me,
        method,
        path_and_query,
        headers.into_iter().flatten(),
        body,
    )
    .await
}

/// Sends one request, marked as forwarded by `me`, with `headers`.
async fn send(
    base: &str,
    me: &str,
    method: Method,
    path_and_query: &str,
    headers: impl Iterator<Item = (HeaderName, HeaderValue)>,
    body: Option<(&'static str, Vec<u8>)>,
) -> Result<NodeAnswer, reqwest::Error> {
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    let mut request = client().request(method, url).header(FORWARDED, me);
    for (name, value) in headers {
        request = request.header(name, value);
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
    // dataset's steps, queries and releases cost the network (the
    // streamed forwarding of `cluster_routes` is not counted).
    metrics::counter!("dpledger_cluster_node_request_bytes_total").increment(sent);
    metrics::counter!("dpledger_cluster_node_answer_bytes_total").increment(body.len() as u64);
    Ok(NodeAnswer {
        status,
        headers,
        body,
    })
}

//! The engine's [`Peers`] over HTTP: the change protocol's calls to the owner
//! of a shard on another node (`POST
//! /v1/datasets/{shard}/shard-changes/{id}/{prepare|decide}`), node-marked
//! with the cluster's key and carrying the caller's credential when the
//! change has a caller (`docs/cluster.md`, "Node-to-node authentication").
//! The engine calls the shards this node owns itself; it sends only the rest
//! here. An owner's refusal comes back to the engine as it was answered
//! ([`EngineError::Peer`]), so that the caller hears what the owner said.

use super::node_client::{call_marked, NodeAnswer, SHARD_CHANGES};
use crate::api::problem::{OwnerRef, Problem, NOT_OWNER, PROBLEM_JSON};
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::owners::{Decision, Prepared, ShardChange};
use crate::engine::sharding::{PeerCall, PeerFuture, PeerRefusal, Peers};
use crate::engine::{EngineError, EngineResult};
use axum::http::{header, HeaderValue, Method, StatusCode};
use serde::Deserialize;
use std::sync::{Arc, Weak};

/// The node-to-node client as the engine's [`Peers`] (cluster mode; given to
/// the engine at start-up, `cli::server`).
#[derive(Debug, Clone)]
pub struct HttpPeers {
    /// Weak: the engine holds the peers, and the node through the engine.
    node: Weak<ClusterNode>,
}

impl HttpPeers {
    /// The peers of `node`, whose identity and key mark the calls.
    pub fn new(node: &Arc<ClusterNode>) -> HttpPeers {
        HttpPeers {
            node: Arc::downgrade(node),
        }
    }
}

/// A refusal made here (the owner unreachable, no answer in time, a
/// malformed answer), kept as its problem answer so that it reaches the
/// caller as it did when it was answered directly.
fn refusal(problem: Problem) -> EngineError {
    // As `Problem::into_response` answers it.
    EngineError::Peer(PeerRefusal {
        status: problem.status,
        content_type: Some(PROBLEM_JSON.to_string()),
        retry_after: problem.kind.ends_with(NOT_OWNER).then(|| "1".to_string()),
        body: serde_json::to_vec(&problem).unwrap_or_else(|_| b"{}".to_vec()),
    })
}

/// An owner's non-2xx answer, kept whole.
fn answered(answer: NodeAnswer) -> EngineError {
    let text = |name| {
        answer
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    EngineError::Peer(PeerRefusal {
        status: answer.status.as_u16(),
        content_type: text(header::CONTENT_TYPE),
        retry_after: text(header::RETRY_AFTER),
        body: answer.body.to_vec(),
    })
}

/// Sends call `action` of the protocol (with `query` and `body`) for `call`.
async fn send(
    node: Weak<ClusterNode>,
    call: &PeerCall,
    action: &str,
    query: String,
    body: Option<Vec<u8>>,
) -> EngineResult<NodeAnswer> {
    let node = node
        .upgrade()
        .ok_or_else(|| EngineError::Unavailable("this node is stopping".into()))?;
    let shard = &call.shard;
    let path = format!(
        "/v1/datasets/{shard}/{SHARD_CHANGES}/{}/{action}{query}",
        call.change_id
    );
    let authorization = match &call.credential {
        Some(c) => Some(
            HeaderValue::from_bytes(&c.0).map_err(|_| EngineError::BadRequest {
                detail: "the Authorization header cannot be passed on".into(),
                field: None,
            })?,
        ),
        None => None,
    };
    let body = body.map(|b| ("application/json", b));
    let owner = &call.owner;
    let sent = call_marked(
        &owner.advertise,
        &node,
        Method::POST,
        &path,
        authorization.as_ref(),
        body,
    )
    .await;
    let answer = sent.map_err(|e| {
        refusal(if e.is_connect() {
            Problem::not_owner(
                format!("shard {shard:?}'s owner could not be reached: retry"),
                Some(OwnerRef {
                    node_id: owner.node_id.clone(),
                    advertise: owner.advertise.clone(),
                }),
            )
        } else {
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome-unknown",
                format!(
                    "shard {shard:?}'s owner {} did not answer in time: its part may or may not \
                     have been applied; retry (steps are exactly-once by number)",
                    owner.node_id
                ),
            )
        })
    })?;
    if answer.ok() {
        Ok(answer)
    } else {
        Err(answered(answer))
    }
}

/// An owner's answer to a decide.
#[derive(Deserialize)]
struct Decided {
    decision: String,
}

impl Peers for HttpPeers {
    fn prepare(
        &self,
        call: PeerCall,
        change: ShardChange,
        at: Option<u64>,
    ) -> PeerFuture<Prepared> {
        let node = self.node.clone();
        Box::pin(async move {
            let body = serde_json::to_vec(&change).unwrap_or_default();
            let query = at.map(|s| format!("?at={s}")).unwrap_or_default();
            let answer = send(node, &call, "prepare", query, Some(body)).await?;
            serde_json::from_slice::<Prepared>(&answer.body).map_err(|e| {
                refusal(Problem::internal(
                    StatusCode::BAD_GATEWAY,
                    format!("a shard's prepare answer was malformed: {e}"),
                ))
            })
        })
    }

    fn decide(&self, call: PeerCall) -> PeerFuture<Decision> {
        let node = self.node.clone();
        Box::pin(async move {
            let answer = send(node, &call, "decide", String::new(), None).await?;
            match serde_json::from_slice::<Decided>(&answer.body) {
                Ok(d) if d.decision == "committed" => Ok(Decision::Committed),
                Ok(d) if d.decision == "aborted" => Ok(Decision::Aborted),
                _ => Err(refusal(Problem::internal(
                    StatusCode::BAD_GATEWAY,
                    "a shard's decide answer was malformed",
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::errors::engine_response;
    use axum::response::{IntoResponse, Response};

    async fn parts(r: Response) -> (StatusCode, Option<String>, Option<String>, Vec<u8>) {
        let text = |name| {
            r.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_string)
        };
        let (status, media, after) = (
            r.status(),
            text(header::CONTENT_TYPE),
            text(header::RETRY_AFTER),
        );
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, media, after, body.to_vec())
    }

    /// A refusal made here reaches the caller exactly as the problem itself
    /// would have been answered (status, media type, `Retry-After`, body).
    #[tokio::test]
    async fn a_refusal_made_here_is_answered_as_its_problem() {
        let owner = OwnerRef {
            node_id: "n2".into(),
            advertise: "http://127.0.0.1:1".into(),
        };
        for problem in [
            Problem::not_owner(
                "shard \"d~0\"'s owner could not be reached: retry",
                Some(owner),
            ),
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome-unknown",
                "no answer",
            ),
            Problem::internal(StatusCode::BAD_GATEWAY, "malformed"),
        ] {
            let direct = parts(problem.clone().into_response()).await;
            let passed = parts(engine_response(refusal(problem))).await;
            assert_eq!(direct, passed);
        }
    }

    /// An owner's answer is passed on whole, whatever its body.
    #[tokio::test]
    async fn an_owners_answer_is_passed_on_whole() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let answer = NodeAnswer {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            headers,
            body: axum::body::Bytes::from_static(b"too large"),
        };
        let direct = parts(answer.clone().into_response()).await;
        let passed = parts(engine_response(answered(answer))).await;
        assert_eq!(direct, passed);
    }
}

//! The engine's [`Peers`] over HTTP: the calls to the owner of a shard on
//! another node. The change protocol's (`POST
//! /v1/datasets/{shard}/shard-changes/{id}/{prepare|decide}`) are node-marked
//! with the cluster's key and carry the caller's credential when the change
//! has a caller (`docs/cluster.md`, "Node-to-node authentication"); a
//! sharded dataset's steps, refreshes and reads are the shard's own endpoints
//! with the caller's credential (the owner authorises it for its shard), a
//! step's part in the binary encoding; a shard's creation is the ordinary
//! `POST /v1/datasets` with the caller's (administrator's) credential.
//! The engine calls the shards this node owns itself; it sends only the rest
//! here. An owner's refusal comes back to the engine as it was answered
//! ([`EngineError::Peer`]), so that the caller hears what the owner said.

use super::node_client::{call_keyed, call_marked, NodeAnswer, SHARD_CHANGES};
use crate::api::extract::BINARY_STEP;
use crate::api::problem::{OwnerRef, Problem, PROBLEM_JSON};
use crate::engine::cluster::ClusterNode;
use crate::engine::sharding::protocol::{Decision, Prepared, ShardChange};
use crate::engine::sharding::{
    Credential, PeerCall, PeerFuture, PeerRefusal, Peers, RefreshPart, ShardCall, ShardCreated,
    ShardCreation,
};
use crate::engine::{EngineError, EngineResult, ExampleQuery, IdRange, PrivacyQuery};
use crate::ledger::{RefreshOutcome, StepOutcome, StepReport, WorstCaseBounds};
use axum::http::{header, HeaderValue, Method, StatusCode};
use dpledger_api::codec::encode_step;
use dpledger_api::views::{DatasetView, PrivacyView, Thresholds};
use serde::de::DeserializeOwned;
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
        retry_after: problem.is_not_owner().then(|| "1".to_string()),
        body: serde_json::to_vec(problem.document()).unwrap_or_else(|_| b"{}".to_vec()),
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

/// The caller's credential as the `Authorization` header to pass on.
fn authorization(credential: Option<&Credential>) -> EngineResult<Option<HeaderValue>> {
    credential
        .map(|c| {
            HeaderValue::from_bytes(&c.0).map_err(|_| EngineError::BadRequest {
                detail: "the Authorization header cannot be passed on".into(),
                field: None,
            })
        })
        .transpose()
}

/// The node, unless it is stopping.
fn upgrade(node: &Weak<ClusterNode>) -> EngineResult<Arc<ClusterNode>> {
    node.upgrade()
        .ok_or_else(|| EngineError::Unavailable("this node is stopping".into()))
}

/// What was sent to `owner` for `shard` became: its 2xx answer, its other
/// answers kept whole, or the refusal to give when it could not be sent or
/// was not answered in time.
fn outcome(
    sent: Result<NodeAnswer, reqwest::Error>,
    shard: &str,
    owner: &OwnerRef,
) -> EngineResult<NodeAnswer> {
    let answer = sent.map_err(|e| {
        refusal(if e.is_connect() {
            Problem::not_owner(
                format!("shard {shard:?}'s owner could not be reached: retry"),
                Some(owner.clone()),
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

/// A shard's JSON answer, or the refusal to give when it is malformed.
fn parse<T: DeserializeOwned>(answer: &NodeAnswer) -> EngineResult<T> {
    serde_json::from_slice(&answer.body).map_err(|e| {
        refusal(Problem::internal(
            StatusCode::BAD_GATEWAY,
            format!("a shard's answer was malformed: {e}"),
        ))
    })
}

/// Sends call `action` of the protocol (with `query` and `body`) for `call`,
/// node-marked.
async fn send(
    node: Weak<ClusterNode>,
    call: &PeerCall,
    action: &str,
    query: String,
    body: Option<Vec<u8>>,
) -> EngineResult<NodeAnswer> {
    let node = upgrade(&node)?;
    let shard = &call.shard;
    let path = format!(
        "/v1/datasets/{shard}/{SHARD_CHANGES}/{}/{action}{query}",
        call.change_id
    );
    let authorization = authorization(call.credential.as_ref())?;
    let body = body.map(|b| ("application/json", b));
    let sent = call_marked(
        &call.owner.advertise,
        &node,
        Method::POST,
        &path,
        authorization.as_ref(),
        body,
    )
    .await;
    outcome(sent, shard, &call.owner)
}

/// One request of a sharded dataset's caller to a shard's owner: `method` on
/// the shard's path `suffix` (after `/v1/datasets/{shard}`), with the caller's
/// credential and idempotency key when it has them; its JSON answer.
async fn ask<T: DeserializeOwned>(
    node: Weak<ClusterNode>,
    call: ShardCall,
    method: Method,
    suffix: String,
    body: Option<(&'static str, Vec<u8>)>,
    key: Option<String>,
) -> EngineResult<T> {
    let node = upgrade(&node)?;
    let shard = &call.shard;
    let path = format!("/v1/datasets/{shard}{suffix}");
    let authorization = authorization(call.credential.as_ref())?;
    let key = key.and_then(|k| HeaderValue::from_str(&k).ok());
    let sent = call_keyed(
        &call.owner.advertise,
        &node.config.node_id,
        method,
        &path,
        authorization.as_ref(),
        key.as_ref(),
        body,
    )
    .await;
    parse(&outcome(sent, shard, &call.owner)?)
}

/// A privacy query's parameters, as the shard's handler reads them.
fn privacy_params(query: PrivacyQuery) -> String {
    let mut params = vec![format!("conversion={}", query.conversion.as_str())];
    if let Some(delta) = query.delta {
        params.push(format!("delta={delta}"));
    }
    params.join("&")
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
            parse::<Prepared>(&answer)
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

    fn step(&self, call: ShardCall, part: StepReport) -> PeerFuture<StepOutcome> {
        let body = Some((BINARY_STEP, encode_step(&part)));
        let path = "/steps".to_string();
        Box::pin(ask(self.node.clone(), call, Method::POST, path, body, None))
    }

    fn refresh(&self, call: ShardCall, part: RefreshPart) -> PeerFuture<RefreshOutcome> {
        let body = Some(("application/json", part.body()));
        let path = "/refresh".to_string();
        let node = self.node.clone();
        Box::pin(ask(node, call, Method::POST, path, body, part.key))
    }

    fn view(&self, call: ShardCall) -> PeerFuture<DatasetView> {
        let node = self.node.clone();
        Box::pin(ask(node, call, Method::GET, String::new(), None, None))
    }

    fn thresholds(&self, call: ShardCall, range: IdRange) -> PeerFuture<Thresholds> {
        let mut params = Vec::new();
        if let Some(start) = range.start {
            params.push(format!("start={start}"));
        }
        if let Some(end) = range.end {
            params.push(format!("end={end}"));
        }
        let path = format!("/thresholds?{}", params.join("&"));
        Box::pin(ask(self.node.clone(), call, Method::GET, path, None, None))
    }

    fn example_privacy(
        &self,
        call: ShardCall,
        example: u64,
        query: ExampleQuery,
    ) -> PeerFuture<PrivacyView> {
        let mut params = privacy_params(query.bounds);
        if query.estimate {
            params.push_str("&method=pld_estimate");
        }
        let path = format!("/examples/{example}/privacy?{params}");
        Box::pin(ask(self.node.clone(), call, Method::GET, path, None, None))
    }

    fn worst_case(&self, call: ShardCall, query: PrivacyQuery) -> PeerFuture<WorstCaseBounds> {
        let path = format!("/worst-case?{}", privacy_params(query));
        Box::pin(ask(self.node.clone(), call, Method::GET, path, None, None))
    }

    fn archive(&self, call: ShardCall) -> PeerFuture<()> {
        let node = self.node.clone();
        let path = "/archive".to_string();
        Box::pin(async move {
            ask::<serde_json::Value>(node, call, Method::POST, path, None, None).await?;
            Ok(())
        })
    }

    fn create_shard(&self, call: ShardCall, creation: ShardCreation) -> PeerFuture<ShardCreated> {
        let node = self.node.clone();
        Box::pin(async move {
            let node = upgrade(&node)?;
            let mut body = serde_json::json!({
                "id": call.shard,
                "config": creation.config,
                "labels": creation.labels,
            });
            if let Some(policy) = &creation.release_policy {
                body["release_policy"] = serde_json::json!(policy);
            }
            let authorization = authorization(call.credential.as_ref())?;
            let sent = super::node_client::call(
                &call.owner.advertise,
                &node.config.node_id,
                Method::POST,
                "/v1/datasets",
                authorization.as_ref(),
                Some(("application/json", body.to_string().into_bytes())),
            )
            .await;
            match sent {
                Ok(answer) if answer.ok() => Ok(ShardCreated::Created),
                // It exists already (a retried creation).
                Ok(answer) if answer.status == StatusCode::CONFLICT => Ok(ShardCreated::Existed),
                Ok(answer) => Err(answered(answer)),
                Err(e) if e.is_connect() => Ok(ShardCreated::Unreached),
                Err(_) => Err(refusal(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    format!(
                        "shard {:?} may or may not have been created: retry the same creation, \
                         which completes what is missing",
                        call.shard
                    ),
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let passed = parts(Problem::from(refusal(problem)).into_response()).await;
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
        let passed = parts(Problem::from(answered(answer)).into_response()).await;
        let whole = (
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("text/plain".to_string()),
            None,
            b"too large".to_vec(),
        );
        assert_eq!(passed, whole);
    }
}

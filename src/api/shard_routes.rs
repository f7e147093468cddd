//! A sharded dataset over HTTP (`docs/sharding.md`
//! "Shards"). Any node answers a sharded dataset's requests: it authorises
//! the caller for the dataset, splits the request by id range into its
//! shards' requests (`engine::sharding::split`), sends them in parallel
//! to the shards' owners (itself included, over loopback) with the caller's
//! `Authorization` (each owner authorises again, for the shard as its
//! dataset), and merges the answers. Releases, release budgets, release
//! policies, labels and archiving are changes across shards, coordinated by
//! the engine (`engine::sharding`; `cluster_routes.rs` sends them to their
//! handlers, `shard_release.rs` and its siblings). What a dataset's shard is sent
//! directly that only the dataset may change is refused with
//! `409 urn:dpledger:problem:sharded-unsupported`, never answered wrongly.
//! A creation with `"shards"` is coordinated by `shard_create.rs`.
//!
//! Why one file of about 700 lines: it is the sharded datasets' own router
//! (every dataset endpoint a sharded dataset answers, and the fan-out of their
//! parts to the shards' owners over HTTP), kept whole until those endpoints
//! are served by the axum handlers through the engine (`docs/cluster.md`,
//! "Known limits").

use super::auth::{Access, Claims};
use super::cluster::node_client::{call_keyed, NodeAnswer};
use super::dataset_routes::{DatasetView, RefreshRequest, ThresholdRange, Thresholds};
use super::extract::{ApiQuery, Auth, RawBody};
use super::idempotency::IdempotencyHeader;
use super::problem::{OwnerRef, Problem};
use super::shard_view::ShardView;
use super::state::AppState;
use crate::engine::cluster::ClusterNode;
use crate::engine::payload_from_report;
use crate::engine::sharding::{merge_status, split_range, split_step, ShardLayout, SplitStep};
use crate::ledger::{LedgerStatus, RefreshOutcome, StepOutcome, WorstCaseBounds};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// What every request to a sharded dataset's shards needs.
#[derive(Clone)]
pub(super) struct Shards {
    pub(super) state: Arc<AppState>,
    pub(super) node: Arc<ClusterNode>,
    pub(super) layout: Arc<ShardLayout>,
    pub(super) authorization: Option<HeaderValue>,
    /// The caller's `Idempotency-Key`, passed on to the shards (refreshes only).
    pub(super) idempotency_key: Option<HeaderValue>,
}

/// One request to one shard: which, method, path after the shard's
/// `/v1/datasets/{shard}`, body.
pub(super) type ShardRequest = (usize, Method, String, Option<(&'static str, Vec<u8>)>);

impl Shards {
    /// Sends `request` to its shard's owner; a refusal to send (no live owner,
    /// the owner unreachable, no answer in time) is the answer to give.
    async fn send(&self, request: ShardRequest) -> Result<NodeAnswer, Response> {
        let (s, method, suffix, body) = request;
        let shard = self.layout.shard_dataset(s);
        let me = &self.node.config;
        let owner = if self.state.engine.serves(&shard) {
            Some(OwnerRef {
                node_id: me.node_id.clone(),
                advertise: me.advertise.clone(),
            })
        } else {
            match self.node.lease_of(&shard).await {
                Some(l) if l.expires_in_ms > 0 => l.owner.zip(l.advertise).map(|(o, a)| OwnerRef {
                    node_id: o,
                    advertise: a,
                }),
                _ => None,
            }
        };
        let Some(owner) = owner else {
            return Err(Problem::not_owner(
                format!("shard {shard:?} has no live owner now (its lease is moving or it is being created): retry"),
                None,
            )
            .into_response());
        };
        let path = format!("/v1/datasets/{shard}{suffix}");
        let sent = call_keyed(
            &owner.advertise,
            &me.node_id,
            method,
            &path,
            self.authorization.as_ref(),
            self.idempotency_key.as_ref(),
            body,
        )
        .await;
        sent.map_err(|e| {
            if e.is_connect() {
                Problem::not_owner(
                    format!("shard {shard:?}'s owner could not be reached: retry"),
                    Some(owner),
                )
                .into_response()
            } else {
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome-unknown",
                    format!(
                        "shard {shard:?}'s owner {} did not answer in time: its part may or \
                             may not have been applied; retry (steps are exactly-once by number)",
                        owner.node_id
                    ),
                )
                .into_response()
            }
        })
    }

    /// Sends every request in parallel; answers in the same order, or the
    /// first failure: a refusal to send or a 5xx first (retryable: the parts
    /// that were applied answer as duplicates), then any other non-2xx.
    pub(super) async fn send_all(
        &self,
        requests: Vec<ShardRequest>,
    ) -> Result<Vec<NodeAnswer>, Response> {
        let mut answers = self.gather(requests).await;
        match first_failure(&answers) {
            Some(i) => Err(match answers.swap_remove(i) {
                Ok(answer) => answer.into_response(),
                Err(refusal) => refusal,
            }),
            None => Ok(answers.into_iter().flatten().collect()),
        }
    }

    /// Sends a step's parts; as [`Shards::send_all`], except that a shard's
    /// final refusal (4xx) after another shard applied its part is answered
    /// `409 partially-applied`, naming both: the step is then neither whole
    /// nor absent, which a plain refusal would misstate.
    async fn send_step_parts(
        &self,
        requests: Vec<ShardRequest>,
        split: &SplitStep,
    ) -> Result<Vec<NodeAnswer>, Response> {
        let mut answers = self.gather(requests).await;
        let Some(i) = first_failure(&answers) else {
            return Ok(answers.into_iter().flatten().collect());
        };
        let applied: Vec<String> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Ok(a) if a.ok()))
            .map(|(s, _)| self.layout.shard_dataset(s))
            .collect();
        let refused = match answers.swap_remove(i) {
            Ok(answer) if answer.status.is_client_error() && !applied.is_empty() => answer,
            Ok(answer) => return Err(answer.into_response()),
            Err(refusal) => return Err(refusal),
        };
        let detail = serde_json::from_slice::<Value>(&refused.body)
            .ok()
            .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        let detail = split.dataset_detail(&self.layout, i, &detail);
        let range = &self.layout.ranges[i];
        Err(Problem::new(
            StatusCode::CONFLICT,
            "partially-applied",
            format!(
                "the step was applied in part: shard {:?} (the dataset's ids {} to {}) refused \
                 its part ({}: {detail}; ids and positions as the dataset's and the report's) \
                 while {} applied theirs; a retry of the same report is answered as a \
                 duplicate by those, so correct what the shard refused and send that shard's \
                 part, or see docs/cluster.md",
                self.layout.shard_dataset(i),
                range.start,
                range.end - 1,
                refused.status.as_u16(),
                applied.join(", ")
            ),
        )
        .into_response())
    }

    /// Sends every request in parallel; one answer (or refusal to send) each.
    pub(super) async fn gather(
        &self,
        requests: Vec<ShardRequest>,
    ) -> Vec<Result<NodeAnswer, Response>> {
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|r| {
                let me = self.clone();
                tokio::spawn(async move { me.send(r).await })
            })
            .collect();
        let mut answers = Vec::with_capacity(tasks.len());
        for task in tasks {
            answers.push(match task.await {
                Ok(answer) => answer,
                Err(_) => Err(Problem::internal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "a shard request failed",
                )
                .into_response()),
            });
        }
        answers
    }
}

/// The worse of two shards' worst cases: the larger epsilon, then the more
/// steps (on a tie, `b`). Between steps every shard has the same worst case; a
/// shard ahead (mid-step) or one whose counter a hand-sent part moved has the
/// larger, and the dataset's worst case is its worst shard's.
fn worse_of(a: WorstCaseBounds, b: WorstCaseBounds) -> WorstCaseBounds {
    match a.epsilon.total_cmp(&b.epsilon).then(a.steps.cmp(&b.steps)) {
        std::cmp::Ordering::Greater => a,
        _ => b,
    }
}

/// The answer to give instead of the shards' when one failed: a retryable one
/// (no answer, 5xx) first, else the first refusal.
fn first_failure(answers: &[Result<NodeAnswer, Response>]) -> Option<usize> {
    let retryable = answers.iter().position(|a| match a {
        Err(_) => true,
        Ok(a) => a.status.is_server_error(),
    });
    retryable.or_else(|| answers.iter().position(|a| !matches!(a, Ok(a) if a.ok())))
}

/// A shard's JSON answer, or the refusal to give when it is malformed.
fn parse<T: serde::de::DeserializeOwned>(answer: &NodeAnswer) -> Result<T, Box<Response>> {
    serde_json::from_slice(&answer.body).map_err(|e| {
        Box::new(
            Problem::internal(
                StatusCode::BAD_GATEWAY,
                format!("a shard's answer was malformed: {e}"),
            )
            .into_response(),
        )
    })
}

pub(super) fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    (status, axum::Json(value)).into_response()
}

/// Answers a request for sharded dataset `layout.dataset`; see the module
/// documentation.
pub async fn serve(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Response {
    match serve_inner(state, node, layout, request).await {
        Ok(response) | Err(response) => response,
    }
}

async fn serve_inner(
    state: Arc<AppState>,
    node: Arc<ClusterNode>,
    layout: Arc<ShardLayout>,
    request: Request,
) -> Result<Response, Response> {
    let (mut parts, body) = request.into_parts();
    let problem = |p: Problem| p.into_response();
    let Auth(claims) = Auth::from_request_parts(&mut parts, &state)
        .await
        .map_err(problem)?;
    let d = layout.dataset.clone();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/v1/datasets/")
        .and_then(|p| p.strip_prefix(d.as_str()))
        .unwrap_or("")
        .to_string();
    let shards = Shards {
        authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
        idempotency_key: None,
        state: state.clone(),
        node,
        layout: layout.clone(),
    };
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    match (parts.method.clone(), segments.as_slice()) {
        (Method::GET, []) => {
            claims.authorize(Access::Train(&d)).map_err(problem)?;
            let view = view(&shards).await?;
            Ok(json_response(StatusCode::OK, &view))
        }
        (Method::POST, ["steps"]) => {
            claims.authorize(Access::Train(&d)).map_err(problem)?;
            check_idempotency_header(&mut parts, &state).await?;
            let raw = RawBody::from_request(Request::from_parts(parts, body), &state)
                .await
                .map_err(problem)?;
            let report = raw.step_report().map_err(problem)?;
            let split = split_step(&layout, &report).map_err(|e| problem(e.into()))?;
            let requests = split
                .parts
                .iter()
                .enumerate()
                .map(|(s, p)| {
                    let bytes = payload_from_report(p).encode();
                    (
                        s,
                        Method::POST,
                        "/steps".to_string(),
                        Some((super::extract::BINARY_STEP, bytes)),
                    )
                })
                .collect();
            let answers = shards.send_step_parts(requests, &split).await?;
            let outcomes = answers
                .iter()
                .map(parse::<StepOutcome>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| *e)?;
            let merged = split
                .merge(&layout, &outcomes)
                .map_err(|e| problem(e.into()))?;
            Ok(json_response(StatusCode::OK, &merged))
        }
        (Method::POST, ["refresh"]) => {
            claims.authorize(Access::Train(&d)).map_err(problem)?;
            let key = parts.headers.get(super::idempotency::HEADER).cloned();
            check_idempotency_header(&mut parts, &state).await?;
            let raw = RawBody::from_request(Request::from_parts(parts, body), &state)
                .await
                .map_err(problem)?;
            let request: RefreshRequest = raw.json().map_err(problem)?;
            // Split like a step (the same checks before any shard sees it);
            // every shard refreshes its own ids (none, for some: the
            // checkpoint is then in every shard's log, as in one ledger's),
            // with the caller's key, so that a retry is recognised shard by
            // shard.
            let split = split_step(
                &layout,
                &crate::ledger::StepReport::new(0, request.ids, request.norms),
            )
            .map_err(|e| problem(e.into()))?;
            let requests = split
                .parts
                .iter()
                .enumerate()
                .map(|(s, part)| {
                    let body = json!({"ids": part.ids, "norms": part.norms}).to_string();
                    (
                        s,
                        Method::POST,
                        "/refresh".to_string(),
                        Some(("application/json", body.into_bytes())),
                    )
                })
                .collect();
            let keyed = Shards {
                idempotency_key: key,
                ..shards.clone()
            };
            let answers = keyed.send_all(requests).await?;
            let outcomes = answers
                .iter()
                .map(parse::<RefreshOutcome>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| *e)?;
            let merged = split
                .merge_refresh(&layout, &outcomes)
                .map_err(|e| problem(e.into()))?;
            Ok(json_response(StatusCode::OK, &merged))
        }
        (Method::GET, ["thresholds"]) => {
            claims.authorize(Access::Train(&d)).map_err(problem)?;
            let range = ApiQuery::<ThresholdRange>::from_request_parts(&mut parts, &state)
                .await
                .and_then(|q| q.parse())
                .map_err(problem)?;
            Ok(json_response(
                StatusCode::OK,
                &thresholds(&shards, range).await?,
            ))
        }
        (Method::GET, ["examples", example, "privacy"]) => {
            let example = example.parse::<u64>().map_err(|_| {
                Problem::bad_request(format!(
                    "invalid path: example id {example:?} is not a number"
                ))
            });
            claims
                .authorize(Access::Example(&d, *example.as_ref().unwrap_or(&u64::MAX)))
                .map_err(problem)?;
            let example = example.map_err(problem)?;
            let Some(s) = layout.shard_of(example) else {
                // As an unsharded ledger answers it.
                return Err(problem(
                    Problem::bad_request(format!(
                        "invalid id: {example} is out of range: the dataset has {} examples",
                        layout.examples
                    ))
                    .with_field("id"),
                ));
            };
            let local = example - layout.ranges[s].start;
            let query = parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let answer = shards
                .send_all(vec![(
                    s,
                    Method::GET,
                    format!("/examples/{local}/privacy{query}"),
                    None,
                )])
                .await?;
            let mut value: Value = parse(&answer[0]).map_err(|e| *e)?;
            // The shard answers with its local id; the caller asked for the
            // dataset's (an answer of another shape is the shard's fault: 502).
            let Some(slot) = value
                .get_mut("example")
                .and_then(Value::as_object_mut)
                .and_then(|e| e.get_mut("id"))
            else {
                return Err(problem(Problem::internal(
                    StatusCode::BAD_GATEWAY,
                    "a shard's privacy answer has no example id",
                )));
            };
            *slot = json!(example);
            Ok(json_response(StatusCode::OK, &value))
        }
        (Method::GET, ["worst-case"]) => {
            claims.authorize(Access::View(&d)).map_err(problem)?;
            let query = parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let requests = (0..layout.ranges.len())
                .map(|s| (s, Method::GET, format!("/worst-case{query}"), None))
                .collect();
            let answers = shards.send_all(requests).await?;
            // Data-independent: equal on every shard between steps; otherwise
            // the worst of them (never below the truth).
            let bounds = answers
                .iter()
                .map(parse::<WorstCaseBounds>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| *e)?;
            let worst = bounds.into_iter().reduce(worse_of).ok_or_else(|| {
                problem(Problem::internal(
                    StatusCode::BAD_GATEWAY,
                    "no shard answered",
                ))
            })?;
            Ok(json_response(StatusCode::OK, &worst))
        }
        // The release book is the same on every shard (every change is in
        // every shard's log): the first shard's answers.
        (Method::GET, ["releases", ..] | ["release-budget"] | ["release-policy"]) => {
            claims.authorize(Access::View(&d)).map_err(problem)?;
            let query = parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let answer = shards
                .send_all(vec![(0, Method::GET, format!("{rest}{query}"), None)])
                .await?;
            Ok(answer.into_iter().next().map_or_else(
                || StatusCode::BAD_GATEWAY.into_response(),
                NodeAnswer::into_response,
            ))
        }
        (method, _) => Err(problem(unsupported(
            &claims,
            &d,
            method.as_str(),
            &segments,
        ))),
    }
}

/// A change sent straight to one shard `{d}~{start}` that its dataset refuses
/// (`409 sharded-unsupported`): releases, labels or budgets on one shard would
/// charge or change it alone. Reads, step parts, refreshes and archiving (what
/// a node sends its shards) pass; a step part or refresh sent to one shard by
/// hand is accounted for that shard's examples as such; a shard archived by
/// hand makes the dataset read-only (its view says archived), which archiving
/// the dataset completes.
pub(super) fn refuse_shard_change(id: &str, request: &Request) -> Option<Response> {
    let (dataset, _) = crate::engine::sharding::parse_shard_id(id)?;
    let path = request.uri().path();
    let post = *request.method() == Method::POST;
    let is_step = path.ends_with("/steps") && post;
    let is_archive = path.ends_with("/archive") && post;
    let is_refresh = path.ends_with("/refresh") && post;
    if *request.method() == Method::GET || is_step || is_archive || is_refresh {
        return None;
    }
    Some(
        sharded_unsupported(format!(
            "{} {path}: {id:?} is a shard of the sharded dataset {dataset:?}; changes other than \
             steps go to the dataset",
            request.method()
        ))
        .into_response(),
    )
}

/// A malformed `Idempotency-Key` is refused here as anywhere (each shard
/// sees the key again where it is passed on, or recognises retries by content).
async fn check_idempotency_header(
    parts: &mut axum::http::request::Parts,
    state: &Arc<AppState>,
) -> Result<(), Response> {
    let idempotency = IdempotencyHeader::from_request_parts(parts, state)
        .await
        .map_err(IntoResponse::into_response)?;
    idempotency.key(b"").map_err(IntoResponse::into_response)?;
    Ok(())
}

/// `409 sharded-unsupported`: `what` is not (yet) exact across shards, so it
/// is refused rather than answered.
fn sharded_unsupported(what: String) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "sharded-unsupported",
        format!("{what} (change the sharded dataset instead; see docs/cluster.md)"),
    )
}

/// Any other endpoint of a sharded dataset: authorised as it would be, then
/// refused (not yet exact across shards), or 404 when there is no such endpoint.
fn unsupported(claims: &Claims, d: &str, method: &str, segments: &[&str]) -> Problem {
    let mut example = 0;
    let template: Vec<&str> = segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i > 0 && segments[i - 1] == "examples" {
                example = s.parse().unwrap_or(u64::MAX);
                "{example}"
            } else {
                s
            }
        })
        .collect();
    let path = format!("/v1/datasets/{{dataset}}/{}", template.join("/"));
    let Some(endpoint) = super::permissions::endpoint(method, &path) else {
        return Problem::not_found("no such endpoint");
    };
    if let Some(access) = endpoint.scope.access(d, example) {
        if let Err(refusal) = claims.authorize(access) {
            return refusal;
        }
    }
    sharded_unsupported(format!(
        "{method} {path} is not supported on a sharded dataset yet"
    ))
}

/// The dataset's view: its shards' statuses merged, the worst case of its
/// worst shard (see `worse_of`), and the shard map.
pub(super) async fn view(shards: &Shards) -> Result<DatasetView, Response> {
    let layout = &shards.layout;
    let requests = (0..layout.ranges.len())
        .map(|s| (s, Method::GET, String::new(), None))
        .collect();
    let answers = shards.send_all(requests).await?;
    let views = answers
        .iter()
        .map(parse::<Value>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| *e)?;
    let field = |v: &Value, name: &str| v.get(name).cloned().unwrap_or(Value::Null);
    let mut statuses: Vec<LedgerStatus> = Vec::new();
    let mut worst: Option<WorstCaseBounds> = None;
    for v in &views {
        let status: LedgerStatus = serde_json::from_value(field(v, "status")).map_err(|e| {
            Problem::internal(
                StatusCode::BAD_GATEWAY,
                format!("a shard's status was malformed: {e}"),
            )
            .into_response()
        })?;
        let bounds: WorstCaseBounds =
            serde_json::from_value(field(v, "worst_case")).map_err(|e| {
                Problem::internal(
                    StatusCode::BAD_GATEWAY,
                    format!("a shard's worst case was malformed: {e}"),
                )
                .into_response()
            })?;
        worst = Some(match worst {
            Some(w) => worse_of(w, bounds),
            None => bounds,
        });
        statuses.push(status);
    }
    let leases = shards
        .node
        .view()
        .await
        .map_err(|e| Problem::from(e).into_response())?
        .1;
    let map = statuses
        .iter()
        .enumerate()
        .map(|(s, status)| {
            let name = layout.shard_dataset(s);
            let lease = leases.iter().find(|l| l.dataset == name);
            ShardView {
                start: layout.ranges[s].start,
                end: layout.ranges[s].end,
                owner: lease
                    .filter(|l| l.expires_in_ms > 0)
                    .and_then(|l| l.owner.clone()),
                epoch: lease.map_or(0, |l| l.epoch),
                steps: status.steps,
                dataset: name,
            }
        })
        .collect();
    let internal = |detail: &str| {
        Problem::internal(StatusCode::BAD_GATEWAY, detail.to_string()).into_response()
    };
    Ok(DatasetView {
        id: layout.dataset.clone(),
        archived: views.iter().any(|v| v["archived"] == json!(true)),
        config: layout
            .config()
            .map_err(|e| Problem::from(e).into_response())?,
        status: merge_status(&statuses).ok_or_else(|| internal("no shard answered"))?,
        worst_case: worst.ok_or_else(|| internal("no shard answered"))?,
        shards: Some(map),
    })
}

/// Thresholds of ids `start..end` of the dataset, from the shards holding them.
async fn thresholds(shards: &Shards, range: ThresholdRange) -> Result<Thresholds, Response> {
    let layout = &shards.layout;
    let start = range.start.unwrap_or(0);
    let end = range.end.unwrap_or(layout.examples).min(layout.examples);
    if start > end {
        return Err(
            Problem::bad_request(format!("start {start} is after end {end}"))
                .with_field("start")
                .into_response(),
        );
    }
    let max_range = shards.state.limits.max_threshold_range;
    if end - start > max_range {
        return Err(
            Problem::bad_request(format!("at most {max_range} thresholds per request"))
                .with_field("end")
                .into_response(),
        );
    }
    let mut pieces = split_range(layout, start..end);
    if pieces.is_empty() {
        // An empty range still says which step is next.
        pieces.push((0, 0..0));
    }
    let requests = pieces
        .iter()
        .map(|(s, r)| {
            (
                *s,
                Method::GET,
                format!("/thresholds?start={}&end={}", r.start, r.end),
                None,
            )
        })
        .collect();
    let answers = shards.send_all(requests).await?;
    let mut merged = Thresholds {
        start,
        next_step: u64::MAX,
        thresholds: Vec::with_capacity((end - start) as usize),
        retired: Vec::new(),
        refresh_due: None,
    };
    let mut due = Vec::new();
    for ((s, _), answer) in pieces.iter().zip(&answers) {
        let part: Thresholds = parse(answer).map_err(|e| *e)?;
        due.push((*s, part.refresh_due));
        let offset = layout.ranges[*s].start;
        merged.next_step = merged.next_step.min(part.next_step);
        merged.thresholds.extend(part.thresholds);
        merged
            .retired
            .extend(part.retired.into_iter().map(|r| r + offset));
    }
    // What is due on the shards the range touched, as one.
    merged.refresh_due =
        crate::ledger::RefreshDue::merge(&layout.ranges, due.iter().map(|(s, d)| (*s, d.as_ref())));
    Ok(merged)
}

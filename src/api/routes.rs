//! Endpoints under `/v1`, the operational endpoints and the OpenAPI document.
//! Every handler first authorises the exact object it touches, then looks it up,
//! so a token scoped to another dataset learns nothing (not even existence).

use super::accountant::{
    CompareRequest, CompareResponse, EpsilonRequest, EpsilonResponse, NoiseRequest, NoiseResponse,
    RdpRequest, RdpResponse, ScheduleRequest, ScheduleResponse,
};
use super::auth::Access;
use super::extract::{ApiPath, ApiQuery, Auth, RawBody};
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::accounting::{validate, Conversion};
use crate::ledger::{
    DatasetConfig, ExamplePrivacy, LedgerStatus, RefreshOutcome, StepOutcome, WorstCase,
};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use utoipa::{IntoParams, OpenApi, ToSchema};

type S = State<Arc<AppState>>;

/// Create a dataset (one training run's ledger).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDataset {
    /// 1–64 characters of `A-Z a-z 0-9 . _ -`.
    pub id: String,
    /// The ledger's configuration.
    pub config: DatasetConfig,
    /// Budget for DP releases of aggregates (default: none, so no release is
    /// possible until a curator sets one).
    #[serde(default)]
    pub release_budget: Option<crate::release::BudgetRequest>,
    /// Group labels of examples `0, 1, …` (`null`: unlabelled), for per-group
    /// releases.
    #[serde(default)]
    pub labels: Option<Vec<Option<String>>>,
    /// Release automatically every N steps.
    #[serde(default)]
    pub release_policy: Option<crate::release::ReleasePolicy>,
}

/// A dataset's state, with the public worst case at its reporting delta.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetView {
    /// The id.
    pub id: String,
    /// Archived datasets are read-only.
    pub archived: bool,
    /// The configuration it was created with.
    pub config: DatasetConfig,
    /// Ledger summary (steps, retirements, memory).
    pub status: LedgerStatus,
    /// The data-independent accountant at the configured delta.
    pub worst_case: WorstCase,
}

/// Dataset ids visible to the caller.
#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetList {
    /// Sorted ids.
    pub datasets: Vec<String>,
}

/// Which thresholds to read.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ThresholdRange {
    /// First example id (inclusive, default 0).
    pub start: Option<u64>,
    /// Last example id (exclusive, default all, at most 1,048,576 per request).
    pub end: Option<u64>,
}

/// Current clipping thresholds of a range of examples.
#[derive(Debug, Serialize, ToSchema)]
pub struct Thresholds {
    /// The first id.
    pub start: u64,
    /// The step these thresholds apply to (the next step).
    pub next_step: u64,
    /// Threshold of ids `start, start+1, ...` (0 for retired examples).
    pub thresholds: Vec<f64>,
    /// The ids of the range that the individual filter retired: leave them out of
    /// batches (a threshold of 0 alone may also mean a last norm of 0).
    pub retired: Vec<u64>,
}

/// Full-batch norms for a refresh (spec §3.5).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// Example ids (distinct).
    pub ids: Vec<u64>,
    /// Their unclipped gradient norms.
    pub norms: Vec<f64>,
}

/// Privacy query parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PrivacyQuery {
    /// Delta in (0, 1); default: the dataset's reporting delta.
    pub delta: Option<f64>,
    /// `improved` (default) or `classic`.
    pub conversion: Option<String>,
}

/// One example's privacy, with the worst case beside it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PrivacyView {
    /// The delta used.
    pub delta: f64,
    /// The example's own accounting.
    pub example: ExamplePrivacy,
    /// The data-independent accountant at the same delta.
    pub worst_case: WorstCase,
}

/// Liveness / readiness.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// "ok".
    pub status: String,
}

/// Run a state change on its own task so that it completes even if the client
/// disconnects: once a change is in the log it must also be applied in memory.
pub(super) async fn run_to_completion<T: Send + 'static>(
    change: impl std::future::Future<Output = ApiResult<T>> + Send + 'static,
) -> ApiResult<T> {
    tokio::spawn(change).await.map_err(|_| {
        Problem::internal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the change's task failed",
        )
    })?
}

fn parse_query(q: &PrivacyQuery, default_delta: f64) -> ApiResult<(f64, Conversion)> {
    let delta = validate::delta("delta", q.delta.unwrap_or(default_delta))?;
    let conversion = match q.conversion.as_deref() {
        None => Conversion::default(),
        Some(text) => text.parse().map_err(|e: String| {
            Problem::bad_request(format!("invalid conversion: {e}")).with_field("conversion")
        })?,
    };
    Ok((delta, conversion))
}

async fn view(state: &AppState, id: &str) -> ApiResult<DatasetView> {
    let ds = state.dataset(id)?;
    ds.check_current()?;
    let ledger = ds.ledger.read().await;
    let config = ledger.config().clone();
    let worst_case = ledger.worst_case(config.delta, Conversion::default())?;
    Ok(DatasetView {
        id: id.to_string(),
        archived: ds.archived.load(Ordering::Acquire),
        status: ledger.status(),
        config,
        worst_case,
    })
}

#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", request_body = CreateDataset,
    responses((status = 201, body = DatasetView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn create_dataset(
    State(state): S,
    Auth(claims): Auth,
    body: RawBody,
) -> ApiResult<impl IntoResponse> {
    claims.authorize(Access::Admin)?;
    let body: CreateDataset = body.json()?;
    let setup = super::state::DatasetSetup {
        release_budget: body
            .release_budget
            .as_ref()
            .map(|b| b.to_rho())
            .transpose()?,
        labels: body.labels,
        release_policy: body.release_policy,
    };
    let (st, id, config) = (state.clone(), body.id.clone(), body.config);
    run_to_completion(async move { st.create_dataset(&id, config, setup).await.map(|_| ()) })
        .await?;
    Ok((StatusCode::CREATED, Json(view(&state, &body.id).await?)))
}

#[utoipa::path(get, path = "/v1/datasets", tag = "datasets",
    responses((status = 200, body = DatasetList), (status = 401, body = Problem)), security(("bearer" = [])))]
async fn list_datasets(State(state): S, Auth(claims): Auth) -> ApiResult<Json<DatasetList>> {
    let datasets = state
        .dataset_ids()
        .into_iter()
        .filter(|d| claims.sees_dataset(d))
        .collect();
    Ok(Json(DatasetList { datasets }))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}", tag = "datasets", params(("dataset" = String, Path)),
    responses((status = 200, body = DatasetView), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem)), security(("bearer" = [])))]
async fn get_dataset(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<DatasetView>> {
    claims.authorize(Access::Train(&id))?;
    Ok(Json(view(&state, &id).await?))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/archive", tag = "datasets", params(("dataset" = String, Path)),
    responses((status = 200, body = DatasetView), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem)), security(("bearer" = [])))]
async fn archive_dataset(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<DatasetView>> {
    claims.authorize(Access::Curate(&id))?;
    let (st, id2) = (state.clone(), id.clone());
    run_to_completion(async move { st.archive(&id2).await }).await?;
    Ok(Json(view(&state, &id).await?))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/steps", tag = "training", params(("dataset" = String, Path)),
    request_body(content = StepReport, description = "JSON, or the compact binary encoding (application/octet-stream, see store::codec)"),
    responses((status = 200, body = StepOutcome), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem),
               (status = 413, body = Problem), (status = 415, body = Problem)),
    security(("bearer" = [])))]
async fn report_step(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
    body: RawBody,
) -> ApiResult<Json<StepOutcome>> {
    claims.authorize(Access::Train(&id))?;
    let report = body.step_report()?;
    let span =
        tracing::info_span!("step", dataset = %id, step = report.step, batch = report.ids.len());
    use tracing::Instrument;
    let st = state.clone();
    Ok(Json(
        run_to_completion(async move { st.report_step(&id, report).await }.instrument(span))
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/thresholds", tag = "training",
    params(("dataset" = String, Path), ThresholdRange),
    responses((status = 200, body = Thresholds), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem)), security(("bearer" = [])))]
async fn thresholds(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(range): ApiQuery<ThresholdRange>,
) -> ApiResult<Json<Thresholds>> {
    claims.authorize(Access::Train(&id))?;
    let ds = state.dataset(&id)?;
    ds.check_current()?;
    let ledger = ds.ledger.read().await;
    let start = range.start.unwrap_or(0);
    let end = range
        .end
        .unwrap_or(ledger.examples())
        .min(ledger.examples());
    if start > end {
        return Err(
            Problem::bad_request(format!("start {start} is after end {end}")).with_field("start"),
        );
    }
    if end - start > state.limits.max_threshold_range {
        return Err(Problem::bad_request(format!(
            "at most {} thresholds per request",
            state.limits.max_threshold_range
        ))
        .with_field("end"));
    }
    let thresholds = ledger.thresholds(start..end)?;
    Ok(Json(Thresholds {
        start,
        next_step: ledger.next_step(),
        thresholds,
        retired: ledger.retired_in(start..end),
    }))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/refresh", tag = "training", params(("dataset" = String, Path)),
    request_body = RefreshRequest,
    responses((status = 200, body = RefreshOutcome), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn refresh(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
    body: RawBody,
) -> ApiResult<Json<RefreshOutcome>> {
    claims.authorize(Access::Train(&id))?;
    let body: RefreshRequest = body.json()?;
    let (st, id2) = (state.clone(), id.clone());
    Ok(Json(
        run_to_completion(async move { st.refresh(&id2, body.ids, body.norms).await }).await?,
    ))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/examples/{example}/privacy", tag = "privacy",
    params(("dataset" = String, Path), ("example" = u64, Path), PrivacyQuery),
    responses((status = 200, body = PrivacyView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem)), security(("bearer" = [])))]
async fn example_privacy(
    State(state): S,
    Auth(claims): Auth,
    ApiPath((id, example)): ApiPath<(String, u64)>,
    ApiQuery(q): ApiQuery<PrivacyQuery>,
) -> ApiResult<Json<PrivacyView>> {
    claims.authorize(Access::Example(&id, example))?;
    let ds = state.dataset(&id)?;
    ds.check_current()?;
    let ledger = ds.ledger.read().await;
    let (delta, conversion) = parse_query(&q, ledger.config().delta)?;
    let example = ledger.privacy(example, delta, conversion)?;
    let worst_case = ledger.worst_case(delta, conversion)?;
    metrics::counter!("dpledger_privacy_queries_total").increment(1);
    Ok(Json(PrivacyView {
        delta,
        example,
        worst_case,
    }))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/worst-case", tag = "privacy",
    params(("dataset" = String, Path), PrivacyQuery),
    responses((status = 200, body = WorstCase), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem)), security(("bearer" = [])))]
async fn worst_case(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PrivacyQuery>,
) -> ApiResult<Json<WorstCase>> {
    claims.authorize(Access::View(&id))?;
    let ds = state.dataset(&id)?;
    ds.check_current()?;
    let ledger = ds.ledger.read().await;
    let (delta, conversion) = parse_query(&q, ledger.config().delta)?;
    Ok(Json(ledger.worst_case(delta, conversion)?))
}

macro_rules! accountant_endpoint {
    ($name:ident, $path:literal, $req:ty, $resp:ty) => {
        #[utoipa::path(post, path = $path, tag = "accountant", request_body = $req,
            responses((status = 200, body = $resp), (status = 400, body = Problem), (status = 401, body = Problem)),
            security(("bearer" = [])))]
        async fn $name(Auth(claims): Auth, body: RawBody) -> ApiResult<Json<$resp>> {
            claims.authorize(Access::Accountant)?;
            let req: $req = body.json()?;
            // CPU-bound (tables, bisection): keep it off the async workers.
            let out = tokio::task::spawn_blocking(move || req.compute())
                .await
                .map_err(|_| Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "accountant task failed"))??;
            Ok(Json(out))
        }
    };
}

accountant_endpoint!(
    accountant_rdp,
    "/v1/accountant/rdp",
    RdpRequest,
    RdpResponse
);
accountant_endpoint!(
    accountant_epsilon,
    "/v1/accountant/epsilon",
    EpsilonRequest,
    EpsilonResponse
);
accountant_endpoint!(
    accountant_noise,
    "/v1/accountant/noise",
    NoiseRequest,
    NoiseResponse
);
accountant_endpoint!(
    accountant_compare,
    "/v1/accountant/compare",
    CompareRequest,
    CompareResponse
);
accountant_endpoint!(
    accountant_schedule,
    "/v1/accountant/schedule",
    ScheduleRequest,
    ScheduleResponse
);

#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/readyz", tag = "operations", responses((status = 200, body = Health)))]
async fn readyz() -> Json<Health> {
    // The router only exists after recovery finished, so serving means ready.
    Json(Health {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")))]
async fn metrics_endpoint(State(state): S) -> impl IntoResponse {
    let body = state
        .metrics
        .as_ref()
        .map(|h| h.render())
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "This document", content_type = "application/json")))]
async fn openapi_json() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi_document(),
    )
}

/// Conventions applied to the whole document: bearer security, and error
/// responses that say what the server really sends.
struct ApiConventions;

impl utoipa::Modify for ApiConventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    super::problem::PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in ops.into_iter().flatten() {
                let responses = &mut op.responses.responses;
                // Errors are RFC 9457 documents.
                for (code, response) in responses.iter_mut() {
                    if code.as_str() >= "400" {
                        if let RefOr::T(r) = response {
                            if let Some(content) = r.content.shift_remove("application/json") {
                                r.content
                                    .insert(super::problem::PROBLEM_JSON.to_string(), content);
                            }
                        }
                    }
                }
                if op.request_body.is_some() {
                    responses
                        .entry("413".into())
                        .or_insert_with(|| RefOr::T(problem("Request body too large")));
                    responses
                        .entry("415".into())
                        .or_insert_with(|| RefOr::T(problem("Unsupported Content-Type")));
                }
                if path.starts_with("/v1/datasets") && op.request_body.is_some() {
                    responses.entry("503".into()).or_insert_with(|| {
                        RefOr::T(problem(
                            "The store could not make the change durable; nothing was acknowledged",
                        ))
                    });
                }
            }
        }
    }
}

use crate::ledger::StepReport;

/// The OpenAPI description of the service.
#[derive(OpenApi)]
#[openapi(
    info(title = "dpledger", description = "Per-instance Rényi-DP privacy accounting for DP-SGD training runs."),
    paths(create_dataset, list_datasets, get_dataset, archive_dataset, report_step, thresholds, refresh,
          example_privacy, worst_case, accountant_rdp, accountant_epsilon, accountant_noise, accountant_compare,
          accountant_schedule, healthz, readyz, metrics_endpoint, openapi_json),
    modifiers(&ApiConventions),
    tags((name = "datasets"), (name = "training"), (name = "privacy"), (name = "releases"), (name = "accountant"), (name = "operations"))
)]
pub struct ApiDoc;

/// The OpenAPI document as pretty JSON (what `dpledger openapi` writes).
pub fn openapi_document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.merge(super::release_routes::ReleaseApi::openapi());
    utoipa::Modify::modify(&ApiConventions, &mut doc);
    doc.to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
        + "\n"
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.limits.max_body_bytes;
    Router::new()
        .route("/v1/datasets", post(create_dataset).get(list_datasets))
        .route("/v1/datasets/{dataset}", get(get_dataset))
        .route("/v1/datasets/{dataset}/archive", post(archive_dataset))
        .route("/v1/datasets/{dataset}/steps", post(report_step))
        .route("/v1/datasets/{dataset}/thresholds", get(thresholds))
        .route("/v1/datasets/{dataset}/refresh", post(refresh))
        .route(
            "/v1/datasets/{dataset}/examples/{example}/privacy",
            get(example_privacy),
        )
        .route("/v1/datasets/{dataset}/worst-case", get(worst_case))
        .route("/v1/accountant/rdp", post(accountant_rdp))
        .route("/v1/accountant/epsilon", post(accountant_epsilon))
        .route("/v1/accountant/noise", post(accountant_noise))
        .route("/v1/accountant/compare", post(accountant_compare))
        .route("/v1/accountant/schedule", post(accountant_schedule))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .route("/openapi.json", get(openapi_json))
        .merge(super::release_routes::routes())
        .fallback(|| async { Problem::not_found("no such endpoint") })
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |req: &axum::http::Request<_>| {
                    // Method and path only: never headers (tokens) or bodies (epsilons).
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path())
                },
            ),
        )
        .with_state(state)
}

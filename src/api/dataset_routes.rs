//! Endpoints of datasets, training and privacy queries: create, list, read and
//! archive datasets; report steps and refreshes; read thresholds, an example's
//! privacy and the worst case. Each handler authorises, extracts, calls the
//! engine and shapes the answer.
//!
//! Why one file of about 540 lines: the handlers of one resource, each a few
//! lines of authorise, extract, call and answer, with the OpenAPI
//! annotations that make up most of its length.

use super::auth::Access;
use super::extract::{ApiPath, ApiQuery, Auth, PassedOn, RawBody};
use super::idempotency::IdempotencyHeader;
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use super::task::run_to_completion;
use crate::accounting::Conversion;
use crate::engine::{DatasetSetup, ExampleQuery, IdRange};
use crate::ledger::{DatasetConfig, RefreshOutcome, StepOutcome, StepReport, WorstCaseBounds};
use crate::release::BudgetRequestExt;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
/// The answers of the dataset and privacy queries, defined once with the Rust
/// client in the workspace crate `dpledger-api`.
pub use dpledger_api::views::{DatasetView, PrivacyView, Thresholds};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

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
    /// Cluster mode: split the dataset into this many contiguous ranges of
    /// example ids (1–256, at most `examples`), each its own ledger and lease,
    /// placed on different nodes where possible.
    /// Absent: one ledger, or in cluster mode
    /// ⌈examples / bound⌉ shards when `examples` is above the nodes'
    /// `--max-shard-examples` (a single server refuses such a creation).
    #[serde(default)]
    pub shards: Option<u32>,
}

impl CreateDataset {
    /// Whether a cluster creates it as a sharded dataset: shards asked for,
    /// or more examples than one ledger's `bound` (`--max-shard-examples`).
    /// A shard's own creation (`{dataset}~{start}`, sent by the node that
    /// coordinates its dataset's) is an ordinary one.
    pub(super) fn is_sharded(&self, bound: u64) -> bool {
        self.shards.is_some()
            || (self.config.examples > bound
                && crate::engine::sharding::parse_shard_id(&self.id).is_none())
    }
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

/// Unclipped norms for a refresh (spec §3.2): in the predictable mode exactly
/// the ids the schedule calls for before the next step (retired ids may be
/// left out; a full pass may come in several requests), all computed at one
/// model state.
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

/// An example's privacy query parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExamplePrivacyQuery {
    /// Delta in (0, 1); default: the dataset's reporting delta.
    pub delta: Option<f64>,
    /// `improved` (default) or `classic`.
    pub conversion: Option<String>,
    /// `guarantee` (default): the proven bounds only. `pld_estimate`: also the
    /// example's PLD epsilon over its actual history of thresholds, an estimate
    /// labelled `"guarantee": false` (adaptive thresholds: not a proven bound).
    pub method: Option<String>,
}

/// What an example's privacy query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExampleMethod {
    Guarantee,
    PldEstimate,
}

fn parse_method(method: Option<&str>) -> ApiResult<ExampleMethod> {
    match method {
        None | Some("guarantee") => Ok(ExampleMethod::Guarantee),
        Some("pld_estimate") => Ok(ExampleMethod::PldEstimate),
        Some(other) => Err(Problem::bad_request(format!(
            "invalid method {other:?}: expected guarantee (default) or pld_estimate"
        ))
        .with_field("method")),
    }
}

/// A privacy query's delta (checked by the engine against the dataset's
/// default) and conversion (`improved` when absent).
fn privacy_query(
    delta: Option<f64>,
    conversion: Option<&str>,
) -> ApiResult<crate::engine::PrivacyQuery> {
    let conversion = match conversion {
        None => Conversion::default(),
        Some(text) => text.parse().map_err(|e: String| {
            Problem::bad_request(format!("invalid conversion: {e}")).with_field("conversion")
        })?,
    };
    Ok(crate::engine::PrivacyQuery { delta, conversion })
}

async fn view(state: &AppState, id: &str) -> ApiResult<DatasetView> {
    Ok(state.engine.ledger_view(id).await?)
}

#[utoipa::path(post, path = "/v1/datasets", tag = "datasets", request_body = CreateDataset,
    responses((status = 201, body = DatasetView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn create_dataset(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<impl IntoResponse> {
    claims.authorize(Access::Admin)?;
    let key = idempotency.key(body.bytes())?;
    let body: CreateDataset = body.json()?;
    let bound = state.limits.max_shard_examples;
    let sharded = body.is_sharded(bound);
    let setup = DatasetSetup {
        release_budget: body
            .release_budget
            .as_ref()
            .map(|b| b.to_rho())
            .transpose()?,
        labels: body.labels,
        release_policy: body.release_policy,
    };
    match state.engine.cluster() {
        None if body.shards.is_some() => {
            return Err(
                Problem::bad_request("shards need cluster mode (dpledger serve --cluster)")
                    .with_field("shards"),
            )
        }
        None => {
            if let Some(bound) = state.limits.single_max_examples {
                crate::engine::sharding::check_single_ledger(&body.config, bound)?;
            }
        }
        // Coordinated here, and run to its end even if the caller goes.
        Some(_) if sharded => {
            let (st, id, config, shards) = (state.clone(), body.id, body.config, body.shards);
            let view = run_to_completion(async move {
                st.engine
                    .create_sharded(&id, config, shards, bound, setup, caller)
                    .await
            })
            .await?;
            return Ok((StatusCode::CREATED, Json(view)));
        }
        Some(_) => {}
    }
    let (st, id, config) = (state.clone(), body.id.clone(), body.config);
    run_to_completion(async move {
        st.engine
            .create_dataset(&id, config, setup, key)
            .await
            .map(|_| ())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(view(&state, &body.id).await?)))
}

#[utoipa::path(get, path = "/v1/datasets", tag = "datasets",
    responses((status = 200, body = DatasetList), (status = 401, body = Problem),
              (status = 503, body = Problem)), security(("bearer" = [])))]
async fn list_datasets(State(state): S, Auth(claims): Auth) -> ApiResult<Json<DatasetList>> {
    let datasets = state
        .engine
        .all_dataset_ids()
        .await?
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
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<DatasetView>> {
    claims.authorize(Access::Train(&id))?;
    Ok(Json(state.engine.view_as(&id, caller).await?))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/archive", tag = "datasets", params(("dataset" = String, Path)),
    responses((status = 200, body = DatasetView), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem)), security(("bearer" = [])))]
async fn archive_dataset(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
) -> ApiResult<Json<DatasetView>> {
    claims.authorize(Access::Curate(&id))?;
    let key = idempotency.key(b"")?;
    if let Some(shards) = state.engine.sharded(&id, caller).await? {
        // Run to its end even if the caller goes (owners hold their shards'
        // writes until the change is decided).
        let view = run_to_completion(async move { shards.archive_dataset().await }).await?;
        return Ok(Json(view));
    }
    let (st, id2) = (state.clone(), id.clone());
    run_to_completion(async move { st.engine.archive(&id2, key).await }).await?;
    Ok(Json(view(&state, &id).await?))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/steps", tag = "training", params(("dataset" = String, Path)),
    request_body(content = StepReport, description = "JSON, or the compact binary encoding (application/octet-stream, see ledger::wire)"),
    responses((status = 200, body = StepOutcome), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem),
               (status = 413, body = Problem), (status = 415, body = Problem)),
    security(("bearer" = [])))]
async fn report_step(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Json<StepOutcome>> {
    claims.authorize(Access::Train(&id))?;
    // Steps are exactly once by (step, part) already (a retry is answered with
    // its first outcome): a key is checked for form only.
    idempotency.key(b"")?;
    let report = body.step_report()?;
    let span =
        tracing::info_span!("step", dataset = %id, step = report.step, batch = report.ids.len());
    use tracing::Instrument;
    let st = state.clone();
    Ok(Json(
        run_to_completion(
            async move { st.engine.step_as(&id, report, caller).await }.instrument(span),
        )
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
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    query: ApiQuery<ThresholdRange>,
) -> ApiResult<Json<Thresholds>> {
    claims.authorize(Access::Train(&id))?;
    let range = query.parse()?;
    let range = IdRange {
        start: range.start,
        end: range.end,
    };
    let max_range = state.limits.max_threshold_range;
    let answer = state
        .engine
        .thresholds_as(&id, range, max_range, caller)
        .await?;
    Ok(Json(answer))
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/refresh", tag = "training", params(("dataset" = String, Path)),
    request_body = RefreshRequest,
    responses((status = 200, body = RefreshOutcome), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn refresh(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Json<RefreshOutcome>> {
    claims.authorize(Access::Train(&id))?;
    let key = idempotency.key(body.bytes())?;
    let body: RefreshRequest = body.json()?;
    let (st, id2) = (state.clone(), id.clone());
    Ok(Json(
        run_to_completion(async move {
            st.engine
                .refresh_as(&id2, body.ids, body.norms, key, caller)
                .await
        })
        .await?,
    ))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/examples/{example}/privacy", tag = "privacy",
    params(("dataset" = String, Path), ("example" = u64, Path), ExamplePrivacyQuery),
    responses((status = 200, body = PrivacyView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem),
               (status = 409, body = Problem, description = "method=pld_estimate: this dataset cannot give one (the problem says why)")),
    security(("bearer" = [])))]
async fn example_privacy(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath((id, example)): ApiPath<(String, String)>,
    query: ApiQuery<ExamplePrivacyQuery>,
) -> ApiResult<Json<PrivacyView>> {
    // Authorise before any validation. A malformed example id is no example an
    // owner token lists (ids are below MAX_EXAMPLES), so owners get 403 for it and
    // only those who may read any example of the dataset learn that it is malformed.
    let example = example.parse::<u64>().map_err(|_| {
        Problem::bad_request(format!(
            "invalid path: example id {example:?} is not a number"
        ))
    });
    claims.authorize(Access::Example(&id, *example.as_ref().unwrap_or(&u64::MAX)))?;
    let example = example?;
    let q = query.parse()?;
    let query = ExampleQuery {
        estimate: parse_method(q.method.as_deref())? == ExampleMethod::PldEstimate,
        bounds: privacy_query(q.delta, q.conversion.as_deref())?,
    };
    let view = state
        .engine
        .example_privacy_as(&id, example, query, caller)
        .await?;
    metrics::counter!("dpledger_privacy_queries_total").increment(1);
    Ok(Json(view))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/worst-case", tag = "privacy",
    params(("dataset" = String, Path), PrivacyQuery),
    responses((status = 200, body = WorstCaseBounds), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem)), security(("bearer" = [])))]
async fn worst_case(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    query: ApiQuery<PrivacyQuery>,
) -> ApiResult<Json<WorstCaseBounds>> {
    claims.authorize(Access::View(&id))?;
    let q = query.parse()?;
    let query = privacy_query(q.delta, q.conversion.as_deref())?;
    Ok(Json(state.engine.worst_case_as(&id, query, caller).await?))
}

/// The dataset endpoints, merged into the main router.
pub fn routes() -> Router<Arc<AppState>> {
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
}

/// The dataset endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    create_dataset,
    list_datasets,
    get_dataset,
    archive_dataset,
    report_step,
    thresholds,
    refresh,
    example_privacy,
    worst_case
))]
pub struct DatasetApi;

//! Endpoints of DP releases: curators publish releases, set the release
//! budget, labels and policy; viewers read what was released, at no new cost.

use super::auth::{Access, Claims};
use super::extract::{ApiPath, ApiQuery, Auth, PassedOn, RawBody};
use super::idempotency::IdempotencyHeader;
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use super::task::run_to_completion;
use crate::engine::sharding::ChangeAnswer;
use crate::engine::{EngineError, ReleaseBook, ReleaseOutcome};
use crate::release::{
    BudgetRequest, BudgetRequestExt, BudgetStatus, LabelAssignment, Release, ReleasePolicy,
    ReleaseRequest,
};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
/// The answers of the release endpoints, defined once with the Rust client in
/// the workspace crate `dpledger-api`.
pub use dpledger_api::release::{LabelsView, PolicyView, ReleaseList};
use serde::Deserialize;
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

type S = State<Arc<AppState>>;

/// Most releases returned by one list request.
const MAX_LIST: usize = 1000;

/// Which releases to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReleaseListQuery {
    /// Most releases to return, newest first (default 20, at most 1000).
    pub limit: Option<usize>,
}

/// Set or remove the automatic release policy.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    /// The policy; `null` removes it.
    pub policy: Option<ReleasePolicy>,
}

#[utoipa::path(post, path = "/v1/datasets/{dataset}/releases", tag = "releases", params(("dataset" = String, Path)),
    request_body = ReleaseRequest,
    responses((status = 201, body = ReleaseOutcome), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem),
               (status = 409, body = Problem, description = "Over budget (the body's `budget` says the spend and the request), no budget set, no labels for by_group, a step in progress, or nothing to release yet")),
    security(("bearer" = [])))]
async fn create_release(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Response> {
    claims.authorize(Access::Curate(&id))?;
    let key = idempotency.key(body.bytes())?;
    let mut request: ReleaseRequest = body.json()?;
    if let Some(shards) = state.engine.sharded(&id, caller).await? {
        return changed(async move { shards.release(request, key).await }).await;
    }
    request.validate()?;
    let st = state.clone();
    let outcome =
        run_to_completion(async move { st.engine.release(&id, request, key).await }).await?;
    Ok((StatusCode::CREATED, Json(outcome)).into_response())
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/releases", tag = "releases",
    params(("dataset" = String, Path), ReleaseListQuery),
    responses((status = 200, body = ReleaseList), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem)), security(("bearer" = [])))]
async fn list_releases(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
    query: ApiQuery<ReleaseListQuery>,
) -> ApiResult<Json<ReleaseList>> {
    claims.authorize(Access::View(&id))?;
    let q = query.parse()?;
    let limit = q.limit.unwrap_or(20);
    if limit > MAX_LIST {
        return Err(
            Problem::bad_request(format!("limit {limit} is over {MAX_LIST}")).with_field("limit"),
        );
    }
    Ok(Json(state.engine.with_book(&id, |book| {
        ReleaseList {
            budget: book.budget,
            policy: book.policy.clone(),
            policy_error: policy_error_for(&claims, &id, book),
            releases: book
                .history
                .iter()
                .rev()
                .take(limit)
                .map(|r| (**r).clone())
                .collect(),
        }
    })?))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/releases/latest", tag = "releases", params(("dataset" = String, Path)),
    responses((status = 200, body = Release), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem, description = "No such dataset, or nothing released yet")),
    security(("bearer" = [])))]
async fn latest_release(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Release>> {
    claims.authorize(Access::View(&id))?;
    let latest = state
        .engine
        .with_book(&id, |book| book.history.last().cloned())?;
    let latest =
        latest.ok_or_else(|| Problem::not_found(format!("dataset {id:?} has no release yet")))?;
    metrics::counter!("dpledger_release_reads_total").increment(1);
    Ok(Json((*latest).clone()))
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/release-budget", tag = "releases", params(("dataset" = String, Path)),
    responses((status = 200, body = BudgetStatus), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem)), security(("bearer" = [])))]
async fn get_budget(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<BudgetStatus>> {
    claims.authorize(Access::View(&id))?;
    Ok(Json(state.engine.with_book(&id, |book| book.budget)?))
}

#[utoipa::path(put, path = "/v1/datasets/{dataset}/release-budget", tag = "releases", params(("dataset" = String, Path)),
    request_body = BudgetRequest,
    responses((status = 200, body = BudgetStatus), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem),
               (status = 409, body = Problem, description = "Below what is already spent, or the dataset is archived")),
    security(("bearer" = [])))]
async fn set_budget(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Response> {
    claims.authorize(Access::Curate(&id))?;
    let key = idempotency.key(body.bytes())?;
    let request: BudgetRequest = body.json()?;
    let rho = request.to_rho()?;
    if let Some(shards) = state.engine.sharded(&id, caller).await? {
        return changed(async move { shards.set_budget(rho, key).await }).await;
    }
    let st = state.clone();
    let budget =
        run_to_completion(async move { st.engine.set_release_budget(&id, rho, key).await }).await?;
    Ok(Json(budget).into_response())
}

#[utoipa::path(get, path = "/v1/datasets/{dataset}/release-policy", tag = "releases", params(("dataset" = String, Path)),
    responses((status = 200, body = PolicyView), (status = 401, body = Problem), (status = 403, body = Problem),
               (status = 404, body = Problem)), security(("bearer" = [])))]
async fn get_policy(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<PolicyView>> {
    claims.authorize(Access::View(&id))?;
    Ok(Json(state.engine.with_book(&id, |book| PolicyView {
        policy: book.policy.clone(),
        policy_error: policy_error_for(&claims, &id, book),
    })?))
}

#[utoipa::path(put, path = "/v1/datasets/{dataset}/release-policy", tag = "releases", params(("dataset" = String, Path)),
    request_body = PolicyUpdate,
    responses((status = 200, body = PolicyView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem),
               (status = 409, body = Problem, description = "The dataset is archived; or, sharded, the request has no statistics to merge across shards (gradient_descent quantiles, by_group without labels) or the nodes cannot mint their calls' credential (external identity provider)")),
    security(("bearer" = [])))]
async fn set_policy(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Response> {
    claims.authorize(Access::Curate(&id))?;
    let key = idempotency.key(body.bytes())?;
    let update: PolicyUpdate = body.json()?;
    if let Some(shards) = state.engine.sharded(&id, caller).await? {
        return changed(async move { shards.set_policy(update.policy, key).await }).await;
    }
    let st = state.clone();
    let policy =
        run_to_completion(
            async move { st.engine.set_release_policy(&id, update.policy, key).await },
        )
        .await?;
    Ok(Json(PolicyView {
        policy,
        policy_error: None,
    })
    .into_response())
}

#[utoipa::path(put, path = "/v1/datasets/{dataset}/labels", tag = "releases", params(("dataset" = String, Path)),
    request_body = LabelAssignment,
    responses((status = 200, body = LabelsView), (status = 400, body = Problem), (status = 401, body = Problem),
               (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn set_labels(
    State(state): S,
    Auth(claims): Auth,
    PassedOn(caller): PassedOn,
    ApiPath(id): ApiPath<String>,
    idempotency: IdempotencyHeader,
    body: RawBody,
) -> ApiResult<Response> {
    claims.authorize(Access::Curate(&id))?;
    let key = idempotency.key(body.bytes())?;
    let assignment: LabelAssignment = body.json()?;
    if let Some(shards) = state.engine.sharded(&id, caller).await? {
        return changed(async move { shards.set_labels(assignment, key).await }).await;
    }
    let st = state.clone();
    let groups =
        run_to_completion(async move { st.engine.set_labels(&id, assignment, key).await }).await?;
    Ok(Json(LabelsView { groups }).into_response())
}

/// A change of a sharded dataset, coordinated across its shards by the
/// engine and run to its end even if the caller goes (owners hold their
/// shards' writes until it is decided): `201` for what it created (a
/// release), else `200`, with the answer it stored under its key.
async fn changed<F>(change: F) -> ApiResult<Response>
where
    F: std::future::Future<Output = Result<ChangeAnswer, EngineError>> + Send + 'static,
{
    let answer = run_to_completion(change).await?;
    let status = if answer.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(answer.body)).into_response())
}

/// The release endpoints, merged into the main router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/datasets/{dataset}/releases",
            post(create_release).get(list_releases),
        )
        .route(
            "/v1/datasets/{dataset}/releases/latest",
            get(latest_release),
        )
        .route(
            "/v1/datasets/{dataset}/release-budget",
            get(get_budget).put(set_budget),
        )
        .route(
            "/v1/datasets/{dataset}/release-policy",
            get(get_policy).put(set_policy),
        )
        .route("/v1/datasets/{dataset}/labels", put(set_labels))
}

/// The release endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    create_release,
    list_releases,
    latest_release,
    get_budget,
    set_budget,
    get_policy,
    set_policy,
    set_labels
))]
pub struct ReleaseApi;

/// What `claims` may read of why the policy's latest release was refused: the
/// detail (which may count examples near their individual budget, a number that
/// depends on individual epsilons) only for those who may curate the dataset.
fn policy_error_for(claims: &Claims, dataset: &str, book: &ReleaseBook) -> Option<String> {
    let refusal = book.policy_error.as_ref()?;
    Some(if claims.authorize(Access::Curate(dataset)).is_ok() {
        refusal.detail.clone()
    } else {
        refusal.reason.to_string()
    })
}

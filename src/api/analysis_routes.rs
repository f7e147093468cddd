//! Thudi et al.'s data-dependent analysis over several runs: a curator or
//! admin of every run reads the whole analysis; the owner of an example in every
//! run reads that example's result; nobody else reads anything of it (it is
//! per-example data). Every number served is an estimate (`"guarantee": false`).

use super::auth::{Access, Claims, Role};
use super::extract::{ApiPath, ApiQuery, Auth};
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::accounting::data_dependent::{Analysis, ExampleView, Rounding};
use crate::engine::DataDependentRequest;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use dpledger_api::analysis::AnalysisQuery;
use std::sync::Arc;

type S = State<Arc<AppState>>;

/// The engine's request for the analysis `query` asks (for `example`, or
/// every example).
fn request(query: AnalysisQuery, example: Option<u64>) -> DataDependentRequest {
    DataDependentRequest {
        runs: query.runs,
        orders: query.alpha,
        holder: query.holder,
        delta: query.delta,
        conversion: query.conversion.unwrap_or_default(),
        rounding: Rounding {
            order_ratio: query.order_ratio.unwrap_or(Rounding::FAST.order_ratio),
            level_stride: query.level_stride.unwrap_or(Rounding::FAST.level_stride),
        },
        example,
    }
}

/// Refuse at once the roles that may never read any of it, whatever the query.
fn role_in(claims: &Claims, roles: &[Role]) -> ApiResult<()> {
    if claims.role == Role::Admin || roles.contains(&claims.role) {
        Ok(())
    } else {
        Err(Problem::forbidden(format!(
            "this {} token does not grant the data-dependent analysis (per-example data)",
            format!("{:?}", claims.role).to_lowercase()
        )))
    }
}

#[utoipa::path(get, path = "/v1/analyses/data-dependent", tag = "privacy", params(AnalysisQuery),
    description = "Seed 001's data-dependent per-instance RDP (Thudi et al., \"Gradients Look Alike\"): \
        the expected per-step leakage over the runs, composed with Hölder's inequality, for every example; \
        per-checkpoint contributions relative to the data-independent RDP (Figure 1) and the distribution \
        over examples (Figure 2), beside the data-independent and seed-000 per-instance epsilons. \
        An estimate from finitely many runs: `guarantee` is false. Needs curating every run.",
    responses((status = 200, body = Analysis),
              (status = 400, body = Problem, description = "Malformed query, fewer than 2 runs, a run named twice, an order, p or delta out of range"),
              (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem, description = "A run is not a dataset"),
              (status = 409, body = Problem, description = "The runs differ in configuration or steps, are not Poisson-sampled, a refresh misses an example, or a norm is not finite")),
    security(("bearer" = [])))]
async fn data_dependent_analysis(
    State(state): S,
    Auth(claims): Auth,
    query: ApiQuery<AnalysisQuery>,
) -> ApiResult<Json<Analysis>> {
    role_in(&claims, &[Role::Curator])?;
    for run in AnalysisQuery::run_ids(&query.param("runs").unwrap_or_default()) {
        claims.authorize(Access::Curate(&run))?;
    }
    let query = query.parse()?;
    Ok(Json(
        state.engine.data_dependent(request(query, None)).await?,
    ))
}

#[utoipa::path(get, path = "/v1/analyses/data-dependent/examples/{example}", tag = "privacy",
    params(("example" = u64, Path), AnalysisQuery),
    description = "One example's data-dependent result (see `/v1/analyses/data-dependent`), for its owner: \
        needs access to the example in every run. An estimate: `guarantee` is false.",
    responses((status = 200, body = ExampleView),
              (status = 400, body = Problem, description = "Malformed query, fewer than 2 runs, a run named twice, an order, p or delta out of range"),
              (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem, description = "A run is not a dataset, or no such example"),
              (status = 409, body = Problem, description = "The runs differ in configuration or steps, are not Poisson-sampled, a refresh misses an example, or a norm is not finite")),
    security(("bearer" = [])))]
async fn data_dependent_example(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(example): ApiPath<u64>,
    query: ApiQuery<AnalysisQuery>,
) -> ApiResult<Json<ExampleView>> {
    role_in(&claims, &[Role::Curator, Role::Owner])?;
    for run in AnalysisQuery::run_ids(&query.param("runs").unwrap_or_default()) {
        claims.authorize(Access::Example(&run, example))?;
    }
    let query = query.parse()?;
    let analysis = state
        .engine
        .data_dependent(request(query, Some(example)))
        .await?;
    analysis
        .example_view(example)
        .map(Json)
        .ok_or_else(|| Problem::not_found(format!("no example {example}")))
}

/// The analysis endpoints, merged into the main router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/analyses/data-dependent", get(data_dependent_analysis))
        .route(
            "/v1/analyses/data-dependent/examples/{example}",
            get(data_dependent_example),
        )
}

/// The analysis endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(data_dependent_analysis, data_dependent_example))]
pub struct AnalysisApi;

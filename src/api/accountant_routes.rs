//! Endpoints of the stateless accountant (`/v1/accountant/*`): RDP, epsilon,
//! noise calibration, comparison and schedules, computed off the async workers.
//! The requests and computations live in `engine::accountant`, shared with the CLI.

use super::auth::Access;
use super::extract::{Auth, RawBody};
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::engine::accountant::{
    CompareRequest, CompareResponse, Compute, EpsilonRequest, EpsilonResponse, NoiseRequest,
    NoiseResponse, RdpRequest, RdpResponse, ScheduleRequest, ScheduleResponse,
};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use std::sync::Arc;

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

/// The accountant endpoints, merged into the main router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/accountant/rdp", post(accountant_rdp))
        .route("/v1/accountant/epsilon", post(accountant_epsilon))
        .route("/v1/accountant/noise", post(accountant_noise))
        .route("/v1/accountant/compare", post(accountant_compare))
        .route("/v1/accountant/schedule", post(accountant_schedule))
}

/// The accountant endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    accountant_rdp,
    accountant_epsilon,
    accountant_noise,
    accountant_compare,
    accountant_schedule
))]
pub struct AccountantApi;

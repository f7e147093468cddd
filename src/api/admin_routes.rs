//! Server administration beyond creating datasets: what the service keeps where
//! (issue 16). Admin tokens only: the report names every dataset.

use super::auth::Access;
use super::extract::Auth;
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::engine::StorageReport;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

type S = State<Arc<AppState>>;

/// The log's size, each dataset's memory and snapshot age, the table cache: what
/// an operator watches on a service that runs for months. Measuring loads no
/// paged-out dataset; it scans the log's row headers once (`docs/snapshots.md`).
#[utoipa::path(get, path = "/v1/admin/storage", tag = "operations",
    responses((status = 200, body = StorageReport), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 503, body = Problem)), security(("bearer" = [])))]
async fn storage(State(state): S, Auth(claims): Auth) -> ApiResult<Json<StorageReport>> {
    claims.authorize(Access::Admin)?;
    Ok(Json(state.engine.storage_report().await?))
}

/// The administration routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/admin/storage", get(storage))
}

/// The administration endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(storage))]
pub struct AdminApi;

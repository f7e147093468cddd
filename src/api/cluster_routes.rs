//! Cluster mode's endpoints (`docs/cluster.md`): the cluster map
//! (`GET /v1/cluster`) and draining a node. Routing a dataset's request to
//! its owner is `routing.rs`.

use super::auth::Access;
use super::extract::{ApiPath, Auth};
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::engine::cluster::memory_free;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;

type S = State<Arc<AppState>>;

/// The cluster map's bodies, defined once with the Rust client in the
/// workspace crate `dpledger-api`.
pub use dpledger_api::cluster::{ClusterDatasetView, ClusterNodeView, ClusterView, DrainAnswer};

/// The cluster map: nodes, their liveness, and which node owns which dataset
/// at which epoch. Clients send a dataset's requests to its owner.
#[utoipa::path(get, path = "/v1/cluster", tag = "operations",
    responses((status = 200, body = ClusterView), (status = 401, body = Problem),
              (status = 503, body = Problem)), security(("bearer" = [])))]
async fn cluster_view(State(state): S, Auth(claims): Auth) -> ApiResult<Json<ClusterView>> {
    let Some(node) = state.engine.cluster() else {
        return Ok(Json(ClusterView {
            mode: "single".into(),
            node_id: "local".into(),
            lease_ttl_ms: None,
            nodes: vec![ClusterNodeView {
                node_id: "local".into(),
                advertise: None,
                alive: true,
                draining: false,
                heartbeat_age_ms: 0,
                memory_free_bytes: memory_free(),
                ledger_memory_bytes: Some(state.engine.ledger_memory_bytes()),
                datasets_owned: state.engine.dataset_ids().len() as u64,
            }],
            datasets: Vec::new(),
        }));
    };
    let ttl = node.config.lease_ttl.as_millis() as u64;
    let (nodes, leases) = node.view().await?;
    let live = |l: &crate::engine::cluster::Lease| l.owner.is_some() && l.expires_in_ms > 0;
    let nodes = nodes
        .into_iter()
        .map(|n| ClusterNodeView {
            datasets_owned: leases
                .iter()
                .filter(|l| live(l) && l.owner.as_deref() == Some(n.node_id.as_str()))
                .count() as u64,
            alive: (n.heartbeat_age_ms.max(0) as u64) < ttl,
            heartbeat_age_ms: n.heartbeat_age_ms.max(0) as u64,
            memory_free_bytes: n.memory_free.map(|m| m.max(0) as u64),
            ledger_memory_bytes: n.ledger_bytes.map(|m| m.max(0) as u64),
            draining: n.draining,
            advertise: Some(n.advertise),
            node_id: n.node_id,
        })
        .collect();
    let datasets = leases
        .iter()
        .filter(|l| claims.sees_dataset(&l.dataset))
        .map(|l| ClusterDatasetView {
            dataset: l.dataset.clone(),
            owner: l.owner.clone().filter(|_| live(l)),
            advertise: l.advertise.clone().filter(|_| live(l)),
            epoch: l.epoch,
            lease_expires_in_ms: l.expires_in_ms.max(0) as u64,
        })
        .collect();
    Ok(Json(ClusterView {
        mode: "cluster".into(),
        node_id: node.config.node_id.clone(),
        lease_ttl_ms: Some(ttl),
        nodes,
        datasets,
    }))
}

/// Ask a node to hand its datasets over one by one (each is snapshotted, its
/// lease released and taken by another node) and exit when it holds none:
/// `dpledger cluster drain NODE`, for rolling upgrades.
#[utoipa::path(post, path = "/v1/cluster/nodes/{node}/drain", tag = "operations",
    params(("node" = String, Path)),
    responses((status = 202, body = DrainAnswer), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem), (status = 409, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn drain(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<(StatusCode, Json<DrainAnswer>)> {
    claims.authorize(Access::Admin)?;
    let Some(node) = state.engine.cluster() else {
        return Err(Problem::conflict(
            "this server is not in cluster mode (serve --cluster): there is nothing to drain",
        ));
    };
    if !node.request_drain(&id).await? {
        return Err(Problem::not_found(format!("no cluster node {id:?}")));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(DrainAnswer {
            node_id: id,
            draining: true,
        }),
    ))
}

/// The cluster routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/cluster", get(cluster_view))
        .route("/v1/cluster/nodes/{node}/drain", post(drain))
}

/// The cluster endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(cluster_view, drain))]
pub struct ClusterApi;

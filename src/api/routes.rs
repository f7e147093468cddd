//! The whole HTTP service assembled: the router of every endpoint (each route
//! module contributes its part), the operational endpoints (health, readiness,
//! metrics, the OpenAPI document) and the conventions applied to the document.
//! Route modules never import this one, so there is no cycle between them.

use super::auth::Access;
use super::extract::Auth;
use super::problem::Problem;
use super::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use std::sync::Arc;
use utoipa::{OpenApi, ToSchema};

type S = State<Arc<AppState>>;

/// Liveness / readiness.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// "ok".
    pub status: String,
}

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

/// `/metrics` on the main listener needs an admin or metrics token: the gauges
/// name every dataset with a release and its groups. `--metrics-listen` serves
/// them without a token on a separate (private) address instead.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
              (status = 401, body = Problem), (status = 403, body = Problem)), security(("bearer" = [])))]
async fn metrics_endpoint(
    State(state): S,
    Auth(claims): Auth,
) -> Result<impl IntoResponse, Problem> {
    claims.authorize(Access::Metrics)?;
    Ok(render_metrics(state.metrics.as_ref()))
}

/// The Prometheus text exposition (empty when metrics are not installed).
/// The process-wide table cache's size and evictions, read when scraped (the
/// cache lives in the ledger layer, which records no metrics itself).
fn export_table_cache_metrics() {
    let s = crate::ledger::table_cache().stats();
    metrics::gauge!("dpledger_table_cache_bytes").set(s.bytes as f64);
    metrics::gauge!("dpledger_table_cache_bound_bytes").set(s.bound as f64);
    metrics::gauge!("dpledger_table_cache_tables").set(s.tables as f64);
    metrics::counter!("dpledger_table_cache_evictions_total").absolute(s.evictions);
    metrics::counter!("dpledger_table_cache_hits_total").absolute(s.hits);
    metrics::counter!("dpledger_table_cache_misses_total").absolute(s.misses);
}

fn render_metrics(
    handle: Option<&metrics_exporter_prometheus::PrometheusHandle>,
) -> impl IntoResponse {
    export_table_cache_metrics();
    crate::engine::export_estimate_cache();
    let body = handle.map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

/// The router of a separate metrics listener (`serve --metrics-listen`): only
/// `/metrics`, without a token. Bind it to an address only the scraper reaches.
pub fn metrics_router(handle: Option<metrics_exporter_prometheus::PrometheusHandle>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move { render_metrics(handle.as_ref()) }
            }),
        )
        .fallback(|| async { Problem::not_found("this listener serves only /metrics") })
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
                ("GET", &mut item.get),
                ("POST", &mut item.post),
                ("PUT", &mut item.put),
                ("DELETE", &mut item.delete),
                ("PATCH", &mut item.patch),
            ];
            for (method, op) in ops {
                let Some(op) = op else { continue };
                // Who may call it, from the one permission table.
                if let Some(endpoint) = super::permissions::endpoint(method, path) {
                    let sentence = super::permissions::openapi_sentence(endpoint.scope);
                    op.description = Some(match op.description.take() {
                        Some(d) if !d.is_empty() => format!("{d}\n\n{sentence}"),
                        _ => sentence,
                    });
                }
                if path.starts_with("/v1/datasets") && matches!(method, "POST" | "PUT") {
                    super::idempotency::document(op);
                }
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
                if path.starts_with("/v1/datasets") && matches!(method, "POST" | "PUT") {
                    responses.entry("503".into()).or_insert_with(|| {
                        RefOr::T(problem(
                            "Not acknowledged. `urn:dpledger:problem:outcome-unknown`: the \
                             store did not confirm the commit, so the change may or may not \
                             have been applied (retry with the same Idempotency-Key); any \
                             other type: nothing was applied",
                        ))
                    });
                    responses.entry("400".into()).or_insert_with(|| {
                        RefOr::T(problem(
                            "Malformed request; a malformed Idempotency-Key names the field \
                             `Idempotency-Key`",
                        ))
                    });
                    responses.entry("409".into()).or_insert_with(|| {
                        RefOr::T(problem(
                            "A conflict with the dataset's state, or the Idempotency-Key's \
                             change is still being applied \
                             (`urn:dpledger:problem:idempotency-key-in-use`)",
                        ))
                    });
                    responses.entry("422".into()).or_insert_with(|| {
                        RefOr::T(problem(
                            "The Idempotency-Key was used with a different request \
                             (`urn:dpledger:problem:idempotency-key-reused`)",
                        ))
                    });
                }
            }
        }
    }
}

/// The OpenAPI description of the service.
#[derive(OpenApi)]
#[openapi(
    info(title = "dpledger", description = "Per-instance Rényi-DP privacy accounting for DP-SGD training runs."),
    paths(healthz, readyz, metrics_endpoint, openapi_json),
    modifiers(&ApiConventions),
    tags((name = "datasets"), (name = "training"), (name = "privacy"), (name = "releases"), (name = "accountant"), (name = "operations"))
)]
pub struct ApiDoc;

/// The OpenAPI document as pretty JSON (what `dpledger openapi` writes).
pub fn openapi_document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.merge(super::dataset_routes::DatasetApi::openapi());
    doc.merge(super::accountant_routes::AccountantApi::openapi());
    doc.merge(super::release_routes::ReleaseApi::openapi());
    doc.merge(super::analysis_routes::AnalysisApi::openapi());
    doc.merge(super::admin_routes::AdminApi::openapi());
    doc.merge(super::cluster_routes::ClusterApi::openapi());
    utoipa::Modify::modify(&ApiConventions, &mut doc);
    doc.to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
        + "\n"
}

/// The router with every endpoint. The routes are wrapped as one service so that
/// [`super::bare_errors`] sees the router's own answers (405 with its `Allow`
/// header, which axum adds outside route layers) and turns them into problems.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .fallback_service(routes(state))
        .layer(axum::middleware::from_fn(
            super::bare_errors::problem_for_bare_errors,
        ))
        .layer(axum::middleware::from_fn(
            super::access_log::request_id_and_log,
        ))
}

fn routes(state: Arc<AppState>) -> Router {
    let limit = state.limits.max_body_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .route("/openapi.json", get(openapi_json))
        .merge(super::dataset_routes::routes())
        .merge(super::accountant_routes::routes())
        .merge(super::release_routes::routes())
        .merge(super::analysis_routes::routes())
        .merge(super::admin_routes::routes())
        .merge(super::cluster_routes::routes())
        .merge(super::cluster::routes())
        .merge(crate::dashboard::router())
        .fallback(|| async { Problem::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::routing::route_to_owner,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |req: &axum::http::Request<_>| {
                    // Method, route template and request id only: never the raw
                    // path (ids), headers (tokens) or bodies (epsilons).
                    let route = req
                        .extensions()
                        .get::<axum::extract::MatchedPath>()
                        .map_or("(unmatched)", |m| m.as_str());
                    let id = req
                        .extensions()
                        .get::<super::access_log::RequestId>()
                        .map_or("", |r| r.0.as_str());
                    tracing::info_span!("request", method = %req.method(), route, request_id = id)
                },
            ),
        )
        .layer(axum::middleware::from_fn(super::access_log::record_route))
        .with_state(state)
}

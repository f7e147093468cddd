//! Server administration beyond creating datasets: what the service keeps where,
//! and tokens minted and revoked over the API. Admin tokens only:
//! the report names every dataset, and a token is a credential.

use super::auth::{claims_for, parse_ttl, Access, Role};
use super::extract::{ApiPath, Auth, RawBody};
use super::problem::{ApiResult, Problem};
use super::state::AppState;
use crate::engine::StorageReport;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

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

/// A token to mint: what `dpledger token` takes, over the API, so that an
/// operator with an admin token needs no shell on the server (nor its secret).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintTokenRequest {
    /// `admin`, `curator`, `trainer`, `owner`, `viewer` or `metrics`.
    #[schema(value_type = String, example = "trainer")]
    pub role: Role,
    /// The dataset (required for every role but admin and metrics).
    #[serde(default)]
    pub dataset: Option<String>,
    /// Further datasets covered with the same role (several runs of one model).
    #[serde(default)]
    pub datasets: Option<Vec<String>>,
    /// Owner tokens: the example ids whose privacy the holder may read.
    #[serde(default)]
    pub examples: Option<Vec<u64>>,
    /// Lifetime, e.g. `30d`, `12h`, `15m`, `90s` (at least 1s; default 30d).
    #[serde(default)]
    pub ttl: Option<String>,
    /// Who the token is for (recorded in it, for audit; default: the minting
    /// admin's subject).
    #[serde(default)]
    pub subject: Option<String>,
}

/// A minted token. The token is shown once and never logged; keep its `jti`
/// to revoke it.
#[derive(Debug, Serialize, ToSchema)]
pub struct MintedToken {
    /// The bearer token.
    pub token: String,
    /// Its id, for `POST /v1/admin/tokens/{jti}/revoke`.
    pub jti: String,
    /// Its role.
    #[schema(value_type = String)]
    pub role: Role,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
}

/// A revocation's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RevokedToken {
    /// The revoked token id.
    pub jti: String,
    /// Always true: the id is on the revocation list (revoking twice is no error).
    pub revoked: bool,
    /// How long other server processes on the store may still accept it, in
    /// seconds (their `--revocation-reload`, this node's own setting).
    pub others_within_seconds: u64,
}

/// Longest `subject` accepted.
const MAX_SUBJECT_BYTES: usize = 256;

/// Mint a token with the server secret (not available when the server verifies
/// an external identity provider's tokens: 409).
#[utoipa::path(post, path = "/v1/admin/tokens", tag = "operations", request_body = MintTokenRequest,
    responses((status = 201, body = MintedToken), (status = 400, body = Problem),
              (status = 401, body = Problem), (status = 403, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn mint_token(
    State(state): S,
    Auth(claims): Auth,
    body: RawBody,
) -> ApiResult<(StatusCode, Json<MintedToken>)> {
    claims.authorize(Access::Admin)?;
    let request: MintTokenRequest = body.json()?;
    if !state.auth.can_mint() {
        return Err(Problem::conflict(
            "this server verifies an external identity provider's tokens and cannot mint",
        ));
    }
    let ttl_text = request.ttl.as_deref().unwrap_or("30d");
    let ttl = parse_ttl(ttl_text).map_err(|_| {
        Problem::bad_request(format!(
            "invalid ttl {ttl_text:?}: expected e.g. 30d, 12h, 15m, 90s"
        ))
        .with_field("ttl")
    })?;
    if ttl == 0 {
        return Err(Problem::bad_request(
            "invalid ttl: a token's lifetime must be at least 1s (a token with none is expired \
             when minted)",
        )
        .with_field("ttl"));
    }
    let mut datasets: Vec<String> = request.dataset.into_iter().collect();
    datasets.extend(request.datasets.unwrap_or_default());
    if let Some(bad) = datasets
        .iter()
        .find(|d| !crate::engine::valid_dataset_id(d))
    {
        return Err(Problem::bad_request(format!(
            "invalid dataset id {:?}: 1-64 characters of A-Z a-z 0-9 . _ -",
            bad.chars().take(80).collect::<String>()
        ))
        .with_field("dataset"));
    }
    let subject = request
        .subject
        .unwrap_or_else(|| format!("minted by {}", claims.sub));
    if subject.len() > MAX_SUBJECT_BYTES || subject.chars().any(char::is_control) {
        return Err(Problem::bad_request(format!(
            "invalid subject: at most {MAX_SUBJECT_BYTES} bytes, no control characters"
        ))
        .with_field("subject"));
    }
    let examples = request.examples.map(|e| e.into_iter().collect());
    let mut rest = datasets.into_iter();
    let field_of = |text: &str| {
        ["dataset", "examples", "ttl"]
            .into_iter()
            .find(|f| text.contains(&format!("--{f}")))
            .unwrap_or("role")
    };
    let bad = |e: anyhow::Error| {
        let text = e.to_string();
        Problem::bad_request(text.replace("--", "")).with_field(field_of(&text))
    };
    let minted = claims_for(&subject, request.role, rest.next(), examples, ttl).map_err(bad)?;
    let more: Vec<String> = rest.collect();
    let minted = if more.is_empty() {
        minted
    } else {
        minted.covering(more).map_err(bad)?
    };
    let token = state
        .auth
        .mint(&minted)
        .map_err(|e| Problem::internal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let jti = minted.jti.clone().unwrap_or_default();
    tracing::info!(%jti, role = ?minted.role, by = %claims.sub, "minted a token");
    Ok((
        StatusCode::CREATED,
        Json(MintedToken {
            token,
            jti,
            role: minted.role,
            exp: minted.exp,
            iat: minted.iat,
        }),
    ))
}

/// Revoke a token by its id: refused from then on by this server at once, and
/// by every other server process on the same store within its
/// `--revocation-reload` (docs/operations.md). Durable: kept in the store.
#[utoipa::path(post, path = "/v1/admin/tokens/{jti}/revoke", tag = "operations",
    params(("jti" = String, Path, description = "The token's id (its `jti` claim)")),
    responses((status = 200, body = RevokedToken), (status = 400, body = Problem),
              (status = 401, body = Problem), (status = 403, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn revoke_token(
    State(state): S,
    Auth(claims): Auth,
    ApiPath(jti): ApiPath<String>,
) -> ApiResult<Json<RevokedToken>> {
    claims.authorize(Access::Admin)?;
    state.engine.revoke_token(&jti).await?;
    state.auth.revocations().insert(jti.clone());
    tracing::info!(%jti, by = %claims.sub, "revoked a token");
    Ok(Json(RevokedToken {
        jti,
        revoked: true,
        others_within_seconds: state.limits.revocation_reload_seconds,
    }))
}

/// The administration routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/admin/storage", get(storage))
        .route("/v1/admin/tokens", post(mint_token))
        .route("/v1/admin/tokens/{jti}/revoke", post(revoke_token))
}

/// The administration endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(storage, mint_token, revoke_token))]
pub struct AdminApi;

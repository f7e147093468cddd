//! The HTTP service: thin axum handlers that authorise the exact object a request
//! touches, extract its input, call the [`crate::engine`] and answer; bearer-JWT
//! authorisation; RFC 9457 errors; the OpenAPI document.
//!
//! | file | its one job |
//! |---|---|
//! | `routes.rs` | the router and OpenAPI document assembled; operational endpoints |
//! | `dataset_routes.rs` | dataset, training and privacy-query endpoints |
//! | `release_routes.rs` | release endpoints (releases, budget, labels, policy) |
//! | `accountant_routes.rs` | the stateless accountant endpoints |
//! | `analysis_routes.rs` | Thudi et al.'s data-dependent analysis over several runs |
//! | `admin_routes.rs` | server administration: the storage report |
//! | `cluster_routes.rs` | cluster mode's endpoints: the map, drain |
//! | `routing.rs` | cluster mode's routing middleware: forwarding to owners or `503 not-owner`, placing creations |
//! | `cluster/` | node-to-node calls: the client, the engine's peers over it, the owners' side of the change protocol |
//! | `task.rs` | running a state change to completion when the client goes away |
//! | `state.rs` | what handlers share: the engine, the authorizer, limits, metrics |
//! | `extract.rs` | extractors that turn rejections into problems; raw bodies kept until authorised |
//! | `idempotency.rs` | the `Idempotency-Key` header, bound to a digest of its request |
//! | `auth.rs` | bearer tokens: verification, claims, roles and scopes |
//! | `permissions.rs` | the one table of which endpoint authorises which scope |
//! | `errors.rs` | the one mapping of domain errors to problem documents |
//! | `problem.rs` | the RFC 9457 problem document (a leaf: imports nothing else of `api`) |
//! | `bare_errors.rs` | middleware turning the router's own error answers (405, 404) into problems |
//! | `listener.rs` | the accept loop: header, body and idle timeouts, the connection limit, TLS |
//! | `access_log.rs` | request ids (`X-Request-Id`) and the access log (route templates, never raw paths) |
//!
//! Imports point one way: route modules use `task`, `extract`, `auth`, `state`
//! and `problem`; `routes` uses the route modules; nothing imports `routes`.

pub mod access_log;
mod accountant_routes;
mod admin_routes;
mod analysis_routes;
pub mod auth;
pub mod bare_errors;
mod cluster;
mod cluster_routes;
mod dataset_routes;
mod errors;
pub mod extract;
pub mod idempotency;
pub mod listener;
pub mod permissions;
pub mod problem;
mod release_routes;
pub mod routes;
mod routing;
pub mod state;
mod task;

pub use auth::{claims_for, parse_ttl, Authorizer, Role};
pub use cluster::HttpPeers;
pub use routes::{metrics_router, openapi_document, router};
pub use state::{AppState, Limits};

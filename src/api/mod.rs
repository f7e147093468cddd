//! The HTTP service: axum handlers, bearer-JWT authorisation, RFC 9457 errors and
//! the OpenAPI document.

pub mod accountant;
pub mod auth;
pub mod extract;
pub mod problem;
pub mod release_routes;
pub mod releases;
pub mod routes;
pub mod state;

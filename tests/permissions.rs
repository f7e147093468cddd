//! One table of permissions ([`dpledger::api::permissions`]) that the
//! server, the OpenAPI document and `docs/security.md` all follow. The server is
//! driven from the table: every endpoint, every role's token (plus no token and a
//! forged one), on the token's own dataset and another, for the owner's own
//! example and another.

mod common;
#[path = "common/permission_matrix.rs"]
mod permission_matrix;

use common::*;
use dpledger::api::permissions::{matrix_markdown, role_name, ENDPOINTS};
use permission_matrix::check_permission_matrix;
use serde_json::Value;

#[test]
fn the_server_enforces_the_permission_table() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    create_small_datasets(&server, &["d", "other"]);
    let token_of = |role| match role_name(role) {
        "admin" => admin.clone(),
        "metrics" => server.token("metrics", None, None),
        "owner" => server.token("owner", Some("d"), Some("3")),
        name => server.token(name, Some("d"), None),
    };
    check_permission_matrix(&server.url, &token_of, &admin);
}

/// `docs/security.md` holds the matrix generated from the table, verbatim.
#[test]
fn the_security_document_holds_the_permission_table() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let matrix = matrix_markdown();
    assert!(
        doc.contains(&matrix),
        "docs/security.md must contain the permission matrix exactly as generated:\n{matrix}"
    );
}

/// Every operation of the OpenAPI document is in the table, and says who may call it.
#[test]
fn the_openapi_document_follows_the_permission_table() {
    let doc: Value = serde_json::from_str(&dpledger::api::openapi_document()).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let method = method.to_uppercase();
            let endpoint = dpledger::api::permissions::endpoint(&method, path)
                .unwrap_or_else(|| panic!("{method} {path} is missing from the permission table"));
            let description = op["description"].as_str().unwrap_or("");
            assert!(
                description.contains(&dpledger::api::permissions::openapi_sentence(
                    endpoint.scope
                )),
                "{method} {path}: {description}"
            );
            operations += 1;
        }
    }
    assert_eq!(
        operations,
        ENDPOINTS.len(),
        "the table lists an endpoint the API lacks"
    );
}

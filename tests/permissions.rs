//! Issue 15.7: one table of permissions ([`dpledger::api::permissions`]) that the
//! server, the OpenAPI document and `docs/security.md` all follow. The server is
//! driven from the table: every endpoint, every role's token (plus no token and a
//! forged one), on the token's own dataset and another, for the owner's own
//! example and another.

mod common;

use common::*;
use dpledger::api::permissions::{allows, matrix_markdown, role_name, Scope, ENDPOINTS, ROLES};
use serde_json::{json, Value};

/// A request to `path` that the handler refuses *after* authorising (bad input or
/// a conflict), so that allowed callers change nothing; archive comes last.
fn harmless_body(method: &str, path: &str) -> Value {
    match (method, path) {
        ("POST", "/v1/datasets") => json!({"id": "c", "config": {"examples": 0}}),
        ("POST", p) if p.ends_with("/steps") => json!({"step": 999}),
        ("POST", p) if p.ends_with("/refresh") => json!({"ids": [999], "norms": [0.1]}),
        ("POST", p) if p.ends_with("/releases") => json!({}),
        ("PUT", p) if p.ends_with("/release-budget") => json!({}),
        ("PUT", p) if p.ends_with("/release-policy") => {
            json!({"policy": {"every_steps": 0, "request": {"mean": {"rho": 1}}}})
        }
        ("PUT", p) if p.ends_with("/labels") => json!({"ids": [999], "labels": ["x"]}),
        ("POST", p) if p.starts_with("/v1/accountant/") => json!({"orders": []}),
        _ => json!({}),
    }
}

fn send(method: &str, url: &str, token: Option<&str>, body: &Value) -> u16 {
    match method {
        "GET" => get(url, token).status,
        "POST" => post(url, token, body).status,
        "PUT" => put(url, token, body).status,
        other => panic!("no helper for {other}"),
    }
}

#[test]
fn the_server_enforces_the_permission_table() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    create_small_datasets(&server, &["d", "other"]);
    let token_of = |role| {
        let name = role_name(role);
        match name {
            "admin" => admin.clone(),
            "metrics" => server.token("metrics", None, None),
            "owner" => server.token("owner", Some("d"), Some("3")),
            _ => server.token(name, Some("d"), None),
        }
    };
    let forged = format!("{}x", &admin[..admin.len() - 1]);
    let mut endpoints: Vec<_> = ENDPOINTS.iter().collect();
    endpoints.sort_by_key(|e| e.path.ends_with("/archive"));
    let mut checked = 0;
    for e in endpoints {
        for (dataset, own_dataset) in [("d", true), ("other", false)] {
            for (example, own_example) in [(3, true), (4, false)] {
                let target = if e.query.is_empty() {
                    e.path.to_string()
                } else {
                    format!("{}?{}", e.path, e.query)
                };
                let path = target
                    .replace("{dataset}", dataset)
                    .replace("{example}", &example.to_string());
                let url = format!("{}{path}", server.url);
                let body = harmless_body(e.method, e.path);
                let ctx = format!("{} {path}", e.method);
                for role in ROLES {
                    let status = send(e.method, &url, Some(&token_of(role)), &body);
                    if allows(role, e.scope, own_dataset, own_example) {
                        assert!(
                            status != 401 && status != 403,
                            "{ctx}: {} was refused ({status})",
                            role_name(role)
                        );
                    } else {
                        assert_eq!(status, 403, "{ctx}: {} was not refused", role_name(role));
                    }
                    checked += 1;
                }
                for (who, token) in [("no token", None), ("forged", Some(forged.as_str()))] {
                    let status = send(e.method, &url, token, &body);
                    if e.scope == Scope::Public {
                        assert!(status < 400, "{ctx}: {who} got {status}");
                    } else {
                        assert_eq!(status, 401, "{ctx}: {who}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, ENDPOINTS.len() * 4 * (ROLES.len() + 2));
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

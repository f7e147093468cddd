//! The permission matrix driven against a running server, shared by
//! `tests/permissions.rs` (one node) and `tests/cluster_permissions.rs` (through a
//! node of a cluster that owns neither dataset, so that every dataset request is
//! forwarded and authorised by the owner): every endpoint of
//! [`dpledger::api::permissions::ENDPOINTS`], every role's token (plus no token
//! and a forged one), on the token's own dataset `d` and on `other`, for the
//! owner's own example (3) and another (4).
#![allow(dead_code)]

use crate::common::{get, post, put};
use dpledger::api::permissions::{allows, role_name, Scope, ENDPOINTS, ROLES};
use dpledger::api::Role;
use serde_json::{json, Value};

/// A request to `path` that the handler refuses *after* authorising (bad input or
/// a conflict), so that allowed callers change nothing; archive comes last.
pub fn harmless_body(method: &str, path: &str) -> Value {
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

/// Drives the whole matrix against the server at `base` (datasets `d` and
/// `other` exist there or behind it); `token_of` mints each role's reference
/// token (bound to `d`, an owner to example 3), `admin` is an admin token (a
/// forged token is made from it). Answers how many requests were checked.
pub fn check_permission_matrix(
    base: &str,
    token_of: &dyn Fn(Role) -> String,
    admin: &str,
) -> usize {
    let forged = format!("{}x", &admin[..admin.len() - 1]);
    let tokens: Vec<(Role, String)> = ROLES.iter().map(|&r| (r, token_of(r))).collect();
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
                let url = format!("{base}{path}");
                let body = harmless_body(e.method, e.path);
                let ctx = format!("{} {path}", e.method);
                for (role, token) in &tokens {
                    let status = send(e.method, &url, Some(token), &body);
                    if allows(*role, e.scope, own_dataset, own_example) {
                        assert!(
                            status != 401 && status != 403,
                            "{ctx}: {} was refused ({status})",
                            role_name(*role)
                        );
                    } else {
                        assert_eq!(status, 403, "{ctx}: {} was not refused", role_name(*role));
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
    checked
}

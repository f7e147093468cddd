//! Authorisation matrix: every endpoint × every role × own/other dataset
//! × own/other example. Refusals are 403 (401 without a valid token) and leak
//! nothing of the object in the body.

mod common;

use common::*;
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Nobody,
    Forged,
    Admin,
    Curator,
    Trainer,
    Owner,
    Viewer,
}

#[test]
fn every_endpoint_checks_the_exact_object() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    for id in ["a", "b"] {
        let r = post(
            &format!("{}/v1/datasets", server.url),
            Some(&admin),
            &json!({"id": id, "config": poisson_config(20, 0.5, 1.0)}),
        );
        assert_eq!(r.status, 201);
        let r = post(
            &format!("{}/v1/datasets/{id}/steps", server.url),
            Some(&admin),
            &json!({"step": 0, "ids": [3, 4], "norms": [0.2, 0.3]}),
        );
        assert_eq!(r.status, 200);
    }
    let tokens = [
        (Who::Nobody, None),
        (Who::Forged, Some(format!("{}x", &admin[..admin.len() - 1]))),
        (Who::Admin, Some(admin.clone())),
        (Who::Curator, Some(server.token("curator", Some("a"), None))),
        (Who::Trainer, Some(server.token("trainer", Some("a"), None))),
        (
            Who::Owner,
            Some(server.token("owner", Some("a"), Some("3"))),
        ),
        (Who::Viewer, Some(server.token("viewer", Some("a"), None))),
    ];
    // (name, method, path, body, who may, mutating-last)
    let allowed_train =
        |w: Who, own: bool| w == Who::Admin || (own && matches!(w, Who::Curator | Who::Trainer));
    let allowed_curate = |w: Who, own: bool| w == Who::Admin || (own && w == Who::Curator);
    let allowed_view =
        |w: Who, own: bool| w == Who::Admin || (own && !matches!(w, Who::Nobody | Who::Forged));
    let mut checked = 0;
    for (ds, own_ds) in [("a", true), ("b", false)] {
        for (ex, own_ex) in [(3u64, true), (4u64, false)] {
            for (who, token) in &tokens {
                let token = token.as_deref();
                let cases: Vec<(&str, Reply, bool)> = vec![
                    (
                        "status",
                        get(&format!("{}/v1/datasets/{ds}", server.url), token),
                        allowed_train(*who, own_ds),
                    ),
                    (
                        "step",
                        post(
                            &format!("{}/v1/datasets/{ds}/steps", server.url),
                            token,
                            &json!({"step": 999}),
                        ),
                        allowed_train(*who, own_ds),
                    ),
                    (
                        "thresholds",
                        get(
                            &format!("{}/v1/datasets/{ds}/thresholds?end=5", server.url),
                            token,
                        ),
                        allowed_train(*who, own_ds),
                    ),
                    (
                        "refresh",
                        post(
                            &format!("{}/v1/datasets/{ds}/refresh", server.url),
                            token,
                            &json!({"ids": [999], "norms": [0.1]}),
                        ),
                        allowed_train(*who, own_ds),
                    ),
                    (
                        "privacy",
                        get(
                            &format!("{}/v1/datasets/{ds}/examples/{ex}/privacy", server.url),
                            token,
                        ),
                        *who == Who::Admin
                            || (own_ds && (*who == Who::Curator || (*who == Who::Owner && own_ex))),
                    ),
                    (
                        "worst-case",
                        get(
                            &format!("{}/v1/datasets/{ds}/worst-case", server.url),
                            token,
                        ),
                        *who == Who::Admin || (own_ds && !matches!(who, Who::Nobody | Who::Forged)),
                    ),
                    (
                        "release",
                        post(
                            &format!("{}/v1/datasets/{ds}/releases", server.url),
                            token,
                            &json!({}),
                        ),
                        allowed_curate(*who, own_ds),
                    ),
                    (
                        "release-list",
                        get(&format!("{}/v1/datasets/{ds}/releases", server.url), token),
                        allowed_view(*who, own_ds),
                    ),
                    (
                        "release-latest",
                        get(
                            &format!("{}/v1/datasets/{ds}/releases/latest", server.url),
                            token,
                        ),
                        allowed_view(*who, own_ds),
                    ),
                    (
                        "budget",
                        get(
                            &format!("{}/v1/datasets/{ds}/release-budget", server.url),
                            token,
                        ),
                        allowed_view(*who, own_ds),
                    ),
                    (
                        "budget-set",
                        put(
                            &format!("{}/v1/datasets/{ds}/release-budget", server.url),
                            token,
                            &json!({}),
                        ),
                        allowed_curate(*who, own_ds),
                    ),
                    (
                        "policy",
                        get(
                            &format!("{}/v1/datasets/{ds}/release-policy", server.url),
                            token,
                        ),
                        allowed_view(*who, own_ds),
                    ),
                    (
                        "policy-set",
                        put(
                            &format!("{}/v1/datasets/{ds}/release-policy", server.url),
                            token,
                            &json!({"policy": {"every_steps": 0, "request": {"mean": {"rho": 1}}}}),
                        ),
                        allowed_curate(*who, own_ds),
                    ),
                    (
                        "labels",
                        put(
                            &format!("{}/v1/datasets/{ds}/labels", server.url),
                            token,
                            &json!({"ids": [999], "labels": ["x"]}),
                        ),
                        allowed_curate(*who, own_ds),
                    ),
                    (
                        "create",
                        post(
                            &format!("{}/v1/datasets", server.url),
                            token,
                            &json!({"id": "c", "config": {"examples": 0}}),
                        ),
                        *who == Who::Admin,
                    ),
                    (
                        "accountant",
                        post(
                            &format!("{}/v1/accountant/rdp", server.url),
                            token,
                            &json!({"sampling_rate": 0.1, "noise_multiplier": 1.0, "orders": [2]}),
                        ),
                        !matches!(who, Who::Nobody | Who::Forged),
                    ),
                ];
                for (name, reply, allowed) in cases {
                    checked += 1;
                    let ctx = format!(
                        "{name} as {who:?} on dataset {ds} example {ex}: {} {:?}",
                        reply.status, reply.body
                    );
                    if allowed {
                        assert!(reply.status != 401 && reply.status != 403, "refused: {ctx}");
                    } else {
                        let want = if matches!(who, Who::Nobody | Who::Forged) {
                            401
                        } else {
                            403
                        };
                        assert_eq!(reply.status, want, "{ctx}");
                        assert_eq!(reply.content_type, "application/problem+json", "{ctx}");
                        let text = reply.body.to_string();
                        for leak in ["epsilon", "thresholds", "rdp", "\"steps\""] {
                            assert!(!text.contains(leak), "body leaks {leak}: {ctx}");
                        }
                    }
                }
            }
        }
    }
    assert!(checked >= 200);
    // Listings show only what the token covers.
    let list =
        |t: &str| get(&format!("{}/v1/datasets", server.url), Some(t)).body["datasets"].clone();
    assert_eq!(list(&admin), json!(["a", "b"]));
    assert_eq!(list(tokens[4].1.as_deref().unwrap()), json!(["a"]));
    // Archive (mutating, so last): curator of a yes, trainer no, curator of a on b no.
    let curator = tokens[3].1.clone().unwrap();
    let trainer = tokens[4].1.clone().unwrap();
    assert_eq!(
        post(
            &format!("{}/v1/datasets/b/archive", server.url),
            Some(&curator),
            &json!({})
        )
        .status,
        403
    );
    assert_eq!(
        post(
            &format!("{}/v1/datasets/a/archive", server.url),
            Some(&trainer),
            &json!({})
        )
        .status,
        403
    );
    assert_eq!(
        post(
            &format!("{}/v1/datasets/a/archive", server.url),
            Some(&curator),
            &json!({})
        )
        .status,
        200
    );
}

/// A request is authorised before its query string or path is
/// validated, so a caller without access to the object learns nothing from
/// validation (403, never 400); one with access gets the 400 that says what was
/// wrong.
#[test]
fn queries_and_paths_are_validated_only_after_authorisation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    create_small_datasets(&server, &["a", "b"]);
    let viewer_a = server.token("viewer", Some("a"), None);
    let viewer_b = server.token("viewer", Some("b"), None);
    let trainer_a = server.token("trainer", Some("a"), None);
    let trainer_b = server.token("trainer", Some("b"), None);
    let curator_a = server.token("curator", Some("a"), None);
    let owner_a3 = server.token("owner", Some("a"), Some("3"));
    let url = |path: &str| format!("{}{path}", server.url);
    // (path on dataset a with a malformed query or path, token without access, token with access)
    let cases = [
        ("/v1/datasets/a/worst-case?delta=abc", &viewer_b, &viewer_a),
        ("/v1/datasets/a/worst-case?delta=2", &viewer_b, &viewer_a),
        (
            "/v1/datasets/a/thresholds?start=x&end=4",
            &trainer_b,
            &trainer_a,
        ),
        ("/v1/datasets/a/releases?limit=abc", &viewer_b, &viewer_a),
        (
            "/v1/datasets/a/examples/3/privacy?delta=abc",
            &viewer_b,
            &owner_a3,
        ),
        ("/v1/datasets/a/examples/abc/privacy", &owner_a3, &curator_a),
        (
            "/v1/datasets/a/examples/abc/privacy?delta=abc",
            &viewer_a,
            &curator_a,
        ),
    ];
    for (path, outsider, insider) in cases {
        let refused = get(&url(path), Some(outsider));
        assert_eq!(refused.status, 403, "{path}: {:?}", refused.body);
        assert_eq!(refused.content_type, "application/problem+json");
        let invalid = get(&url(path), Some(insider));
        assert_eq!(invalid.status, 400, "{path}: {:?}", invalid.body);
        assert!(
            invalid.body["detail"]
                .as_str()
                .unwrap_or("")
                .contains("invalid")
                || invalid.body["field"].is_string(),
            "{path}: {:?}",
            invalid.body
        );
    }
}

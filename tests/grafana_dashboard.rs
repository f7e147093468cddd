//! The provisioned Grafana dashboard (`docker/grafana/dashboards/dpledger.json`)
//! queries only metrics that the real server exports on `/metrics` once it has
//! applied steps, answered privacy and release reads, and made a release.

mod common;

use common::{get, poisson_config, post, put, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Every PromQL expression (panel targets and template-variable queries).
fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => expressions(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| expressions(x, out)),
        _ => {}
    }
}

/// Metric names (`dpledger_…`) an expression refers to.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("dpledger_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.insert(expr[start..end].to_string());
        i = end;
    }
    names
}

#[test]
fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker/grafana/dashboards/dpledger.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let wanted: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    assert!(wanted.len() >= 15, "{wanted:?}");
    for expected in [
        "dpledger_steps_total",
        "dpledger_norms_ingested_total",
        "dpledger_release_mean",
    ] {
        assert!(
            wanted.contains(expected),
            "{expected} missing from {wanted:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let url = &server.url;
    let created = post(
        &format!("{url}/v1/datasets"),
        Some(&admin),
        &json!({"id": "g", "config": poisson_config(20, 0.5, 1.0),
                "labels": (0..20).map(|i| if i % 2 == 0 { "even" } else { "odd" }).collect::<Vec<_>>()}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let policy =
        json!({"policy": {"every_steps": 1, "request": {"mean": {"rho": 1e-6}, "by_group": true}}});
    // A policy that cannot release (no budget yet) is refused, counted, and never fails a step.
    assert_eq!(
        put(
            &format!("{url}/v1/datasets/g/release-policy"),
            Some(&admin),
            &policy
        )
        .status,
        200
    );
    let step = |t: u64| {
        let r = post(
            &format!("{url}/v1/datasets/g/steps"),
            Some(&admin),
            &json!({"step": t, "ids": [0, 1, 2], "norms": [0.1, 0.5, 2.0]}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    };
    step(0);
    let budget = put(
        &format!("{url}/v1/datasets/g/release-budget"),
        Some(&admin),
        &json!({"rho": 1.0}),
    );
    assert_eq!(budget.status, 200, "{:?}", budget.body);
    let release = post(
        &format!("{url}/v1/datasets/g/releases"),
        Some(&admin),
        &json!({"mean": {"rho": 1e-4}, "quantiles": {"rho": 1e-4, "levels": [0.5]},
                "histogram": {"rho": 1e-4, "bins": 4}}),
    );
    assert_eq!(release.status, 201, "{:?}", release.body);
    step(1);
    assert_eq!(
        get(
            &format!("{url}/v1/datasets/g/examples/1/privacy"),
            Some(&admin)
        )
        .status,
        200
    );
    assert_eq!(
        get(
            &format!("{url}/v1/datasets/g/releases/latest"),
            Some(&admin)
        )
        .status,
        200
    );

    let scraper = server.token("metrics", None, None);
    let text = ureq::get(&format!("{url}/metrics"))
        .set("Authorization", &format!("Bearer {scraper}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<_> = wanted
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried but not exported: {missing:?}\n{text}"
    );
}

#[test]
fn the_dashboard_page_is_served_with_a_strict_policy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    for (path, ty) in [
        ("/dashboard", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/uPlot.iife.min.js", "text/javascript"),
        ("/dashboard/uPlot.min.css", "text/css"),
        ("/dashboard/uPlot-LICENSE.txt", "text/plain"),
    ] {
        let r = ureq::get(&format!("{}{path}", server.url)).call().unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.header("content-type").unwrap().starts_with(ty), "{path}");
        let csp = r.header("content-security-policy").unwrap().to_string();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
            "{csp}"
        );
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        let body = r.into_string().unwrap();
        assert!(body.len() > 100, "{path}");
    }
    let missing = get(&format!("{}/dashboard/nope.js", server.url), None);
    assert_eq!(missing.status, 404);
}

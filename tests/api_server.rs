//! Integration tests of the HTTP service against the real binary.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::process::Command;

/// A deterministic training trace in `dpledger replay` format, plus the JSON step
/// bodies to send.
struct Trace {
    lines: Vec<Value>,
}

fn make_trace(n: u64, q: f64, sigma: f64, steps: u64, seed: u64) -> Trace {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut lines = vec![
        json!({"dataset": {"examples": n, "max_grad_norm": 1.0, "rounding": 0.01,
        "noise_multiplier": sigma, "sampling_rate": q}}),
    ];
    for t in 0..steps {
        if t == steps / 2 {
            let ids: Vec<u64> = (0..n).collect();
            let norms: Vec<f64> = ids.iter().map(|i| 0.05 + (*i % 7) as f64 * 0.1).collect();
            lines.push(json!({"refresh": {"ids": ids, "norms": norms}}));
        }
        let mut ids = Vec::new();
        let mut norms = Vec::new();
        for i in 0..n {
            if rng.random::<f64>() < q {
                ids.push(i);
                norms.push(match i % 5 {
                    0 => 1.0,                  // exactly C
                    1 => 0.0,                  // exactly 0
                    2 => 3.7,                  // above C
                    3 => 0.25 * (1.0 + 1e-12), // just above a bucket edge
                    _ => rng.random::<f64>() * 1.2,
                });
            }
        }
        let mut line = json!({"step": t, "ids": ids, "norms": norms});
        if t >= steps * 3 / 4 {
            line["noise_multiplier"] = json!(sigma * 0.8); // a schedule change
        }
        lines.push(line);
    }
    Trace { lines }
}

fn create(server: &Server, admin: &str, id: &str, config: Value) -> Reply {
    post(
        &format!("{}/v1/datasets", server.url),
        Some(admin),
        &json!({"id": id, "config": config}),
    )
}

#[test]
fn full_run_matches_offline_replay_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    let (n, q, sigma) = (120u64, 0.08, 1.0);
    let r = create(&server, &admin, "run1", poisson_config(n, q, sigma));
    assert_eq!(r.status, 201, "{:?}", r.body);
    let trainer = server.token("trainer", Some("run1"), None);
    let trace = make_trace(n, q, sigma, 80, 7);
    for line in &trace.lines[1..] {
        let r = if let Some(refresh) = line.get("refresh") {
            post(
                &format!("{}/v1/datasets/run1/refresh", server.url),
                Some(&trainer),
                refresh,
            )
        } else {
            post(
                &format!("{}/v1/datasets/run1/steps", server.url),
                Some(&trainer),
                line,
            )
        };
        assert_eq!(r.status, 200, "{line}: {:?}", r.body);
    }
    let path = dir.path().join("trace.jsonl");
    let text: String = trace.lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let offline = replay(&path, 1e-5);
    let check = |server: &Server| {
        let curator = server.token("curator", Some("run1"), None);
        assert_served_matches_replay(server, "run1", &curator, &offline, 1e-5);
    };
    check(&server);
    // An owner sees exactly its own example.
    let owner = server.token("owner", Some("run1"), Some("7"));
    let mine = get(
        &format!("{}/v1/datasets/run1/examples/7/privacy", server.url),
        Some(&owner),
    );
    assert_eq!(mine.status, 200);
    let other = get(
        &format!("{}/v1/datasets/run1/examples/8/privacy", server.url),
        Some(&owner),
    );
    assert_eq!(other.status, 403);
    assert!(
        other.body.get("example").is_none(),
        "403 body leaks: {:?}",
        other.body
    );
    // SIGKILL and restart: everything acknowledged is still there.
    server.restart();
    check(&server);
    let status = get(&format!("{}/v1/datasets/run1", server.url), Some(&admin));
    assert_eq!(status.body["status"]["steps"], 80);
}

#[test]
fn retries_gaps_and_bad_input_are_answered_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    assert_eq!(
        create(&server, &admin, "d", poisson_config(10, 0.5, 1.0)).status,
        201
    );
    let steps = format!("{}/v1/datasets/d/steps", server.url);
    let first = post(
        &steps,
        Some(&admin),
        &json!({"step": 0, "ids": [1, 2], "norms": [0.5, 2.0]}),
    );
    assert_eq!(first.status, 200);
    assert_eq!(first.body["thresholds"], json!([0.5, 1.0]));
    // Retry: same answer, nothing changes.
    let again = post(
        &steps,
        Some(&admin),
        &json!({"step": 0, "ids": [1, 2], "norms": [0.5, 2.0]}),
    );
    assert_eq!(again.status, 200);
    assert_eq!(again.body["duplicate"], true);
    assert_eq!(again.body["thresholds"], first.body["thresholds"]);
    // Different content for an applied step: conflict.
    let conflict = post(
        &steps,
        Some(&admin),
        &json!({"step": 0, "ids": [1], "norms": [0.5]}),
    );
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.content_type, "application/problem+json");
    // A gap is refused.
    let gap = post(
        &steps,
        Some(&admin),
        &json!({"step": 5, "ids": [], "norms": []}),
    );
    assert_eq!(gap.status, 409);
    assert!(
        gap.body["detail"]
            .as_str()
            .unwrap()
            .contains("expects step 1"),
        "{:?}",
        gap.body
    );
    // Bad input names the field and changes nothing.
    for (body, field) in [
        (json!({"step": 1, "ids": [1], "norms": [-1.0]}), "norms"),
        (json!({"step": 1, "ids": [99], "norms": [0.1]}), "ids"),
        (
            json!({"step": 1, "ids": [1, 1], "norms": [0.1, 0.2]}),
            "ids",
        ),
        (json!({"step": 1, "ids": [1], "norms": [0.1, 0.2]}), "norms"),
        (
            json!({"step": 1, "ids": [], "norms": [], "sampling_rate": 1.5}),
            "sampling_rate",
        ),
        (
            json!({"step": 1, "ids": [], "norms": [], "noise_multiplier": 0.0}),
            "noise_multiplier",
        ),
    ] {
        let r = post(&steps, Some(&admin), &body);
        assert_eq!(r.status, 400, "{body}: {:?}", r.body);
        assert_eq!(r.content_type, "application/problem+json");
        assert!(
            r.body["field"].as_str().unwrap_or("").contains(field),
            "{body}: {:?}",
            r.body
        );
    }
    let unknown = post(&steps, Some(&admin), &json!({"step": 1, "idz": []}));
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.body["detail"].as_str().unwrap().contains("idz"),
        "{:?}",
        unknown.body
    );
    let garbage = post_raw(&steps, Some(&admin), "application/json", b"{not json");
    assert_eq!(garbage.status, 400);
    assert_eq!(garbage.content_type, "application/problem+json");
    let binary_garbage = post_raw(
        &steps,
        Some(&admin),
        "application/octet-stream",
        b"DPLS\x09garbage",
    );
    assert_eq!(binary_garbage.status, 400);
    // After all that, the ledger is still at step 1.
    let status = get(&format!("{}/v1/datasets/d", server.url), Some(&admin));
    assert_eq!(status.body["status"]["steps"], 1);
    // Unknown dataset and endpoint: 404 problems.
    assert_eq!(
        get(&format!("{}/v1/datasets/nope", server.url), Some(&admin)).status,
        404
    );
    assert_eq!(
        get(&format!("{}/v1/nothing", server.url), Some(&admin)).status,
        404
    );
}

#[test]
fn large_binary_report_and_archive() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    assert_eq!(
        create(&server, &admin, "big", poisson_config(200_000, 0.5, 1.0)).status,
        201
    );
    let ids: Vec<u64> = (0..100_000u64).map(|i| i * 2).collect();
    let norms: Vec<f64> = ids.iter().map(|i| (*i % 1000) as f64 / 700.0).collect();
    let payload = dpledger::store::codec::StepPayload {
        step: 0,
        part: None,
        noise_multiplier: None,
        sampling_rate: None,
        ids: ids.clone(),
        norms: norms.clone(),
    };
    let r = post_raw(
        &format!("{}/v1/datasets/big/steps", server.url),
        Some(&admin),
        "application/octet-stream",
        &payload.encode(),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let thresholds = r.body["thresholds"].as_array().unwrap();
    assert_eq!(thresholds.len(), 100_000);
    for (t, g) in thresholds.iter().zip(&norms) {
        assert!(t.as_f64().unwrap() >= g.min(1.0), "threshold below norm");
    }
    let range = get(
        &format!("{}/v1/datasets/big/thresholds?start=0&end=4", server.url),
        Some(&admin),
    );
    assert_eq!(range.status, 200);
    assert_eq!(range.body["thresholds"].as_array().unwrap().len(), 4);
    assert_eq!(range.body["thresholds"][1], 1.0); // id 1 never reported: threshold C
    let archived = post(
        &format!("{}/v1/datasets/big/archive", server.url),
        Some(&admin),
        &json!({}),
    );
    assert_eq!(archived.status, 200);
    assert_eq!(archived.body["archived"], true);
    let refused = post(
        &format!("{}/v1/datasets/big/steps", server.url),
        Some(&admin),
        &json!({"step": 1}),
    );
    assert_eq!(refused.status, 409);
    // Reads still work.
    assert_eq!(
        get(
            &format!("{}/v1/datasets/big/worst-case", server.url),
            Some(&admin)
        )
        .status,
        200
    );
}

#[test]
fn stateless_accountant_matches_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let viewer = server.token("viewer", Some("anything"), None);
    let r = post(
        &format!("{}/v1/accountant/epsilon", server.url),
        Some(&viewer),
        &json!({"sampling_rate": 0.01, "noise_multiplier": 1.1, "steps": 10000, "delta": 1e-5}),
    );
    assert_eq!(r.status, 200);
    let cli = Command::new(binary())
        .args([
            "epsilon",
            "--sampling-rate",
            "0.01",
            "--noise-multiplier",
            "1.1",
            "--steps",
            "10000",
            "--delta",
            "1e-5",
            "--json",
        ])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(r.body, cli);
    // Both default to the tightest method, as the served worst case does.
    assert_eq!(r.body["method"], "pld");
    let bad = post(
        &format!("{}/v1/accountant/rdp", server.url),
        Some(&viewer),
        &json!({"sampling_rate": 2, "noise_multiplier": 1}),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["field"], "sampling_rate");
    assert_eq!(
        post(
            &format!("{}/v1/accountant/rdp", server.url),
            None,
            &json!({})
        )
        .status,
        401
    );
    for path in ["healthz", "readyz"] {
        assert_eq!(get(&format!("{}/{path}", server.url), None).status, 200);
    }
    assert_eq!(
        get(&format!("{}/openapi.json", server.url), None).body["info"]["title"],
        "dpledger"
    );
}

#[test]
fn a_stale_process_reloads_from_the_log_instead_of_double_applying() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(dir.path(), None);
    let admin = a.admin_token();
    assert_eq!(
        create(&a, &admin, "shared", poisson_config(10, 0.5, 1.0)).status,
        201
    );
    // B recovers the dataset at step 0, then A moves on without B knowing. B
    // cannot share A's data directory (one server per data directory), so it
    // has its own, with A's secret, and names A's store explicitly.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("secret"), other.path().join("secret")).unwrap();
    let store = format!("sqlite:{}", dir.path().join("dpledger.sqlite").display());
    let b = Server::start(other.path(), Some(&store));
    let step0 = json!({"step": 0, "ids": [1, 2], "norms": [0.5, 2.0]});
    let on_a = post(
        &format!("{}/v1/datasets/shared/steps", a.url),
        Some(&admin),
        &step0,
    );
    assert_eq!(on_a.status, 200);
    assert_eq!(on_a.body["duplicate"], false);
    // The same step sent to B: the store refuses a second copy, B reloads, and the
    // report is answered as the retry it is.
    let on_b = post(
        &format!("{}/v1/datasets/shared/steps", b.url),
        Some(&admin),
        &step0,
    );
    assert_eq!(on_b.status, 200, "{:?}", on_b.body);
    assert_eq!(on_b.body["duplicate"], true);
    assert_eq!(on_b.body["thresholds"], on_a.body["thresholds"]);
    // Different content for that step is a conflict, not a second application.
    let different = post(
        &format!("{}/v1/datasets/shared/steps", b.url),
        Some(&admin),
        &json!({"step": 0, "ids": [3], "norms": [0.1]}),
    );
    assert_eq!(different.status, 409);
    // B is now current: it applies step 1; its view of example 1 equals A's reload.
    let step1 = json!({"step": 1, "ids": [1], "norms": [0.2]});
    assert_eq!(
        post(
            &format!("{}/v1/datasets/shared/steps", b.url),
            Some(&admin),
            &step1
        )
        .status,
        200
    );
    let status = get(&format!("{}/v1/datasets/shared", b.url), Some(&admin));
    assert_eq!(status.body["status"]["steps"], 2);
}

/// Answers the router writes by itself (405 for a known path with a
/// method it does not serve, 404 for an unknown path) are problem documents too.
#[test]
fn every_error_is_a_problem_document() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    assert_eq!(
        create(&server, &admin, "d", poisson_config(10, 0.5, 1.0)).status,
        201
    );
    let send = |method: &str, path: &str| {
        let answer = ureq::request(method, &format!("{}{path}", server.url))
            .set("Authorization", &format!("Bearer {admin}"))
            .call();
        let response = match answer {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("transport error: {e}"),
        };
        let status = response.status();
        let content_type = response.header("content-type").unwrap_or("").to_string();
        let allow = response.header("allow").map(String::from);
        let body: Value =
            serde_json::from_str(&response.into_string().unwrap()).unwrap_or(Value::Null);
        (status, content_type, allow, body)
    };
    for (method, path, status) in [
        ("DELETE", "/v1/datasets/d", 405),
        ("PATCH", "/v1/datasets/d/labels", 405),
        ("PUT", "/v1/datasets/d/steps", 405),
        ("GET", "/v1/no-such-thing", 404),
        ("GET", "/v1/datasets/d/nope", 404),
    ] {
        let (got, content_type, allow, body) = send(method, path);
        assert_eq!(got, status, "{method} {path}: {body}");
        assert_eq!(content_type, "application/problem+json", "{method} {path}");
        assert_eq!(body["status"], status, "{method} {path}: {body}");
        let detail = body["detail"].as_str().unwrap_or("");
        assert!(!detail.is_empty(), "{method} {path}: {body}");
        assert!(body["type"]
            .as_str()
            .unwrap_or("")
            .starts_with("urn:dpledger:problem:"));
        if status == 405 {
            let allow = allow.expect("405 keeps its Allow header");
            assert!(detail.contains(method), "{detail}");
            assert!(detail.contains(&allow), "{detail} vs {allow}");
        }
    }
}

/// `/metrics` names every dataset with a release and its groups, so
/// on the main listener it needs an admin or a metrics token (a metrics token can
/// do nothing else); `--metrics-listen` serves it without a token on a separate
/// address meant only for the scraper.
#[test]
fn metrics_need_a_token_unless_served_on_their_own_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (server, printed) = Server::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"], 1);
    let admin = server.admin_token();
    assert_eq!(
        create(&server, &admin, "d", poisson_config(10, 0.5, 1.0)).status,
        201
    );
    let metrics = format!("{}/metrics", server.url);
    let anonymous = get(&metrics, None);
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.content_type, "application/problem+json");
    let viewer = server.token("viewer", Some("d"), None);
    assert_eq!(get(&metrics, Some(&viewer)).status, 403);
    let scraper = server.token("metrics", None, None);
    let scrape = |token: Option<&str>, url: &str| {
        let mut req = ureq::get(url);
        if let Some(t) = token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let r = req.call().expect("metrics answer 200");
        (r.status(), r.into_string().unwrap())
    };
    let (status, text) = scrape(Some(&scraper), &metrics);
    assert_eq!(status, 200);
    assert!(text.contains("dpledger_"), "{text}");
    assert_eq!(scrape(Some(&admin), &metrics).0, 200);
    // A metrics token reads nothing else, not even the stateless accountant.
    assert_eq!(
        get(
            &format!("{}/v1/datasets/d/worst-case", server.url),
            Some(&scraper)
        )
        .status,
        403
    );
    assert_eq!(
        post(
            &format!("{}/v1/accountant/epsilon", server.url),
            Some(&scraper),
            &json!({"events": [{"sampling_rate": 0.1, "noise_multiplier": 1.0, "steps": 10}], "delta": 1e-5})
        )
        .status,
        403
    );
    // The separate listener serves the same exposition without a token, and only it.
    let address = printed[0]
        .strip_prefix("dpledger metrics on ")
        .expect("the metrics address is printed");
    let (status, open_text) = scrape(None, address);
    assert_eq!(status, 200);
    assert!(open_text.contains("dpledger_"), "{open_text}");
    let other = get(
        &address.replace("/metrics", "/v1/datasets/d/worst-case"),
        Some(&admin),
    );
    assert_eq!(other.status, 404);
}

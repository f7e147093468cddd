//! Thudi et al.'s data-dependent analysis served over HTTP, against a real
//! server: it agrees with `dpledger data-dependent` on the same traces (rounded
//! and exact), owners read only their own example, viewers, trainers and
//! curators of only some runs nothing, and every refusal is a 4xx problem.

mod common;

use common::analysis_runs::{assert_same_numbers, run_requests};
use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

const N: u64 = 12;
const STEPS: u64 = 6;
const CHECKPOINT_EVERY: u64 = 2;

/// One run: trace lines sent to the server (refreshes every `CHECKPOINT_EVERY`
/// steps, Poisson batches), written beside as a trace file.
fn run(server: &Server, admin: &str, dir: &Path, id: &str, seed: u64) -> PathBuf {
    make_run(
        server,
        admin,
        dir,
        id,
        seed,
        poisson_config(N, 0.25, 1.0),
        STEPS,
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn make_run(
    server: &Server,
    admin: &str,
    dir: &Path,
    id: &str,
    seed: u64,
    config: Value,
    steps: u64,
    skip_in_refresh: Option<u64>,
) -> PathBuf {
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(admin),
        &json!({"id": id, "config": config}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let path = dir.join(format!("{id}.jsonl"));
    let mut trace = std::fs::File::create(&path).unwrap();
    let n = config["examples"].as_u64().unwrap();
    let q = config["sampling"]["rate"].as_f64().unwrap_or(0.25);
    writeln!(
        trace,
        "{}",
        json!({"dataset": {"examples": n, "max_grad_norm": config["max_grad_norm"],
                "rounding": config["rounding"], "noise_multiplier": config["noise_multiplier"],
                "sampling_rate": q}})
    )
    .unwrap();
    for (what, body) in run_requests(seed, n, q, steps, CHECKPOINT_EVERY, skip_in_refresh) {
        let r = post(
            &format!("{}/v1/datasets/{id}/{what}", server.url),
            Some(admin),
            &body,
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        match what {
            "refresh" => writeln!(trace, "{}", json!({ "refresh": body })).unwrap(),
            _ => writeln!(trace, "{body}").unwrap(),
        }
    }
    path
}

fn cli(traces: &[PathBuf], extra: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(binary());
    cmd.args(["data-dependent", "--json", "--delta", "1e-5"]);
    for t in traces {
        cmd.arg("--trace").arg(t);
    }
    cmd.args(extra);
    json_output(&mut cmd)
}

fn analysis_url(server: &Server, runs: &str, extra: &str) -> String {
    format!(
        "{}/v1/analyses/data-dependent?runs={runs}&delta=1e-5{extra}",
        server.url
    )
}

fn example_url(server: &Server, id: u64, runs: &str) -> String {
    format!(
        "{}/v1/analyses/data-dependent/examples/{id}?runs={runs}&delta=1e-5",
        server.url
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    server: Server,
    admin: String,
    traces: Vec<PathBuf>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), None);
    let admin = server.admin_token();
    let traces = ["r1", "r2", "r3"]
        .iter()
        .enumerate()
        .map(|(i, id)| run(&server, &admin, dir.path(), id, 100 + i as u64))
        .collect();
    Setup {
        _dir: dir,
        server,
        admin,
        traces,
    }
}

#[test]
fn http_analysis_agrees_with_the_cli_on_the_same_traces() {
    let s = setup();
    for (query, flags) in [("", vec![]), ("&order_ratio=1", vec!["--exact"])] {
        let r = get(&analysis_url(&s.server, "r1,r2,r3", query), Some(&s.admin));
        assert_eq!(r.status, 200, "{:?}", r.body);
        let served = r.body;
        assert_eq!(served["guarantee"], false);
        assert_eq!(served["runs"], 3);
        assert_eq!(served["steps"], STEPS);
        assert_eq!(served["datasets"], json!(["r1", "r2", "r3"]));
        assert_eq!(served["examples"].as_array().unwrap().len(), N as usize);
        let offline = cli(&s.traces, &flags);
        assert_same_numbers(&served, &offline, 1e-12, Some(&["datasets"]), "analysis");
        // Seed-000 per-instance epsilons are the served ones.
        for run in ["r1", "r2", "r3"] {
            let p = get(
                &format!(
                    "{}/v1/datasets/{run}/examples/5/privacy?delta=1e-5",
                    s.server.url
                ),
                Some(&s.admin),
            );
            let k = ["r1", "r2", "r3"].iter().position(|x| *x == run).unwrap();
            // The per-example value a release reads: the estimate (sampled
            // protocol), capped by the PLD worst case.
            let estimate = p.body["example"]["rdp_epsilon"].as_f64().unwrap();
            let cap = p.body["example"]["worst_case_pld_epsilon"]
                .as_f64()
                .unwrap();
            assert_eq!(
                served["examples"][5]["per_instance_epsilon"][k].as_f64(),
                Some(estimate.min(cap))
            );
        }

        assert_eq!(
            served["intervals"].as_array().unwrap().len(),
            (STEPS / CHECKPOINT_EVERY) as usize
        );
    }
    // The rounded analysis is never below the exact one.
    let fast = get(&analysis_url(&s.server, "r1,r2,r3", ""), Some(&s.admin)).body;
    let exact = get(
        &analysis_url(&s.server, "r1,r2,r3", "&order_ratio=1"),
        Some(&s.admin),
    )
    .body;
    for (f, x) in fast["examples"]
        .as_array()
        .unwrap()
        .iter()
        .zip(exact["examples"].as_array().unwrap())
    {
        assert!(f["epsilon"].as_f64().unwrap() >= x["epsilon"].as_f64().unwrap() * (1.0 - 1e-12));
    }
}

#[test]
fn only_curators_of_every_run_and_owners_of_the_example_read_it() {
    let s = setup();
    let url = analysis_url(&s.server, "r1,r2,r3", "");
    let all = s.server.token_for("curator", &["r1", "r2", "r3"], None);
    let full = get(&url, Some(&all));
    assert_eq!(full.status, 200, "{:?}", full.body);
    let owner = s.server.token_for("owner", &["r1", "r2", "r3"], Some("7"));
    let mine = get(&example_url(&s.server, 7, "r1,r2,r3"), Some(&owner));
    assert_eq!(mine.status, 200, "{:?}", mine.body);
    assert_eq!(mine.body["guarantee"], false);
    assert_eq!(mine.body["example"]["id"], 7);
    assert!(mine.body.get("summary").is_none() && mine.body.get("examples").is_none());
    // The owner's example equals the curator's view of it.
    assert_same_numbers(
        &mine.body["example"],
        &full.body["examples"][7],
        1e-9,
        Some(&["datasets"]),
        "example 7",
    );
    assert_same_numbers(
        &mine.body["data_independent"],
        &full.body["data_independent"],
        1e-12,
        Some(&["datasets"]),
        "data independent",
    );
    // A curator may also read one example.
    assert_eq!(
        get(&example_url(&s.server, 7, "r1,r2,r3"), Some(&all)).status,
        200
    );
    let refused = |reply: Reply, who: &str| {
        assert_eq!(reply.status, 403, "{who}: {:?}", reply.body);
        assert_eq!(reply.content_type, "application/problem+json", "{who}");
        let text = reply.body.to_string();
        assert!(!text.contains("epsilon"), "{who} learns nothing: {text}");
    };
    refused(
        get(&example_url(&s.server, 8, "r1,r2,r3"), Some(&owner)),
        "owner of 7 reading 8",
    );
    refused(get(&url, Some(&owner)), "owner reading everything");
    let owner_of_one = s.server.token("owner", Some("r1"), Some("7"));
    refused(
        get(&example_url(&s.server, 7, "r1,r2,r3"), Some(&owner_of_one)),
        "owner of 7 in one run only",
    );
    let one_run = s.server.token("curator", Some("r1"), None);
    refused(get(&url, Some(&one_run)), "curator of one run");
    let two_runs = s.server.token_for("curator", &["r1", "r2"], None);
    refused(get(&url, Some(&two_runs)), "curator of two of three runs");
    // Refused whatever the rest of the query says: the runs are authorised
    // before the orders and the conversion are read.
    refused(
        get(&format!("{url}&alpha=two&conversion=best"), Some(&two_runs)),
        "curator of two of three runs, malformed query",
    );
    for role in ["viewer", "trainer"] {
        let t = s.server.token_for(role, &["r1", "r2", "r3"], None);
        refused(get(&url, Some(&t)), role);
        refused(get(&example_url(&s.server, 7, "r1,r2,r3"), Some(&t)), role);
    }
    // Viewers are refused whatever the query says.
    let viewer = s.server.token("viewer", Some("r1"), None);
    refused(
        get(
            &format!("{}/v1/analyses/data-dependent?bogus=1", s.server.url),
            Some(&viewer),
        ),
        "viewer, malformed query",
    );
    assert_eq!(get(&url, None).status, 401);
}

/// Every refusal is a 4xx problem naming what is wrong.
#[test]
fn every_refusal_is_a_clear_client_error() {
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let base = poisson_config(N, 0.25, 1.0);
    let mut noisier = base.clone();
    noisier["noise_multiplier"] = json!(2.0);
    make_run(
        &s.server,
        &s.admin,
        dir.path(),
        "noisier",
        7,
        noisier,
        STEPS,
        None,
    );
    make_run(
        &s.server,
        &s.admin,
        dir.path(),
        "shorter",
        8,
        base.clone(),
        STEPS - 1,
        None,
    );
    make_run(
        &s.server,
        &s.admin,
        dir.path(),
        "partial",
        9,
        base.clone(),
        STEPS,
        Some(3),
    );
    let r = post(
        &format!("{}/v1/datasets", s.server.url),
        Some(&s.admin),
        &json!({"id": "shuffled", "config": {"examples": N, "max_grad_norm": 1.0,
            "noise_multiplier": 1.0, "sampling": {"kind": "shuffle", "batch_size": 4}, "delta": 1e-5}}),
    );
    assert_eq!(r.status, 201);
    let cases: Vec<(String, u16, &str)> = vec![
        (analysis_url(&s.server, "r1", ""), 400, "at least 2 runs"),
        (analysis_url(&s.server, "r1,r1", ""), 400, "named twice"),
        (
            format!("{}/v1/analyses/data-dependent?delta=1e-5", s.server.url),
            400,
            "runs",
        ),
        (analysis_url(&s.server, "r1,nope", ""), 404, "nope"),
        (
            analysis_url(&s.server, "r1,noisier", ""),
            409,
            "noise_multiplier",
        ),
        (analysis_url(&s.server, "r1,shorter", ""), 409, "steps"),
        (
            analysis_url(&s.server, "r1,partial", ""),
            409,
            "example 3 is missing",
        ),
        (analysis_url(&s.server, "r1,shuffled", ""), 409, "Poisson"),
        (analysis_url(&s.server, "r1,r2", "&alpha=0.5"), 400, "alpha"),
        (analysis_url(&s.server, "r1,r2", "&alpha=two"), 400, "alpha"),
        (analysis_url(&s.server, "r1,r2", "&holder=1"), 400, "holder"),
        (
            format!(
                "{}/v1/analyses/data-dependent?runs=r1,r2&delta=2",
                s.server.url
            ),
            400,
            "delta",
        ),
        (
            analysis_url(&s.server, "r1,r2", "&order_ratio=0.5"),
            400,
            "order_ratio",
        ),
        (
            analysis_url(&s.server, "r1,r2", "&conversion=best"),
            400,
            "conversion",
        ),
        (example_url(&s.server, N, "r1,r2"), 404, "no example"),
    ];
    for (url, status, says) in cases {
        let r = get(&url, Some(&s.admin));
        assert_eq!(r.status, status, "{url}: {:?}", r.body);
        assert_eq!(r.content_type, "application/problem+json", "{url}");
        let detail = r.body["detail"].as_str().unwrap_or("");
        assert!(detail.contains(says), "{url}: {detail}");
    }
    // Norms that are not finite never enter a ledger (so no analysis meets one;
    // the analysis refuses them anyway, see the engine's unit tests).
    let r = post(
        &format!("{}/v1/datasets/r1/refresh", s.server.url),
        Some(&s.admin),
        &json!({"ids": [0], "norms": [-1.0]}),
    );
    assert_eq!(r.status, 400);
    // And the good runs still analyse.
    assert_eq!(
        get(&analysis_url(&s.server, "r1,r2", ""), Some(&s.admin)).status,
        200
    );
}

/// A compacted run cannot be analysed (its early steps are gone for good): the
/// answer is a 409 that says so, not a retryable 503 that no retry can cure.
#[test]
fn a_compacted_run_is_refused_with_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("dpledger.sqlite");
    let store_url = format!("sqlite:{}", db.display());
    let flags = ["--snapshot-records", "4", "--snapshot-seconds", "1"];
    let server = Server::start_flags(&data, Some(&store_url), &flags);
    let admin = server.admin_token();
    for (i, id) in ["r1", "r2"].iter().enumerate() {
        run(&server, &admin, dir.path(), id, 200 + i as u64);
    }
    assert_eq!(
        get(&analysis_url(&server, "r1,r2", ""), Some(&admin)).status,
        200,
        "before compaction"
    );
    // Wait for a snapshot of r1 covering its steps, then compact r1 only.
    let mut compacted = false;
    for _ in 0..200 {
        let outcome = json_output(
            std::process::Command::new(binary())
                .args([
                    "compact",
                    "--store",
                    &store_url,
                    "--dataset",
                    "r1",
                    "--data-dir",
                ])
                .arg(&data),
        );
        if outcome[0]["compaction"]["records"].as_u64().unwrap_or(0) > 0 {
            compacted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(compacted, "no snapshot of r1 to compact to");
    let r = get(&analysis_url(&server, "r1,r2", ""), Some(&admin));
    assert_eq!(r.status, 409, "{:?}", r.body);
    assert_eq!(r.content_type, "application/problem+json");
    let detail = r.body["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("r1") && detail.contains("compacted"),
        "{detail}"
    );
}

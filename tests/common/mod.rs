//! Test harness: the real `dpledger` binary on a free loopback port, driven over
//! HTTP. Shared by the integration tests.
#![allow(dead_code)]

pub mod analysis_runs;
pub mod fault_proxy;
pub mod pg_schema;
pub mod store_records;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// Path of the binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dpledger"))
}

/// A running server process.
pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub data_dir: PathBuf,
    pub store: Option<String>,
    /// Extra `serve` flags, kept for restarts.
    pub extra: Vec<String>,
    /// Its standard output after the listening line, kept open (a server that
    /// prints to a closed pipe would fail).
    stdout: Option<BufReader<ChildStdout>>,
}

impl Server {
    /// Start on a fresh port with the given data dir (and optional store URL).
    pub fn start(data_dir: &Path, store: Option<&str>) -> Server {
        Self::try_start(data_dir, store).unwrap_or_else(|e| panic!("server did not start: {e}"))
    }

    /// Start, or return what the server printed when it refused to start.
    pub fn try_start(data_dir: &Path, store: Option<&str>) -> Result<Server, String> {
        Self::try_start_with(data_dir, store, &[])
    }

    /// Start with extra `serve` flags; `lines` more lines of its standard output
    /// (after the listening line) are returned beside it.
    pub fn start_with(data_dir: &Path, extra: &[&str], lines: usize) -> (Server, Vec<String>) {
        let mut server = Self::try_start_with(data_dir, None, extra)
            .unwrap_or_else(|e| panic!("server did not start: {e}"));
        let mut out = server.stdout.take().expect("stdout");
        let printed = (0..lines)
            .map(|_| {
                let mut line = String::new();
                out.read_line(&mut line).expect("stdout line");
                line.trim().to_string()
            })
            .collect();
        (server, printed)
    }

    /// Start with extra `serve` flags (kept for [`Server::restart`]).
    pub fn start_flags(data_dir: &Path, store: Option<&str>, extra: &[&str]) -> Server {
        Self::try_start_with(data_dir, store, extra)
            .unwrap_or_else(|e| panic!("server did not start: {e}"))
    }

    /// Like [`Server::start_flags`], returning what a refused start printed.
    pub fn try_start_with(
        data_dir: &Path,
        store: Option<&str>,
        extra: &[&str],
    ) -> Result<Server, String> {
        let mut cmd = Command::new(binary());
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra);
        if let Some(s) = store {
            cmd.arg("--store").arg(s);
        }
        cmd.env("DPLEDGER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if let Some(addr) = line.trim().strip_prefix("dpledger listening on ") {
            return Ok(Server {
                child: Some(child),
                url: addr.to_string(),
                data_dir: data_dir.to_path_buf(),
                store: store.map(String::from),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                stdout: Some(stdout),
            });
        }
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        Err(format!(
            "{}{}",
            line,
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill and start again on the same data dir and store.
    pub fn restart(&mut self) {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let fresh = Server::start_flags(&self.data_dir.clone(), self.store.as_deref(), &extra);
        *self = fresh;
    }

    /// The admin token written on first start.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token"))
            .expect("admin token")
            .trim()
            .to_string()
    }

    /// Mint a token with `dpledger token`.
    pub fn token(&self, role: &str, dataset: Option<&str>, examples: Option<&str>) -> String {
        let mut cmd = Command::new(binary());
        cmd.arg("token")
            .arg("--role")
            .arg(role)
            .arg("--data-dir")
            .arg(&self.data_dir);
        if let Some(d) = dataset {
            cmd.arg("--dataset").arg(d);
        }
        if let Some(e) = examples {
            cmd.arg("--examples").arg(e);
        }
        let out = cmd.output().expect("token command");
        assert!(
            out.status.success(),
            "token: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Server {
    /// Mint a token covering several datasets with one role
    /// (`dpledger token --dataset A --dataset B ...`).
    pub fn token_for(&self, role: &str, datasets: &[&str], examples: Option<&str>) -> String {
        let mut cmd = Command::new(binary());
        cmd.arg("token")
            .arg("--role")
            .arg(role)
            .arg("--data-dir")
            .arg(&self.data_dir);
        for d in datasets {
            cmd.arg("--dataset").arg(d);
        }
        if let Some(e) = examples {
            cmd.arg("--examples").arg(e);
        }
        let out = cmd.output().expect("token command");
        assert!(
            out.status.success(),
            "token: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A response: status, content type and parsed JSON body (Null if not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Value,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

fn finish(result: Result<ureq::Response, ureq::Error>) -> Reply {
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let content_type = resp.header("content-type").unwrap_or("").to_string();
    let text = resp.into_string().unwrap_or_default();
    Reply {
        status,
        content_type,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

/// `GET url` with an optional bearer token.
pub fn get(url: &str, token: Option<&str>) -> Reply {
    let mut req = agent().get(url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    finish(req.call())
}

/// `POST url` with a JSON body.
pub fn post(url: &str, token: Option<&str>, body: &Value) -> Reply {
    let mut req = agent().post(url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    finish(req.send_json(body.clone()))
}

/// `PUT url` with a JSON body.
pub fn put(url: &str, token: Option<&str>, body: &Value) -> Reply {
    let mut req = agent().put(url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    finish(req.send_json(body.clone()))
}

/// `method url` with a JSON body and an `Idempotency-Key`.
pub fn send_keyed(method: &str, url: &str, token: &str, key: &str, body: &Value) -> Reply {
    let req = agent()
        .request(method, url)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Idempotency-Key", key);
    finish(req.send_json(body.clone()))
}

/// `POST url` with a JSON body (`serde_json::to_vec`, the bytes a node mark
/// covers) and an optional node mark (`x-dpledger-node-mark`).
pub fn post_marked(url: &str, token: Option<&str>, body: &Value, mark: Option<&str>) -> Reply {
    let mut req = agent().post(url).set("Content-Type", "application/json");
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    if let Some(m) = mark {
        req = req.set("x-dpledger-node-mark", m);
    }
    finish(req.send_bytes(&serde_json::to_vec(body).unwrap()))
}

/// `POST url` with a raw body and content type.
pub fn post_raw(url: &str, token: Option<&str>, content_type: &str, body: &[u8]) -> Reply {
    let mut req = agent().post(url).set("Content-Type", content_type);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    finish(req.send_bytes(body))
}

/// Create each of `ids` as a 20-example Poisson dataset (q = 0.5, sigma = 1).
pub fn create_small_datasets(server: &Server, ids: &[&str]) {
    for id in ids {
        let r = post(
            &format!("{}/v1/datasets", server.url),
            Some(&server.admin_token()),
            &json!({"id": id, "config": poisson_config(20, 0.5, 1.0)}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
}

/// Send scheduled (or, in the sampled mode, any) refresh norms of `ids` to
/// `dataset` as the admin.
pub fn refresh(server: &Server, dataset: &str, ids: &[u64], norms: &[f64]) -> Reply {
    post(
        &format!("{}/v1/datasets/{dataset}/refresh", server.url),
        Some(&server.admin_token()),
        &json!({"ids": ids, "norms": norms}),
    )
}

/// The admin's privacy answer for `example` of `dataset` at `delta` (the
/// whole body: the example's parts and the worst case), asserting 200.
pub fn example_privacy(server: &Server, dataset: &str, example: u64, delta: f64) -> Value {
    example_privacy_with(server, dataset, example, delta, "")
}

/// [`example_privacy`] with `extra` appended to its query (e.g.
/// `&method=pld_estimate`).
pub fn example_privacy_with(
    server: &Server,
    dataset: &str,
    example: u64,
    delta: f64,
    extra: &str,
) -> Value {
    let r = get(
        &format!(
            "{}/v1/datasets/{dataset}/examples/{example}/privacy?delta={delta}{extra}",
            server.url
        ),
        Some(&server.admin_token()),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

/// A small Poisson dataset config of the sampled protocol (a step report
/// moves a sampled example's threshold: what these tests of the step
/// protocol, stores and cluster exercise; the predictable mode has its own
/// tests in `predictable_thresholds.rs`).
pub fn poisson_config(n: u64, q: f64, sigma: f64) -> Value {
    json!({
        "examples": n,
        "max_grad_norm": 1.0,
        "rounding": 0.01,
        "noise_multiplier": sigma,
        "sampling": {"kind": "poisson", "rate": q},
        "delta": 1e-5,
        "thresholds": "sampled",
    })
}

/// [`poisson_config`] at sigma 1 under an individual budget of `epsilon` at
/// delta 1e-5: how the sharded datasets' tests configure their runs (each
/// file picks the budget its run needs).
pub fn budgeted_config(n: u64, q: f64, epsilon: f64) -> Value {
    let mut c = poisson_config(n, q, 1.0);
    c["individual_budget"] = json!({"epsilon": epsilon, "delta": 1e-5});
    c
}

/// Labels of `n` examples mixing two groups and unlabelled ones: ids below
/// 15 are "x" (so a small shard holds one group only), then every third id
/// none, the other even ids "x" and the odd ones "y".
pub fn mixed_labels(n: u64) -> Value {
    let labels: Vec<Value> = (0..n)
        .map(|i| match i {
            i if i < 15 => json!("x"),
            i if i % 3 == 0 => Value::Null,
            i if i % 2 == 0 => json!("x"),
            _ => json!("y"),
        })
        .collect();
    json!(labels)
}

/// Relative difference.
pub fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        ((a - b) / b).abs()
    }
}

/// Runs a `dpledger` command line that prints JSON: it must succeed (its
/// standard error says why not), and its standard output is the answer.
pub fn json_output(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("dpledger runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("dpledger prints JSON")
}

/// `dpledger replay --json` of a trace file.
pub fn replay(path: &Path, delta: f64) -> Value {
    json_output(
        Command::new(binary())
            .args(["replay", "--trace"])
            .arg(path)
            .args(["--delta", &delta.to_string(), "--json"]),
    )
}

/// Every example's served epsilon (and the worst case) equals the offline replay.
pub fn assert_served_matches_replay(
    server: &Server,
    dataset: &str,
    token: &str,
    offline: &Value,
    delta: f64,
) {
    let want_worst = offline["worst_case"]["epsilon"]
        .as_f64()
        .expect("worst case");
    for ex in offline["examples"].as_array().expect("examples") {
        let id = ex["id"].as_u64().expect("id");
        let r = get(
            &format!(
                "{}/v1/datasets/{dataset}/examples/{id}/privacy?delta={delta}",
                server.url
            ),
            Some(token),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        let served = r.body["example"]["epsilon"].as_f64().expect("epsilon");
        let want = ex["epsilon"].as_f64().expect("epsilon");
        assert!(
            rel(served, want) <= 1e-12,
            "example {id}: served {served} replay {want}"
        );
        let worst = r.body["worst_case"]["epsilon"]
            .as_f64()
            .expect("worst case");
        assert!(
            rel(worst, want_worst) <= 1e-12,
            "worst case: served {worst} replay {want_worst}"
        );
        assert!(
            served <= worst * (1.0 + 1e-12),
            "example {id} above the worst case"
        );
        // Both parts, each against the replay: the per-instance RDP epsilon and
        // which bound gave the epsilon; the RDP and PLD worst cases.
        let served_rdp = r.body["example"]["rdp_epsilon"].as_f64().expect("rdp");
        let want_rdp = ex["rdp_epsilon"].as_f64().expect("rdp");
        assert!(rel(served_rdp, want_rdp) <= 1e-12, "example {id} rdp");
        assert_eq!(r.body["example"]["bound"], ex["bound"], "example {id}");
        for part in ["guarantee", "estimate", "ex_post"] {
            assert_eq!(r.body["example"][part], ex[part], "example {id} {part}");
        }
        for part in ["rdp", "pld"] {
            let s = r.body["worst_case"][part]["epsilon"].as_f64().expect(part);
            let w = offline["worst_case"][part]["epsilon"].as_f64().expect(part);
            assert!(
                rel(s, w) <= 1e-12,
                "worst case {part}: served {s} replay {w}"
            );
        }
        assert_eq!(
            r.body["worst_case"]["method"],
            offline["worst_case"]["method"]
        );
    }
}

/// A reproducible trace of `count` Poisson steps over `n` examples at rate `q`
/// (norms uniform in [0, 1.3)), as JSON step reports: what the crash tests stream.
pub fn poisson_trace(seed: u64, n: u64, q: f64, count: u64) -> Vec<Value> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    (0..count)
        .map(|t| {
            let (mut ids, mut norms) = (Vec::new(), Vec::new());
            for i in 0..n {
                if rng.random::<f64>() < q {
                    ids.push(i);
                    norms.push(rng.random::<f64>() * 1.3);
                }
            }
            json!({"step": t, "ids": ids, "norms": norms})
        })
        .collect()
}

/// POST without panicking on a dead server: `None` = no acknowledgement seen.
pub fn try_post(url: &str, token: &str, body: &Value, timeout: Duration) -> Option<(u16, Value)> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    match agent
        .post(url)
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(body.clone())
    {
        Ok(r) => Some((r.status(), r.into_json().ok()?)),
        Err(ureq::Error::Status(code, r)) => Some((code, r.into_json().unwrap_or(Value::Null))),
        Err(_) => None,
    }
}

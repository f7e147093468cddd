//! Truthful answers when a commit's outcome is unknown, against the real server and PostgreSQL, through a fault-injecting
//! proxy (`common::fault_proxy`) that cuts the writer's connection before,
//! during and after COMMIT, for every kind of change:
//!
//! * the answer is truthful: a change whose commit was not confirmed is never
//!   answered "nothing was applied" but `urn:dpledger:problem:outcome-unknown`
//!   (or, where the server could already read the outcome back from the log, the
//!   change's success);
//! * a retry with the same `Idempotency-Key` never applies the change twice (one
//!   record in the log whatever the cut; a release is charged once), and is
//!   answered again the same after a restart; the same key with another request
//!   is 422;
//! * after the store comes back, reads recover without any write (the dataset
//!   is reloaded in the background), and the next write does not fail on the
//!   writer's dead connection.
//!
//! Like the other PostgreSQL tests, these fail when PostgreSQL is unreachable
//! unless `DPLEDGER_SKIP_POSTGRES=1` asks to skip.

mod common;

use common::fault_proxy::{Cut, FaultProxy};
use common::pg_schema::TestSchema;
use common::{get, poisson_config, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// An answer: status and JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
}

/// `method url` with a bearer token, an optional idempotency key and a JSON body.
fn send(method: &str, url: &str, token: &str, key: Option<&str>, body: &Value) -> Answer {
    send_text(method, url, token, key, &body.to_string())
}

/// [`send`] with the body's exact bytes.
fn send_text(method: &str, url: &str, token: &str, key: Option<&str>, body: &str) -> Answer {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let mut req = agent
        .request(method, url)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/json");
    if let Some(k) = key {
        req = req.set("Idempotency-Key", k);
    }
    let resp = match req.send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let body = serde_json::from_str(&resp.into_string().unwrap_or_default()).unwrap_or(Value::Null);
    Answer { status, body }
}

/// Records of `kind` stored for `dataset`, read from the database directly.
fn count(db: &TestSchema, dataset: &str, kind: i16) -> i64 {
    let (url, dataset) = (db.url.clone(), dataset.to_string());
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM dpledger_events WHERE dataset = $1 AND kind = $2",
            &[&dataset, &kind],
        )
        .unwrap()
        .get(0)
    })
    .join()
    .unwrap()
}

/// A change sent through the proxy: its name, method, path (under the
/// server), body, the record kind it stores, for which dataset.
struct Change {
    name: &'static str,
    method: &'static str,
    path: String,
    body: Value,
    kind: i16,
    dataset: String,
}

/// Every kind of change a curator or trainer makes, on dataset `d` (created with
/// a budget and one step), plus the creation of dataset `c`.
fn changes(d: &str, c: &str) -> Vec<Change> {
    let on = |path: &str| format!("/v1/datasets/{d}{path}");
    vec![
        Change {
            name: "create",
            method: "POST",
            path: "/v1/datasets".into(),
            body: json!({"id": c, "config": poisson_config(8, 0.5, 1.0)}),
            kind: 1,
            dataset: c.into(),
        },
        Change {
            name: "budget",
            method: "PUT",
            path: on("/release-budget"),
            body: json!({"rho": 2.0}),
            kind: 5,
            dataset: d.into(),
        },
        Change {
            name: "labels",
            method: "PUT",
            path: on("/labels"),
            body: json!({"ids": [0, 1], "labels": ["a", "b"]}),
            kind: 7,
            dataset: d.into(),
        },
        Change {
            name: "policy",
            method: "PUT",
            path: on("/release-policy"),
            body: json!({"policy": null}),
            kind: 8,
            dataset: d.into(),
        },
        Change {
            name: "refresh",
            method: "POST",
            path: on("/refresh"),
            body: json!({"ids": [1, 2], "norms": [0.5, 0.25]}),
            kind: 3,
            dataset: d.into(),
        },
        Change {
            name: "release",
            method: "POST",
            path: on("/releases"),
            body: json!({"mean": {"rho": 0.048}}),
            kind: 4,
            dataset: d.into(),
        },
        Change {
            name: "archive",
            method: "POST",
            path: on("/archive"),
            body: json!({}),
            kind: 6,
            dataset: d.into(),
        },
    ]
}

/// Wait until the dataset's release budget is readable (memory matches the log).
fn wait_readable(server: &Server, token: &str, d: &str, deadline: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let r = get(
            &format!("{}/v1/datasets/{d}/release-budget", server.url),
            Some(token),
        );
        if r.status == 200 {
            return started.elapsed();
        }
        assert_eq!(r.status, 503, "{:?}", r.body);
        assert!(
            started.elapsed() < deadline,
            "dataset {d} still unreadable after {deadline:?}: {:?}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn every_change_cut_at_commit_is_answered_truthfully_and_applied_once() {
    let Some(db) = TestSchema::new() else { return };
    let proxy = FaultProxy::start(&FaultProxy::upstream_of(&db.base));
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), Some(&proxy.url_for(&db.url)));
    let admin = server.admin_token();
    let mut keys: Vec<(String, Change, Answer)> = Vec::new();
    for cut in [Cut::Before, Cut::During, Cut::After] {
        let (d, c) = (format!("d-{cut:?}"), format!("c-{cut:?}"));
        let created = send(
            "POST",
            &format!("{}/v1/datasets", server.url),
            &admin,
            None,
            &json!({"id": d, "config": poisson_config(8, 0.5, 1.0), "release_budget": {"rho": 1.0}}),
        );
        assert_eq!(created.status, 201, "{:?}", created.body);
        let stepped = send(
            "POST",
            &format!("{}/v1/datasets/{d}/steps", server.url),
            &admin,
            None,
            &json!({"step": 0, "ids": [0, 1, 2, 3], "norms": [1.0, 1.0, 1.0, 1.0]}),
        );
        assert_eq!(stepped.status, 200, "{:?}", stepped.body);
        for change in changes(&d, &c) {
            let key = format!("{}-{cut:?}", change.name);
            let url = format!("{}{}", server.url, change.path);
            let before = count(&db, &change.dataset, change.kind);
            proxy.arm(cut);
            let first = send(change.method, &url, &admin, Some(&key), &change.body);
            assert!(!proxy.armed(), "{key}: the change's commit was not cut");
            // Truthful: either the success (the server read the outcome back
            // from the log before answering) or "outcome unknown"; never
            // "nothing was applied".
            let detail = first.body["detail"].as_str().unwrap_or("").to_string();
            assert!(
                !detail.contains("nothing was applied"),
                "{key}: {:?}",
                first.body
            );
            if first.status >= 300 {
                assert_eq!(first.status, 503, "{key}: {:?}", first.body);
                assert_eq!(
                    first.body["type"], "urn:dpledger:problem:outcome-unknown",
                    "{key}: {:?}",
                    first.body
                );
            } else {
                assert_eq!(change.name, "create", "{key}: {:?}", first.body);
            }
            // The retry with the same key applies it once, whatever the cut did.
            let retry = send(change.method, &url, &admin, Some(&key), &change.body);
            assert!(retry.status < 300, "{key}: {:?}", retry.body);
            assert_eq!(
                count(&db, &change.dataset, change.kind),
                before + 1,
                "{key}: the change must be in the log exactly once"
            );
            // And again: the same answer, nothing more stored.
            let again = send(change.method, &url, &admin, Some(&key), &change.body);
            assert_eq!(again.status, retry.status, "{key}: {:?}", again.body);
            if change.name == "release" {
                assert_eq!(again.body["release"], retry.body["release"], "{key}");
                assert_eq!(retry.body["release"]["id"], 1, "{key}");
                // Charged once: 0.048 of the budget, not 0.096.
                let budget = get(
                    &format!("{}/v1/datasets/{d}/release-budget", server.url),
                    Some(&admin),
                );
                assert_eq!(budget.status, 200, "{:?}", budget.body);
                let spent = budget.body["rho_spent"].as_f64().unwrap();
                assert!((spent - 0.048).abs() < 1e-12, "{key}: rho_spent {spent}");
            }
            assert_eq!(count(&db, &change.dataset, change.kind), before + 1);
            // The same key with another request (here: other bytes of the same
            // JSON) is refused, and changes nothing. (Archiving has no body.)
            if change.name != "archive" {
                let other = format!("{} ", change.body);
                let misuse = send_text(change.method, &url, &admin, Some(&key), &other);
                assert_eq!(misuse.status, 422, "{key}: {:?}", misuse.body);
                assert_eq!(
                    misuse.body["type"], "urn:dpledger:problem:idempotency-key-reused",
                    "{key}"
                );
                assert_eq!(count(&db, &change.dataset, change.kind), before + 1);
            }
            keys.push((key, change, retry));
        }
        assert_eq!(proxy.fired(), 7 * (1 + cut as u32), "one cut per change");
    }
    // Keys are stored with the log: after a restart a retry is answered the same
    // and applies nothing.
    server.restart();
    for (key, change, first) in &keys {
        let before = count(&db, &change.dataset, change.kind);
        let url = format!("{}{}", server.url, change.path);
        let again = send(change.method, &url, &admin, Some(key), &change.body);
        assert_eq!(again.status, first.status, "{key}: {:?}", again.body);
        if change.name == "release" {
            assert_eq!(again.body["release"], first.body["release"], "{key}");
        }
        assert_eq!(count(&db, &change.dataset, change.kind), before, "{key}");
    }
}

/// A server whose PostgreSQL connections pass through a fault proxy, with one
/// dataset created (the setup of the single-change fault tests).
struct BehindProxy {
    proxy: FaultProxy,
    server: Server,
    admin: String,
    _dir: tempfile::TempDir,
}

impl BehindProxy {
    fn start(db: &TestSchema, dataset: Value) -> BehindProxy {
        let proxy = FaultProxy::start(&FaultProxy::upstream_of(&db.base));
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path(), Some(&proxy.url_for(&db.url)));
        let admin = server.admin_token();
        let created = send(
            "POST",
            &format!("{}/v1/datasets", server.url),
            &admin,
            None,
            &dataset,
        );
        assert_eq!(created.status, 201, "{:?}", created.body);
        BehindProxy {
            proxy,
            server,
            admin,
            _dir: dir,
        }
    }
}

#[test]
fn a_step_cut_at_commit_is_answered_truthfully_and_its_retry_applies_once() {
    let Some(db) = TestSchema::new() else { return };
    let behind = BehindProxy::start(
        &db,
        json!({"id": "s", "config": poisson_config(8, 0.5, 1.0)}),
    );
    let (proxy, server, admin) = (&behind.proxy, &behind.server, &behind.admin);
    for (step, cut) in [Cut::Before, Cut::During, Cut::After]
        .into_iter()
        .enumerate()
    {
        let url = format!("{}/v1/datasets/s/steps", server.url);
        let body = json!({"step": step, "ids": [0, 1], "norms": [1.0, 0.5]});
        proxy.arm(cut);
        let first = send("POST", &url, admin, None, &body);
        assert!(!proxy.armed());
        if first.status != 200 {
            assert_eq!(first.status, 503, "{cut:?}: {:?}", first.body);
            assert_eq!(
                first.body["type"], "urn:dpledger:problem:outcome-unknown",
                "{cut:?}"
            );
        }
        let retry = send("POST", &url, admin, None, &body);
        assert_eq!(retry.status, 200, "{cut:?}: {:?}", retry.body);
        assert_eq!(count(&db, "s", 2), step as i64 + 1, "{cut:?}");
    }
}

#[test]
fn reads_recover_without_a_write_once_the_store_answers_again() {
    let Some(db) = TestSchema::new() else { return };
    let behind = BehindProxy::start(
        &db,
        json!({"id": "r", "config": poisson_config(8, 0.5, 1.0), "release_budget": {"rho": 1.0}}),
    );
    let (proxy, server, admin) = (&behind.proxy, &behind.server, &behind.admin);
    // The commit lands, its answer is lost, and the store goes down at once.
    proxy.arm(Cut::After);
    let watcher = {
        let (proxy_down, started) = (&proxy, Instant::now());
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                while proxy_down.armed() && started.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                proxy_down.set_down(true);
            });
            let first = send(
                "PUT",
                &format!("{}/v1/datasets/r/release-budget", server.url),
                admin,
                Some("k"),
                &json!({"rho": 3.0}),
            );
            h.join().unwrap();
            first
        })
    };
    assert_eq!(watcher.status, 503, "{:?}", watcher.body);
    assert_eq!(watcher.body["type"], "urn:dpledger:problem:outcome-unknown");
    // While the store is down the dataset is refused to readers (memory may
    // be behind the log), not served stale.
    std::thread::sleep(Duration::from_millis(1500));
    let down = get(
        &format!("{}/v1/datasets/r/release-budget", server.url),
        Some(admin),
    );
    assert_eq!(down.status, 503, "{:?}", down.body);
    // Back up: reads recover with no write sent, and show the landed change.
    proxy.set_down(false);
    let took = wait_readable(server, admin, "r", Duration::from_secs(20));
    eprintln!("reads recovered {took:?} after the store answered again");
    let budget = get(
        &format!("{}/v1/datasets/r/release-budget", server.url),
        Some(admin),
    );
    assert_eq!(budget.body["rho_budget"], 3.0, "{:?}", budget.body);
    // The writer does not keep its dead connection: the next write succeeds.
    let next = send(
        "PUT",
        &format!("{}/v1/datasets/r/release-budget", server.url),
        admin,
        None,
        &json!({"rho": 4.0}),
    );
    assert_eq!(next.status, 200, "{:?}", next.body);
    assert_eq!(count(&db, "r", 5), 3);
}

/// The server on a SQLite store, started through `sh` with SIGXFSZ ignored so
/// that a file-size limit set on it later (`prlimit`) turns writes past the
/// limit into I/O errors (EFBIG) instead of killing it: the store's disk is
/// "full" for that process only.
struct LimitedServer {
    child: std::process::Child,
    url: String,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl LimitedServer {
    fn start(dir: &std::path::Path) -> LimitedServer {
        use std::io::BufRead;
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; exec \"$0\" \"$@\"")
            .arg(common::binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .env("DPLEDGER_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("dpledger listening on ")
            .unwrap_or_else(|| panic!("server did not start: {line}"))
            .to_string();
        LimitedServer {
            child,
            url,
            _stdout: stdout,
        }
    }

    /// Limit the size any file of the server may grow to (`None`: no limit).
    fn limit_file_size(&self, bytes: Option<u64>) {
        let limit = libc::rlimit {
            rlim_cur: bytes.unwrap_or(libc::RLIM_INFINITY),
            rlim_max: libc::RLIM_INFINITY,
        };
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: prlimit reads `limit` and writes nothing (old limit: null).
        let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_FSIZE, &limit, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    }
}

impl Drop for LimitedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sqlite_a_commit_failing_on_a_full_disk_is_answered_truthfully_and_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = LimitedServer::start(dir.path());
    let admin = std::fs::read_to_string(dir.path().join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let created = send(
        "POST",
        &format!("{}/v1/datasets", server.url),
        &admin,
        None,
        &json!({"id": "q", "config": poisson_config(8, 0.5, 1.0), "release_budget": {"rho": 1.0}}),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    let store = dir.path().join("dpledger.sqlite");
    let count_sqlite = |kind: i64| -> i64 {
        let c = rusqlite::Connection::open_with_flags(
            &store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        c.query_row(
            "SELECT count(*) FROM dpledger_events WHERE dataset = 'q' AND kind = ?1",
            [kind],
            |r| r.get(0),
        )
        .unwrap()
    };
    let size = |name: &str| std::fs::metadata(dir.path().join(name)).map_or(0, |m| m.len());
    let budget_url = format!("{}/v1/datasets/q/release-budget", server.url);
    for (i, rho) in [2.0, 3.0].into_iter().enumerate() {
        // The write-ahead log may not grow (nor may any file grow past its
        // size): the next commit, which appends to it, fails with an I/O error.
        // (Few commits so far: the log has never been checkpointed and reset.)
        let full = size("dpledger.sqlite-wal");
        assert!(full > 0, "the store is in WAL mode");
        server.limit_file_size(Some(full));
        let key = format!("full-{i}");
        let first = send("PUT", &budget_url, &admin, Some(&key), &json!({"rho": rho}));
        assert_eq!(first.status, 503, "{:?}", first.body);
        assert_eq!(
            first.body["type"], "urn:dpledger:problem:outcome-unknown",
            "{:?}",
            first.body
        );
        // Room again: the retry with the same key applies it exactly once, and
        // reads recover (the dataset was reloaded in the background).
        server.limit_file_size(None);
        let retry = send("PUT", &budget_url, &admin, Some(&key), &json!({"rho": rho}));
        assert_eq!(retry.status, 200, "{:?}", retry.body);
        assert_eq!(retry.body["rho_budget"], rho);
        let again = send("PUT", &budget_url, &admin, Some(&key), &json!({"rho": rho}));
        assert_eq!(again.status, 200, "{:?}", again.body);
        assert_eq!(count_sqlite(5), 2 + i as i64, "one budget record per key");
        let read = get(&budget_url, Some(&admin));
        assert_eq!(read.status, 200, "{:?}", read.body);
        assert_eq!(read.body["rho_budget"], rho);
    }
}

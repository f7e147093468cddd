//! Production operations against the real binary: slow and half-sent requests
//! time out while other clients are served, the connection limit, one server
//! per data directory (and per PostgreSQL store in single-node mode), access
//! logs and request ids, tokens minted and revoked over the API, TLS, and
//! errors that name the field at fault.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server whose stderr is collected (for the log tests) and whose stdout is
/// kept open.
struct Logged {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Logged {
    fn start(data_dir: &std::path::Path, flags: &[&str], env: &[(&str, &str)]) -> Logged {
        let mut cmd = Command::new(binary());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(flags)
            .env_remove("DPLEDGER_LOG_FORMAT")
            .env("DPLEDGER_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn");
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let sink = stderr.clone();
            let mut pipe = BufReader::new(child.stderr.take().unwrap());
            std::thread::spawn(move || {
                let mut line = String::new();
                while pipe.read_line(&mut line).unwrap_or(0) > 0 {
                    sink.lock().unwrap().push_str(&line);
                    line.clear();
                }
            });
        }
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("dpledger listening on ")
            .unwrap_or_else(|| panic!("did not start: {line} {}", stderr.lock().unwrap()))
            .to_string();
        Logged {
            child,
            url,
            stderr,
            _stdout: stdout,
        }
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until the collected stderr holds `needle` (logs are written after
    /// the response).
    fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let logs = self.logs();
            if logs.contains(needle) || Instant::now() > deadline {
                return logs;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_port(url: &str) -> String {
    url.split("://").nth(1).unwrap().to_string()
}

/// Send raw bytes on a fresh connection.
fn raw_connection(url: &str, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(host_port(url)).unwrap();
    stream.write_all(bytes).unwrap();
    stream
}

/// Read until the peer answers or closes, or `bound` passes: `Some(what was
/// read)` if it answered or closed, `None` if it still holds the connection.
fn answered_within(stream: &mut TcpStream, bound: Duration) -> Option<String> {
    stream.set_read_timeout(Some(bound)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return Some(String::from_utf8_lossy(&buf).into_owned()),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    return Some(String::from_utf8_lossy(&buf).into_owned());
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            // A reset is a close.
            Err(_) => return Some(String::from_utf8_lossy(&buf).into_owned()),
        }
    }
}

#[test]
fn half_sent_requests_time_out_while_other_clients_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_flags(
        dir.path(),
        None,
        &["--header-timeout", "2s", "--body-timeout", "2s"],
    );
    let admin = server.admin_token();
    // Headers promising 100 bytes of body, then only 8.
    let mut half_body = raw_connection(
        &server.url,
        format!(
            "POST /v1/datasets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"id\": 1"
        )
        .as_bytes(),
    );
    // Headers never finished.
    let mut half_headers = raw_connection(&server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
    // Several more slow clients that send nothing at all.
    let _silent: Vec<TcpStream> = (0..8).map(|_| raw_connection(&server.url, b"")).collect();
    // Everyone else keeps being served meanwhile.
    let started = Instant::now();
    for _ in 0..20 {
        let r = get(&format!("{}/healthz", server.url), None);
        assert_eq!(r.status, 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "healthz took {:?}",
        started.elapsed()
    );
    // Within the body timeout (2 s) plus a generous margin: 408 or closed.
    let answer = answered_within(&mut half_body, Duration::from_secs(20))
        .expect("a half-sent body must not hold the connection forever");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    if !answer.is_empty() {
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
    let answer = answered_within(&mut half_headers, Duration::from_secs(20))
        .expect("half-sent headers must not hold the connection forever");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert_eq!(get(&format!("{}/healthz", server.url), None).status, 200);
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_rest_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_flags(
        dir.path(),
        None,
        &["--max-connections", "4", "--header-timeout", "30s"],
    );
    let held: Vec<TcpStream> = (0..4).map(|_| raw_connection(&server.url, b"")).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = raw_connection(
        &server.url,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let answer = answered_within(&mut extra, Duration::from_secs(20)).expect("refused at once");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
        "{answer}"
    );
    // Once the slow clients go, everyone is served again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut stream = raw_connection(
            &server.url,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let answer = answered_within(&mut stream, Duration::from_secs(10)).unwrap_or_default();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "not served again: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Start `serve` expecting a refusal: its exit status and what it printed.
fn refused_start(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(binary())
        .arg("serve")
        .args(args)
        .env("DPLEDGER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut text = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            return (status, text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the second server did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_server_on_the_same_data_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = Server::start(dir.path(), None);
    let pid = std::fs::read_to_string(dir.path().join("dpledger.lock")).unwrap();
    let pid = pid.trim();
    assert!(pid.parse::<u32>().is_ok(), "{pid:?}");
    let data_dir = dir.path().to_str().unwrap();
    let (status, text) = refused_start(&["--listen", "127.0.0.1:0", "--data-dir", data_dir]);
    assert!(!status.success());
    assert!(text.contains("in use"), "{text}");
    assert!(text.contains(&format!("pid {pid}")), "{text}");
    // The first one is unharmed; once it is gone, the directory is free again.
    assert_eq!(get(&format!("{}/healthz", first.url), None).status, 200);
    drop(first);
    let again = Server::start(dir.path(), None);
    assert_eq!(get(&format!("{}/healthz", again.url), None).status, 200);
    // The embedded store is readable only by this user, like the secret.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("dpledger.sqlite"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
}

#[test]
fn a_second_single_node_server_on_the_same_postgres_store_refuses_to_start() {
    let Some(schema) = common::pg_schema::TestSchema::new() else {
        return;
    };
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = Server::start(dir1.path(), Some(&schema.url));
    let data_dir = dir2.path().to_str().unwrap();
    let (status, text) = refused_start(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir,
        "--store",
        &schema.url,
    ]);
    assert!(!status.success());
    assert!(
        text.contains("another single-node dpledger server holds this store"),
        "{text}"
    );
    assert!(text.contains("dpledger serve pid"), "{text}");
    assert!(!text.contains("password"), "{text}");
    assert_eq!(get(&format!("{}/healthz", first.url), None).status, 200);
    drop(first);
    // Released with the first server's session (a start waits a few seconds
    // for a session that is ending). Its start logs at INFO, yet PostgreSQL's
    // NOTICEs about tables that already exist stay below that level.
    let second = Logged::start(dir2.path(), &["--store", &schema.url], &[]);
    assert_eq!(get(&format!("{}/healthz", second.url), None).status, 200);
    let logs = second.wait_for_log("listening");
    assert!(logs.contains("listening"), "{logs}");
    assert!(!logs.contains("already exists"), "{logs}");
    assert!(!logs.contains("NOTICE"), "{logs}");
}

fn header_of<'a>(response: &'a ureq::Response, name: &str) -> &'a str {
    response.header(name).unwrap_or("")
}

fn call(method: &str, url: &str, token: &str, request_id: Option<&str>) -> ureq::Response {
    let mut req = ureq::request(method, url).set("Authorization", &format!("Bearer {token}"));
    if let Some(id) = request_id {
        req = req.set("X-Request-Id", id);
    }
    match req.call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn access_logs_name_the_route_template_and_the_request_id_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Logged::start(dir.path(), &["--log-format", "json"], &[]);
    let admin = std::fs::read_to_string(dir.path().join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"id": "private-run-name", "config": poisson_config(20, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 201);
    let url = format!(
        "{}/v1/datasets/private-run-name/examples/7/privacy?delta=0.001",
        server.url
    );
    let answer = call("GET", &url, &admin, Some("client-id-42"));
    assert_eq!(answer.status(), 200);
    assert_eq!(header_of(&answer, "x-request-id"), "client-id-42");
    // Generated when absent or unusable (not echoed: it could forge log lines).
    let generated = call("GET", &format!("{}/healthz", server.url), &admin, None);
    let id = header_of(&generated, "x-request-id").to_string();
    assert_eq!(id.len(), 32, "{id}");
    let long = "x".repeat(500);
    let replaced = call(
        "GET",
        &format!("{}/healthz", server.url),
        &admin,
        Some(&long),
    );
    assert_eq!(header_of(&replaced, "x-request-id").len(), 32);
    let missing = call("GET", &format!("{}/nope", server.url), &admin, None);
    assert_eq!(missing.status(), 404);
    assert!(!header_of(&missing, "x-request-id").is_empty());

    let logs = server.wait_for_log(&id);
    let access: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "dpledger::access")
        .collect();
    let line = access
        .iter()
        .find(|v| v["fields"]["request_id"] == "client-id-42")
        .unwrap_or_else(|| panic!("no access line for the request: {logs}"));
    let fields = &line["fields"];
    assert_eq!(fields["method"], "GET");
    assert_eq!(
        fields["route"],
        "/v1/datasets/{dataset}/examples/{example}/privacy"
    );
    assert_eq!(fields["status"], 200);
    assert!(fields["latency_ms"].is_string() || fields["latency_ms"].is_number());
    assert_eq!(line["level"], "INFO");
    assert!(access
        .iter()
        .any(|v| v["fields"]["request_id"] == id.as_str()));
    assert!(!logs.contains(&admin), "a token was logged");
    assert!(!logs.contains("private-run-name/examples"), "{logs}");
    assert!(!logs.contains("delta=0.001"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "colour codes in a pipe: {logs}");
    // Every line is JSON.
    for l in logs.lines().filter(|l| !l.trim().is_empty()) {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
    }

    // Text is the default; still no colour when stderr is not a terminal.
    let dir = tempfile::tempdir().unwrap();
    let text = Logged::start(dir.path(), &[], &[]);
    let admin = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    call(
        "GET",
        &format!("{}/v1/datasets", text.url),
        admin.trim(),
        Some("t-1"),
    );
    let logs = text.wait_for_log("t-1");
    assert!(logs.contains("dpledger::access"), "{logs}");
    assert!(logs.contains("route=/v1/datasets"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs}");
    assert!(!logs.contains(admin.trim()));
}

/// The payload of a JWT, decoded.
fn jwt_claims(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn tokens_are_minted_and_revoked_over_the_api_and_stay_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    create_small_datasets(&server, &["d1"]);
    let mint = |server: &Server, body: Value| {
        post(
            &format!("{}/v1/admin/tokens", server.url),
            Some(&admin),
            &body,
        )
    };
    let minted = mint(
        &server,
        json!({"role": "viewer", "dataset": "d1", "ttl": "1h"}),
    );
    assert_eq!(minted.status, 201, "{:?}", minted.body);
    let token = minted.body["token"].as_str().unwrap().to_string();
    let jti = minted.body["jti"].as_str().unwrap().to_string();
    assert_eq!(jwt_claims(&token)["jti"], jti.as_str());
    let worst = format!("{}/v1/datasets/d1/worst-case", server.url);
    assert_eq!(get(&worst, Some(&token)).status, 200);
    // Only an admin mints or revokes.
    let other = mint(&server, json!({"role": "admin"}));
    assert_eq!(other.status, 201);
    let refused = post(
        &format!("{}/v1/admin/tokens", server.url),
        Some(&token),
        &json!({"role": "admin"}),
    );
    assert_eq!(refused.status, 403);
    // Bad input names the field.
    let zero = mint(
        &server,
        json!({"role": "viewer", "dataset": "d1", "ttl": "0s"}),
    );
    assert_eq!(zero.status, 400);
    assert_eq!(zero.body["field"], "ttl");
    let no_dataset = mint(&server, json!({"role": "trainer"}));
    assert_eq!(no_dataset.status, 400);
    assert_eq!(no_dataset.body["field"], "dataset");
    let bad_role = mint(&server, json!({"role": "root"}));
    assert_eq!(bad_role.status, 400);
    assert_eq!(bad_role.body["field"], "role");
    let bad_jti = post(
        &format!("{}/v1/admin/tokens/%7Bjti%7D/revoke", server.url),
        Some(&admin),
        &json!({}),
    );
    assert_eq!(bad_jti.status, 400);

    let revoke = post(
        &format!("{}/v1/admin/tokens/{jti}/revoke", server.url),
        Some(&admin),
        &json!({}),
    );
    assert_eq!(revoke.status, 200, "{:?}", revoke.body);
    assert_eq!(revoke.body["revoked"], true);
    let gone = get(&worst, Some(&token));
    assert_eq!(gone.status, 401);
    assert_eq!(gone.content_type, "application/problem+json");
    assert!(
        gone.body["detail"].as_str().unwrap().contains("revoked"),
        "{:?}",
        gone.body
    );
    assert_eq!(gone.body["type"], "urn:dpledger:problem:token-revoked");
    // Durable: still refused after a restart.
    server.restart();
    assert_eq!(
        get(
            &format!("{}/v1/datasets/d1/worst-case", server.url),
            Some(&token)
        )
        .status,
        401
    );

    // The CLI's tokens carry an id too, and a lifetime of zero is refused.
    let cli = server.token("viewer", Some("d1"), None);
    assert_eq!(jwt_claims(&cli)["jti"].as_str().unwrap().len(), 32);
    let out = Command::new(binary())
        .args(["token", "--role", "admin", "--ttl", "0s", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ttl"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_revocation_reaches_every_cluster_node_within_the_reload_bound() {
    let Some(cluster) =
        cluster::Cluster::start_with(2, 2000, |_| vec!["--revocation-reload".into(), "1s".into()])
    else {
        return;
    };
    let admin = cluster.admin_token();
    let (a, b) = (&cluster.nodes[0].url, &cluster.nodes[1].url);
    let minted = post(
        &format!("{a}/v1/admin/tokens"),
        Some(&admin),
        &json!({"role": "metrics", "ttl": "10m"}),
    );
    assert_eq!(minted.status, 201, "{:?}", minted.body);
    let token = minted.body["token"].as_str().unwrap();
    let jti = minted.body["jti"].as_str().unwrap();
    assert_eq!(get(&format!("{b}/metrics"), Some(token)).status, 200);
    let revoked = post(
        &format!("{a}/v1/admin/tokens/{jti}/revoke"),
        Some(&admin),
        &json!({}),
    );
    assert_eq!(revoked.status, 200);
    assert_eq!(get(&format!("{a}/metrics"), Some(token)).status, 401);
    let started = Instant::now();
    while get(&format!("{b}/metrics"), Some(token)).status != 401 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the other node still accepts the revoked token"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn https_with_a_certificate_and_key_from_files() {
    use tokio_rustls::rustls;
    let dir = tempfile::tempdir().unwrap();
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key_pair.serialize_pem()).unwrap();
    let data = dir.path().join("data");
    let server = Server::start_flags(
        &data,
        None,
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = TcpStream::connect(host_port(&server.url)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"ok\""), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("x-request-id"));
    // Plain HTTP on the TLS port gets no answer.
    let mut plain = raw_connection(
        &server.url,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let answer = answered_within(&mut plain, Duration::from_secs(30)).unwrap_or_default();
    assert!(!answer.contains("200 OK"), "{answer}");
    // A key that does not parse is refused at start, naming the flag.
    std::fs::write(&key_path, "not a key").unwrap();
    let (status, text) = refused_start(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().join("data2").to_str().unwrap(),
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ]);
    assert!(!status.success());
    assert!(text.contains("--tls-key"), "{text}");
}

#[test]
fn parse_errors_name_the_field_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), None);
    let admin = server.admin_token();
    create_small_datasets(&server, &["d1"]);
    let r = get(
        &format!("{}/v1/datasets/d1/examples/3/privacy?delta=abc", server.url),
        Some(&admin),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.body["field"], "delta", "{:?}", r.body);
    let r = post_raw(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        "application/json",
        b"{\"id\": \"d2\",\n \"config\": {\"examples\": 3,",
    );
    assert_eq!(r.status, 400);
    let detail = r.body["detail"].as_str().unwrap();
    assert!(detail.contains("line 2, column"), "{detail}");
    assert!(!detail.contains("at ?"), "{detail}");
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(&admin),
        &json!({"config": poisson_config(20, 0.5, 1.0)}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.body["field"], "id", "{:?}", r.body);
    let detail = r.body["detail"].as_str().unwrap();
    assert!(!detail.contains("at ."), "{detail}");
}

#[test]
fn every_serve_flag_has_an_environment_variable_and_help_names_the_log_filter() {
    let out = Command::new(binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let mut flags = 0;
    for block in help.split("\n      --").skip(1) {
        let flag = block.split_whitespace().next().unwrap_or("");
        if ["help", "log-format"].contains(&flag.trim_end_matches(' ')) {
            continue;
        }
        flags += 1;
        assert!(
            block.contains("[env: DPLEDGER_"),
            "--{flag} has no environment variable"
        );
    }
    assert!(flags > 20, "{help}");
    let out = Command::new(binary()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("DPLEDGER_LOG"), "{help}");
}

//! Cluster routing of the client against scripted nodes: two tiny HTTP/1.1
//! listeners play a cluster's nodes, so each branch of the routing (map read once,
//! requests to the owner, a not-owner answer resent to the named owner even for a
//! release, an owner that refuses connections) is exercised without a cluster. The
//! real cluster is exercised by the server's `tests/cluster_*.rs`.

use dpledger_client::{Client, Error, RetryPolicy, StepReport};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted answer: status, extra headers, JSON body.
type Answer = (u16, Vec<(&'static str, String)>, serde_json::Value);
type Script = Arc<dyn Fn(&str, &str) -> Answer + Send + Sync>;

/// A node: answers each request with `script(method, path)`, records
/// "METHOD path", one request per connection.
async fn node(script: Script) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (script, log) = (script.clone(), log.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the head, then the body by Content-Length.
                let (head_end, len) = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse::<usize>().unwrap())
                            .unwrap_or(0);
                        break (i + 4, len);
                    }
                };
                while buf.len() < head_end + len {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let line = String::from_utf8_lossy(&buf[..head_end]);
                let mut words = line.split_whitespace();
                let (method, path) = (words.next().unwrap(), words.next().unwrap());
                log.lock().unwrap().push(format!("{method} {path}"));
                let (status, headers, body) = script(method, path);
                let body = body.to_string();
                let mut out = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                out.push_str(&body);
                let _ = sock.write_all(out.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (url, seen)
}

fn step_answer() -> serde_json::Value {
    serde_json::json!({"step": 0, "duplicate": false, "complete": true, "thresholds": [1.0], "retired": []})
}

fn view(owner: &str) -> serde_json::Value {
    serde_json::json!({
        "mode": "cluster", "node_id": "a", "lease_ttl_ms": 10000,
        "nodes": [{"node_id": "b", "advertise": owner, "alive": true, "draining": false,
                   "heartbeat_age_ms": 10, "memory_free_bytes": null,
                   "ledger_memory_bytes": 0, "datasets_owned": 1}],
        "datasets": [{"dataset": "d", "owner": "b", "advertise": owner, "epoch": 2,
                      "lease_expires_in_ms": 9000}]
    })
}

fn not_owner(owner: Option<&str>) -> Answer {
    let mut body = serde_json::json!({
        "type": "urn:dpledger:problem:not-owner", "title": "Service Unavailable",
        "status": 503, "detail": "this node does not own dataset d"
    });
    if let Some(o) = owner {
        body["owner"] = serde_json::json!({"node_id": "b", "advertise": o});
    }
    (503, vec![("retry-after", "1".into())], body)
}

fn client(base: &str) -> Client {
    Client::builder(base)
        .token("t")
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        })
        .build()
        .unwrap()
}

fn report() -> StepReport {
    StepReport::new(0, vec![1], vec![0.5])
}

#[tokio::test]
async fn requests_go_to_the_owner_named_by_the_map_which_is_read_once() {
    let (b, b_seen) = node(Arc::new(|_, _| (200, vec![], step_answer()))).await;
    let owner = b.clone();
    let (a, a_seen) = node(Arc::new(move |_, path| {
        assert_eq!(path, "/v1/cluster", "node a must only serve the map");
        (200, vec![], view(&owner))
    }))
    .await;
    let c = client(&a);
    c.report_step("d", &report()).await.unwrap();
    c.report_step("d", &report()).await.unwrap();
    assert_eq!(*a_seen.lock().unwrap(), vec!["GET /v1/cluster"]);
    assert_eq!(
        *b_seen.lock().unwrap(),
        vec!["POST /v1/datasets/d/steps", "POST /v1/datasets/d/steps"]
    );
}

#[tokio::test]
async fn a_not_owner_answer_is_resent_to_the_named_owner_even_for_a_release() {
    let (b, b_seen) = node(Arc::new(|_, _| {
        let refusal = serde_json::json!({"type": "urn:dpledger:problem:conflict",
            "title": "Conflict", "status": 409, "detail": "no release budget is set"});
        (409, vec![], refusal)
    }))
    .await;
    let owner = b.clone();
    let (a, a_seen) = node(Arc::new(move |_, path| match path {
        "/v1/cluster" => (404, vec![], serde_json::json!({})),
        _ => not_owner(Some(&owner)),
    }))
    .await;
    let c = client(&a);
    let req = dpledger_client::ReleaseRequest::default();
    // Node b refuses (409, not retryable): exactly one attempt reaches it.
    let err = c.create_release("d", &req).await.unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert_eq!(
        *a_seen.lock().unwrap(),
        vec!["GET /v1/cluster", "POST /v1/datasets/d/releases"]
    );
    assert_eq!(
        *b_seen.lock().unwrap(),
        vec!["POST /v1/datasets/d/releases"]
    );
}

#[tokio::test]
async fn not_owner_answers_end_after_the_attempts_with_the_problem() {
    let (a, a_seen) = node(Arc::new(|_, path| match path {
        "/v1/cluster" => (404, vec![], serde_json::json!({})),
        _ => not_owner(None),
    }))
    .await;
    let err = client(&a).report_step("d", &report()).await.unwrap_err();
    match &err {
        Error::Api { problem, attempts } => {
            assert_eq!(problem.kind, "urn:dpledger:problem:not-owner");
            assert_eq!(*attempts, 4);
        }
        other => panic!("{other:?}"),
    }
    // Without an owner named, the map is read again before each retry.
    let seen = a_seen.lock().unwrap();
    assert_eq!(seen.iter().filter(|s| *s == "GET /v1/cluster").count(), 4);
}

#[tokio::test]
async fn an_owner_that_refuses_connections_sends_requests_back_to_the_base_url() {
    // An address nothing listens on: bind, note the port, close.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let reads = Arc::new(Mutex::new(0));
    let (a, a_seen) = node(Arc::new(move |_, path| match path {
        "/v1/cluster" => {
            let mut n = reads.lock().unwrap();
            *n += 1;
            // First the dead owner, then an empty map (the base node serves it).
            if *n == 1 {
                (200, vec![], view(&dead))
            } else {
                (200, vec![], serde_json::json!({"mode": "cluster", "node_id": "a", "nodes": [], "datasets": []}))
            }
        }
        _ => (200, vec![], step_answer()),
    }))
    .await;
    client(&a).report_step("d", &report()).await.unwrap();
    assert_eq!(
        *a_seen.lock().unwrap(),
        vec![
            "GET /v1/cluster",
            "GET /v1/cluster",
            "POST /v1/datasets/d/steps"
        ]
    );
}

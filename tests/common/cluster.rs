//! Cluster test harness: several real `dpledger serve --cluster`
//! processes on loopback sharing one PostgreSQL schema, with the faults the
//! tests inject (SIGKILL, SIGSTOP/SIGCONT, SIGTERM and restart), and a trainer
//! that streams steps through any node, retrying what is retryable.
#![allow(dead_code)]

use crate::common::pg_schema::TestSchema;
use crate::common::{binary, get, poisson_config, post};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// One node process.
pub struct Node {
    pub id: String,
    pub url: String,
    port: u16,
    /// Extra `serve` flags, kept for restarts.
    extra: Vec<String>,
    child: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
    stopped: bool,
}

impl Node {
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// SIGSTOP: the process freezes, its leases run out.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.stopped = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.stopped = false;
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if self.stopped {
            self.resume();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit (the node drains first); `false` if it
    /// did not exit within `bound` (it is then killed).
    pub fn terminate(&mut self, bound: Duration) -> bool {
        self.signal(libc::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < bound {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return true;
                }
            } else {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        false
    }

    /// Whether the process is running (and not stopped).
    pub fn is_up(&self) -> bool {
        self.child.is_some() && !self.stopped
    }

    /// Waits for the process to exit on its own (a drained node).
    pub fn wait_exit(&mut self, bound: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < bound {
            match self.child.as_mut().map(|c| c.try_wait()) {
                None | Some(Ok(Some(_))) => {
                    self.child = None;
                    return true;
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        false
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of nodes on one PostgreSQL schema.
pub struct Cluster {
    /// First, so that the processes are gone before the schema is dropped.
    pub nodes: Vec<Node>,
    pub schema: TestSchema,
    pub dir: tempfile::TempDir,
    pub ttl_ms: u64,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn spawn(
    dir: &Path,
    store: &str,
    id: &str,
    port: u16,
    ttl_ms: u64,
    extra: &[String],
) -> Result<Node, String> {
    let mut child = Command::new(binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir)
        .args(["--store", store, "--cluster", "--node-id", id])
        .args(["--lease-ttl-ms", &ttl_ms.to_string()])
        .args(["--snapshot-records", "200"])
        .args(extra)
        .env("DPLEDGER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).map_err(|e| e.to_string())?;
    let Some(url) = line.trim().strip_prefix("dpledger listening on ") else {
        let _ = child.kill();
        return Err(format!("node {id} did not start: {line}"));
    };
    Ok(Node {
        id: id.to_string(),
        url: url.to_string(),
        port,
        extra: extra.to_vec(),
        child: Some(child),
        stdout: Some(stdout),
        stopped: false,
    })
}

impl Cluster {
    /// `None` only when PostgreSQL is unreachable and skipping was asked for.
    pub fn start(nodes: usize, ttl_ms: u64) -> Option<Cluster> {
        Self::start_with(nodes, ttl_ms, |_| Vec::new())
    }

    /// Like [`Cluster::start`], node `i` (from 0) with the extra `serve`
    /// flags `extra(i)`.
    pub fn start_with(
        nodes: usize,
        ttl_ms: u64,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Option<Cluster> {
        let schema = TestSchema::new()?;
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster {
            schema,
            dir,
            nodes: Vec::new(),
            ttl_ms,
        };
        for i in 1..=nodes {
            let id = format!("n{i}");
            let node = spawn(
                cluster.dir.path(),
                &cluster.schema.url,
                &id,
                free_port(),
                ttl_ms,
                &extra(i - 1),
            )
            .unwrap();
            cluster.nodes.push(node);
        }
        Some(cluster)
    }

    /// Starts one more node (`n{count+1}`), which joins the cluster; answers
    /// its index.
    pub fn add_node(&mut self, extra: &[String]) -> usize {
        let id = format!("n{}", self.nodes.len() + 1);
        let node = spawn(
            self.dir.path(),
            &self.schema.url,
            &id,
            free_port(),
            self.ttl_ms,
            extra,
        )
        .unwrap();
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Waits until every dataset of the map has a live owner and the nodes up
    /// hold numbers of datasets within one of each other (placement and
    /// rebalancing settled: nothing moves any more); answers the counts.
    pub fn wait_balanced(&self, bound: Duration) -> std::collections::BTreeMap<String, u64> {
        let started = Instant::now();
        loop {
            let i = self
                .nodes
                .iter()
                .position(|n| n.is_up())
                .expect("a node up");
            let map = self.map(i);
            let owned = map["datasets"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| d["owner"].is_string());
            // Counted from the same map as `owned`: a second read could
            // find a lease between owners (at a 1 s TTL, a renewal a little
            // late) and count one dataset fewer than the map said was owned.
            let counts: std::collections::BTreeMap<String, u64> = owned_counts_of(&map)
                .into_iter()
                .filter(|(id, _)| self.nodes.iter().any(|n| &n.id == id && n.is_up()))
                .collect();
            let (lo, hi) = (counts.values().min(), counts.values().max());
            if owned && hi.zip(lo).is_some_and(|(h, l)| h - l <= 1) {
                return counts;
            }
            assert!(
                started.elapsed() < bound,
                "not balanced after {bound:?}: {counts:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many live leases each node holds, by node id (from any node's map).
    pub fn owned_counts(&self) -> std::collections::BTreeMap<String, u64> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.is_up())
            .expect("a node up");
        owned_counts_of(&self.map(i))
    }

    /// Starts node `i` again (same id and port) after a kill or an exit.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill();
        let (id, port) = (self.nodes[i].id.clone(), self.nodes[i].port);
        let extra = self.nodes[i].extra.clone();
        let mut last = String::new();
        for _ in 0..50 {
            match spawn(
                self.dir.path(),
                &self.schema.url,
                &id,
                port,
                self.ttl_ms,
                &extra,
            ) {
                Ok(node) => {
                    self.nodes[i] = node;
                    return;
                }
                Err(e) => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!("node {id} did not restart: {last}");
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("admin.token"))
            .expect("admin token")
            .trim()
            .to_string()
    }

    /// `dpledger token` with the shared secret.
    pub fn token(&self, role: &str, dataset: Option<&str>, examples: Option<&str>) -> String {
        let mut cmd = Command::new(binary());
        cmd.args(["token", "--role", role])
            .arg("--data-dir")
            .arg(self.dir.path());
        if let Some(d) = dataset {
            cmd.args(["--dataset", d]);
        }
        if let Some(e) = examples {
            cmd.args(["--examples", e]);
        }
        let out = cmd.output().expect("token");
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// `dpledger token` covering several datasets with one role.
    pub fn token_for(&self, role: &str, datasets: &[&str], examples: Option<&str>) -> String {
        let mut cmd = Command::new(binary());
        cmd.args(["token", "--role", role])
            .arg("--data-dir")
            .arg(self.dir.path());
        for d in datasets {
            cmd.args(["--dataset", d]);
        }
        if let Some(e) = examples {
            cmd.args(["--examples", e]);
        }
        let out = cmd.output().expect("token");
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Waits until at least `count` nodes are alive and not draining in node
    /// 0's map, then one lease TTL more (so their heartbeats and free memory
    /// are there for placement).
    pub fn wait_active(&self, count: usize) {
        let started = Instant::now();
        loop {
            let map = self.map(0);
            let active = map["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["alive"] == true && n["draining"] == false)
                .count();
            if active >= count {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{map}");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(self.ttl_ms));
    }

    /// The map as node `i` answers it.
    pub fn map(&self, i: usize) -> Value {
        let r = get(
            &format!("{}/v1/cluster", self.nodes[i].url),
            Some(&self.admin_token()),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body
    }

    /// The dataset's live owner and epoch in the map (asked of any node up).
    pub fn owner(&self, dataset: &str) -> Option<(String, u64)> {
        let i = self.nodes.iter().position(|n| n.is_up())?;
        let r = get(
            &format!("{}/v1/cluster", self.nodes[i].url),
            Some(&self.admin_token()),
        );
        let d = r.body["datasets"]
            .as_array()?
            .iter()
            .find(|d| d["dataset"] == dataset)?
            .clone();
        Some((d["owner"].as_str()?.to_string(), d["epoch"].as_u64()?))
    }

    /// Waits until `dataset` has a live owner other than `not` that serves
    /// it; answers owner and epoch.
    pub fn wait_owner(&self, dataset: &str, not: Option<&str>, bound: Duration) -> (String, u64) {
        let started = Instant::now();
        loop {
            if let Some((owner, epoch)) = self.owner(dataset) {
                if Some(owner.as_str()) != not {
                    if let Some(n) = self.nodes.iter().find(|n| n.id == owner && n.is_up()) {
                        let r = get(
                            &format!("{}/v1/datasets/{dataset}", n.url),
                            Some(&self.admin_token()),
                        );
                        if r.status == 200 {
                            return (owner, epoch);
                        }
                    }
                }
            }
            assert!(
                started.elapsed() < bound,
                "{dataset} has no new owner after {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Creates a Poisson dataset through node `i`.
    pub fn create(&self, i: usize, id: &str, n: u64, q: f64) {
        let r = post(
            &format!("{}/v1/datasets", self.nodes[i].url),
            Some(&self.admin_token()),
            &json!({"id": id, "config": poisson_config(n, q, 1.0)}),
        );
        assert_eq!(r.status, 201, "{:?}", r.body);
    }

    /// Creates the sharded dataset `body` describes through node `i` (as
    /// admin, retrying while the cluster settles) and answers its shards'
    /// names in range order.
    pub fn create_sharded(&self, i: usize, body: &Value) -> Vec<String> {
        let created = post_retrying(
            &format!("{}/v1/datasets", self.nodes[i].url),
            &self.admin_token(),
            body,
            Duration::from_secs(30),
        );
        assert_eq!(created.status, 201, "{:?}", created.body);
        created.body["shards"]
            .as_array()
            .expect("a shard map")
            .iter()
            .map(|s| s["dataset"].as_str().unwrap().to_string())
            .collect()
    }

    /// Reads `(seq, step, epoch)` of every step record of `dataset` in the log.
    pub fn logged_steps(&self, dataset: &str) -> Vec<(i64, i64, Option<i64>)> {
        let (url, dataset) = (self.schema.url.clone(), dataset.to_string());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.query(
                "SELECT seq, step, epoch FROM dpledger_events WHERE dataset = $1 AND kind = 2 \
                 ORDER BY seq",
                &[&dataset],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
        })
        .join()
        .unwrap()
    }

    /// The seqs of `dataset`'s complete snapshots in the store, newest first.
    pub fn snapshot_seqs(&self, dataset: &str) -> Vec<i64> {
        let (url, dataset) = (self.schema.url.clone(), dataset.to_string());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.query(
                "SELECT seq FROM dpledger_snapshots WHERE dataset = $1 AND complete \
                 ORDER BY seq DESC",
                &[&dataset],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        })
        .join()
        .unwrap()
    }

    /// Every epoch of `dataset`'s records with its first and last seq.
    pub fn epoch_ranges(&self, dataset: &str) -> Vec<(i64, i64, i64)> {
        let (url, dataset) = (self.schema.url.clone(), dataset.to_string());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.query(
                "SELECT epoch, min(seq), max(seq) FROM dpledger_events WHERE dataset = $1 \
                 GROUP BY epoch ORDER BY min(seq)",
                &[&dataset],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, Option<i64>>(0).unwrap_or(-1), r.get(1), r.get(2)))
            .collect()
        })
        .join()
        .unwrap()
    }
}

/// How many live leases each node holds, by node id, in cluster map `map`.
fn owned_counts_of(map: &Value) -> std::collections::BTreeMap<String, u64> {
    map["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap().to_string(),
                n["datasets_owned"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Asserts the log's epochs of `dataset` never go back: each epoch's records
/// lie after every record of the epochs before it (no write under a stale
/// epoch landed after a takeover), and no record lacks an epoch.
pub fn assert_epochs_monotone(cluster: &Cluster, dataset: &str) {
    let ranges = cluster.epoch_ranges(dataset);
    for w in ranges.windows(2) {
        assert!(
            w[0].0 < w[1].0 && w[0].2 < w[1].1,
            "{dataset}: epoch {} has records up to seq {} but epoch {} starts at seq {}: {ranges:?}",
            w[0].0,
            w[0].2,
            w[1].0,
            w[1].1
        );
    }
    assert!(ranges.iter().all(|r| r.0 >= 1), "{ranges:?}");
}

/// What a trainer saw.
#[derive(Debug, Default)]
pub struct Streamed {
    /// Steps acknowledged: 0..acked.
    pub acked: u64,
    /// Retried steps answered as duplicates.
    pub duplicates: u64,
    /// Retryable refusals (503) and transport failures seen and retried.
    pub retried: u64,
    /// Answers that were neither (each is a test failure).
    pub failures: Vec<String>,
}

/// Posts `trace` in order through the nodes at `urls` (rotating on failure)
/// until `stop` is set or the trace ends; every step is retried until it is
/// acknowledged (200; a retry of an applied step is answered as duplicate).
pub fn stream(
    urls: Vec<String>,
    dataset: String,
    token: String,
    trace: std::sync::Arc<Vec<Value>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acked: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Streamed {
    use std::sync::atomic::Ordering;
    let mut out = Streamed::default();
    let mut which = 0usize;
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(15))
        .build();
    let mut t = 0u64;
    while (t as usize) < trace.len() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let url = format!("{}/v1/datasets/{dataset}/steps", urls[which % urls.len()]);
        let result = agent
            .post(&url)
            .set("Authorization", &format!("Bearer {token}"))
            .send_json(trace[t as usize].clone());
        match result {
            Ok(r) => {
                let body: Value = r.into_json().unwrap_or(Value::Null);
                if body["step"] != t {
                    out.failures.push(format!("step {t}: answered {body}"));
                }
                if body["duplicate"] == true {
                    out.duplicates += 1;
                }
                t += 1;
                acked.store(t, Ordering::SeqCst);
            }
            Err(ureq::Error::Status(503, _)) | Err(ureq::Error::Transport(_)) => {
                out.retried += 1;
                which += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                out.failures.push(format!("step {t}: {code} {body}"));
                std::thread::sleep(Duration::from_millis(200));
                which += 1;
                if out.failures.len() > 20 {
                    break;
                }
            }
        }
    }
    out.acked = t;
    out
}

/// POSTs `body` to `url` until it is answered other than `503` or a
/// transport failure (a dataset moving between nodes), within `bound`.
pub fn post_retrying(
    url: &str,
    token: &str,
    body: &Value,
    bound: Duration,
) -> crate::common::Reply {
    let started = Instant::now();
    loop {
        let r = post(url, Some(token), body);
        if r.status != 503 && r.status != 0 {
            return r;
        }
        assert!(started.elapsed() < bound, "POST {url} kept failing: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// GET through any node, retrying retryable answers, until `bound`.
pub fn get_retrying(cluster: &Cluster, path: &str, token: &str, bound: Duration) -> Value {
    let started = Instant::now();
    let mut i = 0;
    loop {
        let up: Vec<&Node> = cluster.nodes.iter().filter(|n| n.is_up()).collect();
        if !up.is_empty() {
            let node = up[i % up.len()];
            let agent = ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(10))
                .build();
            match agent
                .get(&format!("{}{path}", node.url))
                .set("Authorization", &format!("Bearer {token}"))
                .call()
            {
                Ok(r) => return r.into_json().unwrap(),
                Err(ureq::Error::Status(503, _)) | Err(ureq::Error::Transport(_)) => {}
                Err(ureq::Error::Status(code, r)) => {
                    panic!("GET {path}: {code} {}", r.into_string().unwrap_or_default())
                }
            }
        }
        assert!(started.elapsed() < bound, "GET {path} kept failing");
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `trace[..applied]` as a replay file and checks every example's
/// served privacy (through any node) against `dpledger replay`.
pub fn assert_matches_replay(
    cluster: &Cluster,
    dataset: &str,
    n: u64,
    q: f64,
    trace: &[Value],
    applied: u64,
) {
    let mut text = json!({"dataset": {"examples": n, "max_grad_norm": 1.0, "rounding": 0.01,
        "noise_multiplier": 1.0, "sampling_rate": q}})
    .to_string()
        + "\n";
    for line in &trace[..applied as usize] {
        text.push_str(&format!("{line}\n"));
    }
    let path = cluster.dir.path().join(format!("{dataset}.jsonl"));
    std::fs::write(&path, text).unwrap();
    let offline = crate::common::replay(&path, 1e-5);
    let admin = cluster.admin_token();
    for ex in offline["examples"].as_array().expect("examples") {
        let id = ex["id"].as_u64().unwrap();
        let served = get_retrying(
            cluster,
            &format!("/v1/datasets/{dataset}/examples/{id}/privacy?delta=1e-05"),
            &admin,
            Duration::from_secs(30),
        );
        let (s, w) = (
            served["example"]["epsilon"].as_f64().unwrap(),
            ex["epsilon"].as_f64().unwrap(),
        );
        assert!(
            crate::common::rel(s, w) <= 1e-12,
            "{dataset} example {id}: served {s}, replay {w}"
        );
    }
}

/// The sum of node `url`'s samples of the metrics `names` on `/metrics` (0
/// for a metric never incremented).
pub fn metric_total(url: &str, token: &str, names: &[&str]) -> f64 {
    let text = ureq::get(&format!("{url}/metrics"))
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .expect("metrics")
        .into_string()
        .unwrap();
    text.lines()
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            names.contains(&name)
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// `dpledger_cluster_forwarded_total` of node `url` (0 when never incremented).
pub fn forwarded(url: &str, token: &str) -> f64 {
    metric_total(url, token, &["dpledger_cluster_forwarded_total"])
}

impl Cluster {
    /// The chaos loop's faults: `faults` of them, `gap_ms` apart (drawn), each
    /// on a node drawn at random; the first three are one of each kind, then
    /// at random: 0 SIGKILL and restart after up to a lease, 1 SIGSTOP past
    /// the lease (1.5 to 2.5 leases) then SIGCONT, 2 `third(cluster, fault,
    /// node)` (a drain or a rolling restart). Answers how many of each kind
    /// ran. Seeded, so a failing run can be replayed.
    pub fn inject_faults(
        &mut self,
        seed: u64,
        faults: usize,
        gap_ms: std::ops::Range<u64>,
        mut third: impl FnMut(&mut Cluster, usize, usize),
    ) -> [usize; 3] {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        let ttl_ms = self.ttl_ms;
        let ttl = Duration::from_millis(ttl_ms);
        let mut kinds = [0usize; 3];
        for fault in 0..faults {
            std::thread::sleep(Duration::from_millis(rng.random_range(gap_ms.clone())));
            let i = rng.random_range(0..self.nodes.len());
            let kind = if fault < 3 {
                fault
            } else {
                rng.random_range(0..3)
            };
            kinds[kind] += 1;
            match kind {
                0 => {
                    self.nodes[i].kill();
                    std::thread::sleep(Duration::from_millis(rng.random_range(0..ttl_ms)));
                    self.restart(i);
                }
                1 => {
                    self.nodes[i].pause();
                    std::thread::sleep(
                        ttl + ttl / 2 + Duration::from_millis(rng.random_range(0..ttl_ms)),
                    );
                    self.nodes[i].resume();
                }
                _ => third(self, fault, i),
            }
        }
        kinds
    }
}

impl Cluster {
    /// The cluster's node secret, read from PostgreSQL as anyone with the
    /// database can (the nodes make it at their first start).
    pub fn node_secret(&self) -> Vec<u8> {
        let url = self.schema.url.clone();
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.query_one("SELECT secret FROM dpledger_node_secret WHERE id = 1", &[])
                .unwrap()
                .get(0)
        })
        .join()
        .unwrap()
    }

    /// A node mark of `POST path` with JSON `body` as node `node` made at
    /// `at_ms` (Unix milliseconds) with the cluster's secret: what a node
    /// would send (for tests of the protocol's calls by hand).
    pub fn node_mark(&self, node: &str, path: &str, body: &Value, at_ms: u64) -> String {
        let marks = dpledger::engine::cluster::NodeMarks::new(self.node_secret());
        marks.mark_at(
            node,
            "POST",
            path,
            &serde_json::to_vec(body).unwrap(),
            at_ms,
        )
    }
}

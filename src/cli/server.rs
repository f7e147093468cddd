//! `dpledger serve`, `dpledger token` and `dpledger openapi`.
//!
//! Why one file of about 740 lines: `serve`'s flags (each a documented clap
//! argument, about 150 lines) and the one start-up sequence that wires them
//! together (store, engine, cluster node and its peers, listeners, shutdown)
//! are read side by side whenever a flag is added; `token` and `openapi` share
//! the data directory's secret handling with it.

use crate::api::{
    claims_for, metrics_router, openapi_document, parse_ttl, router, AppState, Authorizer, Limits,
    Role,
};
use anyhow::Context;
use base64::Engine;
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A service running in this process on a free local port (`dpledger demo`).
pub struct LocalService {
    /// The runtime serving it: dropping it stops the service.
    pub runtime: tokio::runtime::Runtime,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// An admin token for it (valid one hour).
    pub token: String,
    /// The engine behind it, for what the API does not serve in one request.
    pub engine: crate::engine::Engine,
}

/// Serve `store` in this process on a free local port, with the secret in `dir`,
/// so that the demo speaks HTTP to the real service (the HTTP layer stays here).
pub fn serve_locally(
    dir: &Path,
    store: Arc<dyn crate::store::Store>,
) -> anyhow::Result<LocalService> {
    let secret = load_or_create_secret(dir, true)?;
    let token =
        Authorizer::hs256(&secret).mint(&claims_for("demo", Role::Admin, None, None, 3600)?)?;
    let engine = crate::engine::Engine::recover(store)?;
    let state = Arc::new(AppState::new(
        engine.clone(),
        Authorizer::hs256(&secret),
        Limits::default(),
        None,
    ));
    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}", listener.local_addr()?);
    runtime.spawn(async move {
        let _ = axum::serve(listener, router(state)).await;
    });
    Ok(LocalService {
        runtime,
        base,
        token,
        engine,
    })
}

/// Name of the HS256 secret file in the data directory.
pub const SECRET_FILE: &str = "secret";
/// Name of the admin token file written on first start.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Where secrets live.
#[derive(Debug, Clone, Args)]
pub struct DataDirArg {
    /// Directory for the embedded store, the server secret and the admin token.
    #[arg(long, default_value = "data", env = "DPLEDGER_DATA_DIR")]
    pub data_dir: PathBuf,
}

impl DataDirArg {
    /// Open the store at `url`, or the embedded one in the data directory
    /// (`sqlite:<data-dir>/dpledger.sqlite`) when none is given.
    pub fn open_store(&self, url: Option<&str>) -> anyhow::Result<Arc<dyn crate::store::Store>> {
        let url = url.map(str::to_string).unwrap_or_else(|| {
            format!("sqlite:{}", self.data_dir.join("dpledger.sqlite").display())
        });
        crate::store::open(&url).map_err(|e| anyhow::anyhow!("cannot open the store: {e}"))
    }
}

/// Algorithms accepted from an external identity provider.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExternalAlgorithm {
    /// Ed25519 signatures.
    Eddsa,
    /// RSA PKCS#1 v1.5 with SHA-256.
    Rs256,
}

/// `dpledger serve`.
#[derive(Debug, Args)]
pub struct ServeCmd {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080", env = "DPLEDGER_LISTEN")]
    pub listen: String,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs
    /// `--tls-key`. Without it, plain HTTP (terminate TLS at a proxy instead:
    /// docs/operations.md).
    #[arg(long, env = "DPLEDGER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert` (keep it readable only by this user).
    #[arg(long, env = "DPLEDGER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Time a client has to send a request's headers (and to finish a TLS
    /// handshake), e.g. 10s, 500ms; the connection is closed after it.
    #[arg(long, env = "DPLEDGER_HEADER_TIMEOUT", value_parser = parse_duration,
          default_value = "10s")]
    pub header_timeout: std::time::Duration,
    /// Time a client has to send a request's whole body after its headers; a
    /// late body is answered 408 and the connection closed.
    #[arg(long, env = "DPLEDGER_BODY_TIMEOUT", value_parser = parse_duration,
          default_value = "60s")]
    pub body_timeout: std::time::Duration,
    /// A connection with no request in flight and no traffic for this long is
    /// closed.
    #[arg(long, env = "DPLEDGER_IDLE_TIMEOUT", value_parser = parse_duration,
          default_value = "60s")]
    pub idle_timeout: std::time::Duration,
    /// Most connections open at once; more are answered 503 and closed, so that
    /// the clients already connected keep being served.
    #[arg(long, env = "DPLEDGER_MAX_CONNECTIONS",
          default_value_t = crate::api::listener::DEFAULT_MAX_CONNECTIONS,
          value_parser = parse_max_connections)]
    pub max_connections: usize,
    /// How often the list of revoked tokens is read again from the store: the
    /// bound on how long a token revoked through another node (cluster mode)
    /// or another process stays usable here. A revocation through this node
    /// applies at once.
    #[arg(long, env = "DPLEDGER_REVOCATION_RELOAD", value_parser = parse_duration,
          default_value = "5s")]
    pub revocation_reload: std::time::Duration,
    /// `sqlite:PATH` or `postgres://...`; default `sqlite:<data-dir>/dpledger.sqlite`.
    #[arg(long, env = "DPLEDGER_STORE")]
    pub store: Option<String>,
    #[command(flatten)]
    pub data: DataDirArg,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 64 << 20, env = "DPLEDGER_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Most examples of one ledger. In cluster mode a creation of more (without
    /// "shards") is split into ceil(examples / bound) shards; the cluster
    /// default, 2*10^7, needs about 15.6 GB at peak (about 780 bytes per
    /// example, docs/ledger-memory.md): it fits a 24 GB node. A single server
    /// has no bound unless this is given, and then refuses a larger creation.
    #[arg(long, env = "DPLEDGER_MAX_SHARD_EXAMPLES",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_shard_examples: Option<u64>,
    /// FOR TESTS ONLY: seed every release's randomness with this value plus
    /// the step, so that two ledgers of one trace publish identical values.
    /// Releases become predictable, hence NOT private; a warning is logged.
    #[arg(long, value_name = "SEED", env = "DPLEDGER_INSECURE_TEST_RELEASE_SEED")]
    pub insecure_test_release_seed: Option<u64>,
    /// Verify tokens with this PEM public key of an external identity provider
    /// instead of the local HS256 secret.
    #[arg(long, env = "DPLEDGER_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<PathBuf>,
    /// Algorithm of `--jwt-public-key`.
    #[arg(long, value_enum, default_value_t = ExternalAlgorithm::Eddsa,
          env = "DPLEDGER_JWT_ALGORITHM")]
    pub jwt_algorithm: ExternalAlgorithm,
    /// Required `iss` claim of external tokens.
    #[arg(long, env = "DPLEDGER_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// How long after its `exp` a token is still accepted (clock skew between
    /// the issuer and this server): seconds, or e.g. 0s, 5s, 1m.
    #[arg(long, default_value_t = crate::api::auth::DEFAULT_TOKEN_LEEWAY_SECONDS,
          value_parser = parse_leeway, env = "DPLEDGER_TOKEN_LEEWAY")]
    pub token_leeway: u64,
    /// Also serve `/metrics` WITHOUT a token on this address (e.g. 127.0.0.1:9464,
    /// reachable only by the scraper). On the main listener `/metrics` always
    /// needs an admin or metrics token (`dpledger token --role metrics`).
    #[arg(long, env = "DPLEDGER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Snapshot a dataset after this many of its records (0: never by count).
    /// A restart loads the newest snapshot and replays only the log after it.
    #[arg(long, default_value_t = 10_000, env = "DPLEDGER_SNAPSHOT_RECORDS")]
    pub snapshot_records: u64,
    /// Snapshot a changed dataset whose newest snapshot is this many seconds old
    /// (0: never by age).
    #[arg(long, default_value_t = 300, env = "DPLEDGER_SNAPSHOT_SECONDS")]
    pub snapshot_seconds: u64,
    /// Snapshots kept per dataset; older ones are deleted (never the log, and
    /// never a snapshot a compaction relies on).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..),
          env = "DPLEDGER_SNAPSHOT_KEEP")]
    pub snapshot_keep: u64,
    /// Do not snapshot changed datasets at a clean shutdown (SIGINT/SIGTERM).
    #[arg(long, env = "DPLEDGER_NO_SNAPSHOT_ON_SHUTDOWN")]
    pub no_snapshot_on_shutdown: bool,
    /// Bound in bytes on the process-wide cache of per-bucket RDP tables (one
    /// table is (buckets) x (orders) x 8 bytes; least recently used tables are
    /// evicted beyond it). Ledgers keep the tables they use, so a smaller bound
    /// costs only recomputation when a configuration returns.
    #[arg(long, env = "DPLEDGER_TABLE_CACHE_BYTES",
          default_value_t = crate::accounting::table::DEFAULT_TABLE_CACHE_BYTES)]
    pub table_cache_bytes: usize,
    /// Bound in bytes on the process-wide cache of the per-example PLD
    /// estimates' level spectra and answers (least recently used entries are
    /// evicted beyond it; a smaller bound costs only recomputation).
    #[arg(long, env = "DPLEDGER_ESTIMATE_CACHE_BYTES",
          default_value_t = crate::accounting::pld::DEFAULT_ESTIMATE_CACHE_BYTES)]
    pub estimate_cache_bytes: usize,
    /// Page a dataset out of memory after this many seconds without a request
    /// touching it (0: never). It is snapshotted first if it changed, and loaded
    /// back from the snapshot on the next request that needs it.
    #[arg(long, default_value_t = 1800, env = "DPLEDGER_PAGE_OUT_SECONDS")]
    pub page_out_seconds: u64,
    /// The same for archived datasets, which are read-only and rarely read.
    #[arg(long, default_value_t = 30, env = "DPLEDGER_PAGE_OUT_ARCHIVED_SECONDS")]
    pub page_out_archived_seconds: u64,
    /// Refresh the storage gauges (`dpledger_store_*`, `dpledger_dataset_*`; the
    /// figures of `GET /v1/admin/storage`) every this many seconds. Each refresh
    /// scans the log's row headers once.
    #[arg(long, default_value_t = 30, env = "DPLEDGER_STORAGE_GAUGE_SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub storage_gauge_seconds: u64,
    /// Join a cluster of nodes sharing the PostgreSQL `--store` (docs/cluster.md):
    /// datasets are owned by lease, writes fenced by epoch, requests for another
    /// node's dataset forwarded. Without it, this process serves every dataset.
    #[arg(long, env = "DPLEDGER_CLUSTER")]
    pub cluster: bool,
    /// This node's unique id in the cluster (required with `--cluster`).
    #[arg(long, env = "DPLEDGER_NODE_ID")]
    pub node_id: Option<String>,
    /// The URL other nodes and clients reach this node at (default:
    /// `http://` + the bound listen address).
    #[arg(long, env = "DPLEDGER_ADVERTISE")]
    pub advertise: Option<String>,
    /// Lease length in milliseconds: how long a dead node's datasets wait
    /// before another node takes them over.
    #[arg(long, default_value_t = 10_000, env = "DPLEDGER_LEASE_TTL_MS",
          value_parser = clap::value_parser!(u64).range(200..))]
    pub lease_ttl_ms: u64,
    /// Memory this node offers to ledgers, in bytes (default: whatever the
    /// machine has available). New datasets are placed on the live node with
    /// the most free memory; set it where the machine's figure is not this
    /// process's to use (a container's limit, several nodes on one host).
    #[arg(long, env = "DPLEDGER_NODE_MEMORY_BYTES")]
    pub node_memory_bytes: Option<u64>,
}

/// A duration such as `500ms`, `10s`, `2m` or a number of seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if let Some(ms) = text.strip_suffix("ms") {
        let ms: u64 = ms
            .parse()
            .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 2m"))?;
        return Ok(std::time::Duration::from_millis(ms));
    }
    let seconds = crate::api::auth::parse_ttl(text)
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 2m"))?;
    Ok(std::time::Duration::from_secs(seconds))
}

fn parse_max_connections(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid {text:?}: a number of connections from 1 to 1000000"
        )),
    }
}

fn parse_leeway(text: &str) -> Result<u64, String> {
    crate::api::auth::parse_ttl(text).map_err(|e| e.to_string().replace("--ttl", "--token-leeway"))
}

/// `dpledger token`: mint a bearer token with the server secret.
#[derive(Debug, Args)]
pub struct TokenCmd {
    /// The role.
    #[arg(long, value_enum)]
    pub role: Role,
    /// The dataset (required for every role but admin); repeat it for a token
    /// covering several runs with the same role (e.g. a curator of every run of
    /// a data-dependent analysis).
    #[arg(long)]
    pub dataset: Vec<String>,
    /// Owner tokens: comma-separated example ids.
    #[arg(long)]
    pub examples: Option<String>,
    /// Lifetime, e.g. 30d, 12h, 15m, 90s.
    #[arg(long, default_value = "30d")]
    pub ttl: String,
    /// Subject recorded in the token (who it is for).
    #[arg(long, default_value = "dpledger-cli")]
    pub subject: String,
    #[command(flatten)]
    pub data: DataDirArg,
}

/// `dpledger openapi`: print or write the OpenAPI document.
#[derive(Debug, Args)]
pub struct OpenApiCmd {
    /// Write to this file instead of stdout (e.g. openapi/openapi.json).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

#[cfg(unix)]
fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents)?;
    file.sync_all()?;
    Ok(())
}

#[cfg(not(unix))]
fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("creating {}", path.display()))
}

/// Read the server secret, creating it (and an admin token) on first start.
pub fn load_or_create_secret(data_dir: &Path, create: bool) -> anyhow::Result<Vec<u8>> {
    let path = data_dir.join(SECRET_FILE);
    if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let secret = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .with_context(|| format!("{} is not valid base64", path.display()))?;
        anyhow::ensure!(
            secret.len() >= 32,
            "{} holds fewer than 32 bytes",
            path.display()
        );
        return Ok(secret);
    }
    anyhow::ensure!(
        create,
        "no server secret at {}: start `dpledger serve` once first",
        path.display()
    );
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let mut secret = vec![0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    write_private(
        &path,
        base64::engine::general_purpose::STANDARD
            .encode(&secret)
            .as_bytes(),
    )?;
    let admin = Authorizer::hs256(&secret).mint(&claims_for(
        "admin",
        Role::Admin,
        None,
        None,
        365 * 86_400,
    )?)?;
    let token_path = data_dir.join(ADMIN_TOKEN_FILE);
    write_private(&token_path, admin.as_bytes())?;
    tracing::info!(path = %token_path.display(), "created the server secret and an admin token (readable only by this user)");
    Ok(secret)
}

fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    Some(handle)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = terminate => {} }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// `url` with `-c name=value` added to its libpq `options` parameter (kept
/// when the URL sets `name` itself).
fn with_pg_option(url: &str, name: &str, value: u64) -> String {
    if url.contains(name) {
        return url.to_string();
    }
    let setting = format!("-c%20{name}%3D{value}");
    match url.find("options=") {
        Some(at) => {
            let start = at + "options=".len();
            let end = url[start..].find('&').map_or(url.len(), |e| start + e);
            format!("{}%20{setting}{}", &url[..end], &url[end..])
        }
        None => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}options={setting}")
        }
    }
}

/// A cluster node stops serving once it has handed every dataset over: after
/// SIGINT/SIGTERM (which start the drain) or a drain asked through the API.
async fn cluster_shutdown(node: Arc<crate::engine::cluster::ClusterNode>) {
    tokio::select! {
        _ = shutdown_signal() => node.start_draining(),
        _ = node.wait_drained() => return,
    }
    tracing::info!("draining: handing every dataset over before exiting");
    let bound = node.config.lease_ttl * 30 + std::time::Duration::from_secs(30);
    if tokio::time::timeout(bound, node.wait_drained())
        .await
        .is_err()
    {
        tracing::warn!("the drain did not finish in time; exiting (leases expire)");
    }
}

impl ServeCmd {
    /// `Some(store URL)` in cluster mode, after checking the cluster flags.
    fn cluster_url(&self) -> anyhow::Result<Option<String>> {
        if !self.cluster {
            return Ok(None);
        }
        let url = self.store.clone().unwrap_or_default();
        anyhow::ensure!(
            url.starts_with("postgres://") || url.starts_with("postgresql://"),
            "--cluster needs a PostgreSQL --store (postgres://...): the nodes coordinate through it"
        );
        let id = self.node_id.as_deref().unwrap_or("");
        anyhow::ensure!(
            !id.is_empty() && crate::engine::valid_dataset_id(id),
            "--cluster needs --node-id: 1-64 characters of A-Z a-z 0-9 . _ -"
        );
        Ok(Some(url))
    }

    /// Recover the ledgers and serve until SIGINT/SIGTERM.
    pub fn run(&self) -> anyhow::Result<()> {
        // Before anything large is allocated: paged-out datasets then leave
        // memory for real (engine::allocator).
        let fixed = crate::engine::allocator::configure();
        tracing::debug!(fixed, "malloc's mmap threshold");
        let auth = match &self.jwt_public_key {
            Some(path) => {
                let pem =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let alg = match self.jwt_algorithm {
                    ExternalAlgorithm::Eddsa => jsonwebtoken::Algorithm::EdDSA,
                    ExternalAlgorithm::Rs256 => jsonwebtoken::Algorithm::RS256,
                };
                Authorizer::external(&pem, alg, self.jwt_issuer.as_deref())?
            }
            None => Authorizer::hs256(&load_or_create_secret(&self.data.data_dir, true)?),
        }
        .with_leeway(self.token_leeway);
        let cluster_url = self.cluster_url()?;
        if let Some(seed) = self.insecure_test_release_seed {
            tracing::warn!(
                "--insecure-test-release-seed is set: releases are predictable, hence not \
                 private (tests only)"
            );
            crate::release::rng::set_test_release_seed(seed);
        }
        // A cluster node's writer must not hold the log's locks while it is
        // frozen (SIGSTOP, a long GC-like pause): PostgreSQL ends a session
        // idle inside a transaction after half a lease, so that the other
        // nodes' writes and takeovers wait at most that long.
        let store_url = match &cluster_url {
            Some(url) => Some(with_pg_option(
                url,
                "idle_in_transaction_session_timeout",
                (self.lease_ttl_ms / 2).max(100),
            )),
            None => self.store.clone(),
        };
        // One single-node server per data directory and per store (module
        // `lock`, `store::hold_single_node_lock`); cluster nodes share both by
        // design. Taken before recovery, so a second server refuses at once.
        let _data_dir_lock = if cluster_url.is_none() {
            Some(
                super::lock::lock_data_dir(&self.data.data_dir)
                    .map_err(|e| anyhow::anyhow!("refusing to start: {e:#}"))?,
            )
        } else {
            None
        };
        let _store_lock = match (&cluster_url, store_url.as_deref()) {
            (None, Some(url))
                if url.starts_with("postgres://") || url.starts_with("postgresql://") =>
            {
                Some(
                    crate::store::hold_single_node_lock(url)
                        .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?,
                )
            }
            _ => None,
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::api::listener::tls_config(cert, key)?),
            _ => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let connections = crate::api::listener::ConnectionConfig {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            tls,
        };
        crate::api::listener::raise_open_files_limit(self.max_connections);
        let store = self.data.open_store(store_url.as_deref())?;
        let limits = Limits {
            max_body_bytes: self.max_body_bytes,
            max_shard_examples: self
                .max_shard_examples
                .unwrap_or(crate::engine::sharding::DEFAULT_MAX_SHARD_EXAMPLES),
            single_max_examples: self.max_shard_examples,
            revocation_reload_seconds: self.revocation_reload.as_secs().max(1),
            ..Limits::default()
        };
        crate::ledger::table_cache().set_bound(self.table_cache_bytes);
        crate::engine::estimate_cache().set_bound(self.estimate_cache_bytes);
        let metrics = install_metrics();
        // Cluster mode builds its state once listening (the advertised URL
        // defaults to the bound address); a single node recovers everything now.
        let state = match cluster_url {
            Some(url) => Err((url, store, auth)),
            None => {
                let engine = crate::engine::Engine::recover(store)
                    .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
                Ok(AppState::new(engine, auth, limits, metrics.clone()))
            }
        };
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(&self.listen)
                .await
                .with_context(|| format!("binding {}", self.listen))?;
            let state = match state {
                Ok(state) => state,
                Err((url, store, auth)) => {
                    let bound = listener.local_addr()?;
                    let config = crate::engine::cluster::ClusterConfig {
                        node_id: self.node_id.clone().unwrap_or_default(),
                        advertise: self
                            .advertise
                            .clone()
                            .unwrap_or_else(|| format!("{scheme}://{bound}")),
                        lease_ttl: std::time::Duration::from_millis(self.lease_ttl_ms),
                        memory_bytes: self.node_memory_bytes,
                    };
                    let node = crate::engine::cluster::ClusterNode::connect(&url, config)
                        .await
                        .map_err(|e| anyhow::anyhow!("refusing to start: cluster: {e:#}"))?;
                    let engine = crate::engine::Engine::for_cluster(store, node);
                    // The engine reaches the owners of shards on other nodes
                    // through the node-to-node client.
                    if let Some(node) = engine.cluster() {
                        engine.set_peers(Arc::new(crate::api::HttpPeers::new(node)));
                    }
                    AppState::new(engine, auth, limits, metrics.clone())
                }
            };
            let metrics_listener = match &self.metrics_listen {
                Some(address) => Some(
                    tokio::net::TcpListener::bind(address)
                        .await
                        .with_context(|| format!("binding --metrics-listen {address}"))?,
                ),
                None => None,
            };
            let addr = listener.local_addr()?;
            println!("dpledger listening on {scheme}://{addr}");
            tracing::info!(%addr, "listening");
            if let Some(metrics_listener) = metrics_listener {
                let metrics_addr = metrics_listener.local_addr()?;
                println!("dpledger metrics on http://{metrics_addr}/metrics");
                tracing::info!(%metrics_addr, "serving /metrics without a token");
                tokio::spawn(async move {
                    if let Err(e) = axum::serve(metrics_listener, metrics_router(metrics)).await {
                        tracing::error!(error = %e, "the metrics listener stopped");
                    }
                });
            }
            let state = Arc::new(state);
            // Revoked tokens are refused from the first request on, and
            // revocations made through other processes on the store within
            // --revocation-reload.
            let ids = state
                .engine
                .revoked_tokens()
                .await
                .map_err(|e| anyhow::anyhow!("refusing to start: {e}"))?;
            state.auth.revocations().extend(ids);
            let revocations = {
                let state = state.clone();
                let every = self
                    .revocation_reload
                    .max(std::time::Duration::from_millis(100));
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        match state.engine.revoked_tokens().await {
                            Ok(ids) => state.auth.revocations().extend(ids),
                            Err(e) => tracing::warn!(
                                error = %e,
                                "cannot read the revoked tokens; keeping the list read before"
                            ),
                        }
                    }
                })
            };
            let policy = crate::engine::SnapshotPolicy {
                every_records: self.snapshot_records,
                every: std::time::Duration::from_secs(self.snapshot_seconds),
                keep: self.snapshot_keep as usize,
                gauges_every: std::time::Duration::from_secs(self.storage_gauge_seconds),
            };
            let paging = crate::engine::PagingPolicy {
                idle: std::time::Duration::from_secs(self.page_out_seconds),
                archived_idle: std::time::Duration::from_secs(self.page_out_archived_seconds),
            };
            let snapshots = {
                let state = state.clone();
                tokio::spawn(async move { state.engine.run_snapshot_policy(policy, paging).await })
            };
            let leases = {
                let state = state.clone();
                tokio::spawn(async move { state.engine.run_cluster(policy).await })
            };
            let shutdown = {
                let node = state.engine.cluster().cloned();
                async move {
                    match node {
                        Some(node) => cluster_shutdown(node).await,
                        None => shutdown_signal().await,
                    }
                }
            };
            crate::api::listener::serve(listener, router(state.clone()), connections, shutdown)
                .await?;
            revocations.abort();
            leases.abort();
            let _ = leases.await;
            snapshots.abort();
            let _ = snapshots.await;
            let unfinished = state
                .engine
                .finish_policy_releases(std::time::Duration::from_secs(60))
                .await;
            if unfinished > 0 {
                tracing::warn!(unfinished, "policy releases cut off by the shutdown");
            }
            if !self.no_snapshot_on_shutdown {
                let written = state.engine.snapshot_changed(policy.keep).await;
                tracing::info!(written, "snapshots taken at shutdown");
            }
            Ok(())
        })
    }
}

impl TokenCmd {
    /// Mint and print a token.
    pub fn run(&self) -> anyhow::Result<String> {
        let secret = load_or_create_secret(&self.data.data_dir, false)?;
        let examples = self
            .examples
            .as_deref()
            .map(|text| {
                text.split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<u64>()
                            .map_err(|e| anyhow::anyhow!("invalid --examples {s:?}: {e}"))
                    })
                    .collect::<anyhow::Result<std::collections::BTreeSet<u64>>>()
            })
            .transpose()?;
        let mut datasets = self.dataset.iter().cloned();
        let claims = claims_for(
            &self.subject,
            self.role,
            datasets.next(),
            examples,
            parse_ttl(&self.ttl)?,
        )?;
        let claims = if self.dataset.len() > 1 {
            claims.covering(datasets)?
        } else {
            claims
        };
        Authorizer::hs256(&secret).mint(&claims)
    }
}

/// Mints owner tokens of one example each with the server secret in
/// `data_dir` (read once): what `dpledger token --role owner` prints, for
/// `dpledger loadgen`, whose privacy queries ask as owners.
pub(super) fn owner_token_minter(
    data_dir: &Path,
) -> anyhow::Result<impl Fn(&str, u64) -> anyhow::Result<String>> {
    let authorizer = Authorizer::hs256(&load_or_create_secret(data_dir, false)?);
    Ok(move |dataset: &str, example: u64| {
        let examples = Some([example].into_iter().collect());
        let claims = claims_for(
            "loadgen",
            Role::Owner,
            Some(dataset.to_string()),
            examples,
            86_400,
        )?;
        authorizer.mint(&claims)
    })
}

impl OpenApiCmd {
    /// Print or write the document.
    pub fn run(&self) -> anyhow::Result<Option<String>> {
        let doc = openapi_document();
        match &self.output {
            Some(path) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))?;
                Ok(None)
            }
            None => Ok(Some(doc)),
        }
    }
}

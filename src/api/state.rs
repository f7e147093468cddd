//! What the HTTP handlers share: the engine (every dataset and the one path by
//! which they change), token verification, request limits and the metrics
//! exposition. Only HTTP concerns live here; the domain lives in
//! [`crate::engine`].

use super::auth::Authorizer;
use crate::engine::Engine;

/// Request-size and range limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Largest range of thresholds returned by one request.
    pub max_threshold_range: u64,
    /// Most examples of one ledger: a cluster shards a larger creation
    /// automatically (`--max-shard-examples`, with a default).
    pub max_shard_examples: u64,
    /// A single server's bound on one dataset's examples: only when
    /// `--max-shard-examples` is given, so that a single server accepts what
    /// it always accepted unless its operator asks otherwise.
    pub single_max_examples: Option<u64>,
    /// How often this server reads the revoked tokens again
    /// (`--revocation-reload`), in seconds: what a revocation's answer tells.
    pub revocation_reload_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 << 20,
            max_threshold_range: 1 << 20,
            max_shard_examples: crate::engine::sharding::DEFAULT_MAX_SHARD_EXAMPLES,
            single_max_examples: None,
            revocation_reload_seconds: 5,
        }
    }
}

/// Everything the handlers share.
pub struct AppState {
    /// The datasets and the command path.
    pub engine: Engine,
    /// Token verification.
    pub auth: Authorizer,
    /// Limits.
    pub limits: Limits,
    /// Prometheus exposition, when metrics are installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("engine", &self.engine)
            .finish()
    }
}

impl AppState {
    /// Wrap an engine (rebuilt from the store by [`Engine::recover`], which
    /// refuses a corrupt log) for the handlers.
    pub fn new(
        engine: Engine,
        auth: Authorizer,
        limits: Limits,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Self {
        Self {
            engine,
            auth,
            limits,
            metrics,
        }
    }
}

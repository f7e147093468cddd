//! The cluster map (`GET /v1/cluster`) and the answer to a drain: what a
//! client reads to send each dataset's requests to the node that owns it.

use serde::{Deserialize, Serialize};

/// The cluster map: nodes, their liveness, and which node owns which
/// dataset at which epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterView {
    /// `cluster`, or `single` for one process without a cluster.
    pub mode: String,
    /// The answering node (`local` in single-node mode).
    pub node_id: String,
    /// The lease TTL (`null` in single-node mode).
    pub lease_ttl_ms: Option<u64>,
    /// Every node (every caller sees them: clients need the URLs).
    pub nodes: Vec<ClusterNodeView>,
    /// The datasets the caller holds a role on (admin: all), with owners.
    pub datasets: Vec<ClusterDatasetView>,
}

/// One node of the cluster map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterNodeView {
    /// Its id (`--node-id`; `local` in single-node mode).
    pub node_id: String,
    /// Its advertised base URL (`null` in single-node mode).
    pub advertise: Option<String>,
    /// Its heartbeat is younger than the lease TTL (it may hold leases).
    pub alive: bool,
    /// It is handing its datasets over (drain, shutdown).
    pub draining: bool,
    /// Milliseconds since its heartbeat, by the database's clock.
    pub heartbeat_age_ms: u64,
    /// Memory it reports free for new datasets, in bytes (placement sends a
    /// new dataset to the live node with the most).
    pub memory_free_bytes: Option<u64>,
    /// Memory its ledgers in memory use, in bytes (the storage report's
    /// `memory_bytes`).
    pub ledger_memory_bytes: Option<u64>,
    /// Datasets whose live lease it holds.
    pub datasets_owned: u64,
}

/// One dataset of the cluster map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterDatasetView {
    /// The dataset.
    pub dataset: String,
    /// The node holding its live lease (`null`: none now, the lease is moving).
    pub owner: Option<String>,
    /// The owner's base URL: send the dataset's requests there.
    pub advertise: Option<String>,
    /// The lease's epoch (bumped at every takeover).
    pub epoch: u64,
    /// Milliseconds until the lease expires unless renewed (0: expired).
    pub lease_expires_in_ms: u64,
}

/// What a drain request started (`POST /v1/cluster/nodes/{node}/drain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainAnswer {
    /// The node asked to drain.
    pub node_id: String,
    /// Always true: it hands its datasets over one by one, then exits.
    pub draining: bool,
}

//! Cluster routing: each dataset's requests go to the node that owns it.
//!
//! In a cluster (`dpledger serve --cluster`, see the server's `docs/cluster.md`) any
//! node accepts any request and forwards it to the dataset's owner; going to the
//! owner directly saves that hop. The client keeps a map from dataset id to the
//! owner's advertised URL, read from `GET /v1/cluster` the first time a dataset's
//! request is sent, and refreshed when a node answers `503` with the problem type
//! [`NOT_OWNER`] (the node could neither serve nor forward the request: the lease
//! is moving, or the owner is unreachable). Such an answer promises that nothing
//! was applied, so the request is sent again whatever its retry class, to the
//! owner the problem names when it names one. A connection refused by an owner
//! sends the request back to the configured base URL and refreshes the map.
//!
//! Against a single-node server the map stays empty (`"mode": "single"`) and every
//! request goes to the base URL, as before.

use std::collections::HashMap;
use std::sync::RwLock;
use url::Url;

/// The problem type of a node that cannot serve or forward a dataset's
/// request, and the owner such a problem names: defined with the server in
/// the workspace crate `dpledger-api`.
pub use dpledger_api::problem::{OwnerRef, NOT_OWNER};

/// The cluster map (`GET /v1/cluster`: the nodes, and who owns which dataset
/// among those this token holds a role on) and the answer to a drain,
/// defined once with the server in the workspace crate `dpledger-api`.
pub use dpledger_api::cluster::{
    ClusterDatasetView as DatasetOwner, ClusterNodeView as ClusterNode, ClusterView, DrainAnswer,
};

/// Dataset id -> owner URL, shared by the clones of a client.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    state: RwLock<RouteState>,
}

#[derive(Debug, Default)]
struct RouteState {
    /// Whether `GET /v1/cluster` was read (successfully or not) since the last
    /// invalidation: the map is read at most once per invalidation.
    loaded: bool,
    owners: HashMap<String, Url>,
    /// From the last map read: `Some(true)` for a cluster, `Some(false)` for a
    /// single node, `None` when it could not be read.
    cluster: Option<bool>,
    /// The datasets the last map listed (whether or not owned now).
    listed: std::collections::HashSet<String>,
    /// The datasets whose shards (`{d}~{start}`) the last map listed.
    sharded: std::collections::HashSet<String>,
}

impl Routes {
    /// Whether the map should be read before sending a dataset's request.
    pub(crate) fn needs_load(&self) -> bool {
        !self.state.read().map(|s| s.loaded).unwrap_or(true)
    }

    /// The owner's URL of `dataset`, when known.
    pub(crate) fn owner(&self, dataset: &str) -> Option<Url> {
        self.state
            .read()
            .ok()
            .and_then(|s| s.owners.get(dataset).cloned())
    }

    /// Replace the map with what `GET /v1/cluster` said (or mark it read when the
    /// server has no cluster endpoint or refused it).
    pub(crate) fn install(&self, view: Option<&ClusterView>) {
        let mut owners = HashMap::new();
        let mut listed = std::collections::HashSet::new();
        if let Some(view) = view {
            for d in &view.datasets {
                listed.insert(d.dataset.clone());
                if let Some(url) = d.advertise.as_deref().and_then(parse_base) {
                    owners.insert(d.dataset.clone(), url);
                }
            }
        }
        if let Ok(mut s) = self.state.write() {
            s.loaded = true;
            s.owners = owners;
            s.listed = listed;
            s.cluster = view.map(|v| v.mode == "cluster");
            // A sharded dataset's leases are its shards' (`{d}~{start}`).
            s.sharded = s
                .listed
                .iter()
                .filter_map(|name| name.split_once('~').map(|(d, _)| d.to_string()))
                .collect();
        }
    }

    /// What the last map read says of `dataset`: `Some(true)` when it lists
    /// its shards (`{dataset}~{start}`: a sharded dataset's leases are its
    /// shards'), `Some(false)` when it lists the dataset itself or the server
    /// is a single node, `None` when it does not say (no map, or a dataset the
    /// map does not list).
    pub(crate) fn may_be_sharded(&self, dataset: &str) -> Option<bool> {
        let s = self.state.read().ok()?;
        if s.sharded.contains(dataset) {
            Some(true)
        } else if s.listed.contains(dataset) || s.cluster == Some(false) {
            Some(false)
        } else {
            None
        }
    }

    /// A node named the owner of `dataset`.
    pub(crate) fn learn(&self, dataset: &str, advertise: &str) {
        if let (Some(url), Ok(mut s)) = (parse_base(advertise), self.state.write()) {
            s.owners.insert(dataset.to_string(), url);
        }
    }

    /// The owner of `dataset` is not known any more (it refused the connection or
    /// said it is not the owner): send to the base URL and read the map again.
    pub(crate) fn forget(&self, dataset: &str) {
        if let Ok(mut s) = self.state.write() {
            s.owners.remove(dataset);
            s.loaded = false;
        }
    }
}

/// An advertised URL as a base (with a trailing slash); `None` if unusable.
fn parse_base(advertise: &str) -> Option<Url> {
    let mut url = Url::parse(advertise).ok()?;
    if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Some(url)
}

/// The dataset a request addresses (`/v1/datasets/{d}/...` below the base), if any.
pub(crate) fn dataset_of(base: &Url, url: &Url) -> Option<String> {
    let rest = url.path().strip_prefix(base.path())?;
    let mut parts = rest.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some("datasets"), Some(d)) if !d.is_empty() => Some(d.to_string()),
        _ => None,
    }
}

/// `url` (built on `base`) moved onto `owner`: same path below the base, same query.
pub(crate) fn rebase(base: &Url, url: &Url, owner: &Url) -> Option<Url> {
    let rest = url.path().strip_prefix(base.path())?;
    let mut moved = owner.join(rest).ok()?;
    moved.set_query(url.query());
    Some(moved)
}

/// The seconds of a `Retry-After` header (delta-seconds form only), capped.
pub(crate) fn retry_after_secs(value: Option<&str>) -> Option<u64> {
    value?.trim().parse::<u64>().ok().map(|s| s.min(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(s: &str) -> Url {
        parse_base(s).unwrap()
    }

    #[test]
    fn finds_the_dataset_of_a_request() {
        let b = base("http://h:1/prefix");
        let u = Url::parse("http://h:1/prefix/v1/datasets/run-1/steps").unwrap();
        assert_eq!(dataset_of(&b, &u).as_deref(), Some("run-1"));
        let u = Url::parse("http://h:1/prefix/v1/datasets").unwrap();
        assert_eq!(dataset_of(&b, &u), None);
        let u = Url::parse("http://h:1/prefix/v1/accountant/rdp").unwrap();
        assert_eq!(dataset_of(&b, &u), None);
    }

    #[test]
    fn rebases_path_and_query_onto_the_owner() {
        let b = base("http://h:1/");
        let u = Url::parse("http://h:1/v1/datasets/d/examples/7/privacy?method=pld").unwrap();
        let o = base("http://other:2");
        assert_eq!(
            rebase(&b, &u, &o).unwrap().as_str(),
            "http://other:2/v1/datasets/d/examples/7/privacy?method=pld"
        );
    }

    #[test]
    fn the_map_is_read_once_until_forgotten() {
        let r = Routes::default();
        assert!(r.needs_load());
        let view: ClusterView = serde_json::from_value(serde_json::json!({
            "mode": "cluster", "node_id": "n1", "lease_ttl_ms": 10000,
            "nodes": [{"node_id": "n1", "advertise": "http://a:1", "alive": true,
                       "draining": false, "heartbeat_age_ms": 5, "memory_free_bytes": null,
                       "ledger_memory_bytes": 0, "datasets_owned": 2}],
            "datasets": [
                {"dataset": "d", "owner": "n1", "advertise": "http://a:1", "epoch": 3,
                 "lease_expires_in_ms": 900},
                {"dataset": "e", "owner": null, "advertise": null, "epoch": 1,
                 "lease_expires_in_ms": 0},
                {"dataset": "big~0", "owner": "n1", "advertise": "http://a:1", "epoch": 1,
                 "lease_expires_in_ms": 900}
            ]
        }))
        .unwrap();
        r.install(Some(&view));
        assert!(!r.needs_load());
        assert_eq!(r.may_be_sharded("e"), Some(false));
        assert_eq!(r.may_be_sharded("big"), Some(true));
        assert_eq!(r.may_be_sharded("other"), None);
        assert_eq!(r.owner("d").unwrap().as_str(), "http://a:1/");
        assert_eq!(r.owner("e"), None);
        r.learn("e", "http://b:2");
        assert_eq!(r.owner("e").unwrap().as_str(), "http://b:2/");
        r.forget("d");
        assert!(r.needs_load());
        assert_eq!(r.owner("d"), None);
        assert_eq!(r.owner("e").unwrap().as_str(), "http://b:2/");
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        assert_eq!(retry_after_secs(Some("2")), Some(2));
        assert_eq!(retry_after_secs(Some(" 3600 ")), Some(30));
        assert_eq!(
            retry_after_secs(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(retry_after_secs(None), None);
    }
}

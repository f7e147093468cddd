//! Routing's negative cache: a request naming a dataset that
//! exists nowhere (no lease, no shard layout) costs two PostgreSQL reads
//! before the handler authorises it (the leases and the layout); the same
//! name asked again within [`UNKNOWN_FOR`] is known absent without them. A
//! name leaves the cache when a creation of it passes through this node
//! (`ClusterNode::claim_new`, `claim_layout`, routing of `POST
//! /v1/datasets`) or when the lease loop reads a lease of it or of one of its
//! shards; otherwise a dataset created through another node is answered
//! `404` here for at most [`UNKNOWN_FOR`] after an earlier request for it.
//! Bounded: at most [`UNKNOWN_MAX`] names, the cache then declining new ones
//! (they cost their reads, as without a cache).

use super::{ClusterNode, Lease};
use crate::engine::shard_names::owning_dataset;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a name found absent is answered absent without a read.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(2);
/// Names remembered at most.
pub const UNKNOWN_MAX: usize = 10_000;

/// Names found absent, with when.
#[derive(Debug, Default)]
pub(super) struct UnknownIds {
    found: Mutex<HashMap<String, Instant>>,
}

impl UnknownIds {
    fn found(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.found.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` was found absent within [`UNKNOWN_FOR`] before `now`.
    pub(super) fn is_unknown_at(&self, id: &str, now: Instant) -> bool {
        let mut found = self.found();
        let fresh = found
            .get(id)
            .map(|at| now.saturating_duration_since(*at) < UNKNOWN_FOR);
        if fresh == Some(false) {
            found.remove(id);
        }
        fresh == Some(true)
    }

    /// Remembers `id` as found absent at `now` (unless the cache is full of
    /// names still fresh).
    pub(super) fn remember_at(&self, id: &str, now: Instant) {
        let mut found = self.found();
        if found.len() >= UNKNOWN_MAX {
            found.retain(|_, at| now.saturating_duration_since(*at) < UNKNOWN_FOR);
            if found.len() >= UNKNOWN_MAX {
                return;
            }
        }
        found.insert(id.to_string(), now);
    }

    /// Forgets `id` (it is being created, or a lease of it was seen).
    pub(super) fn forget(&self, id: &str) {
        let mut found = self.found();
        if !found.is_empty() {
            found.remove(id);
        }
    }

    /// Forgets every dataset that has a lease in `leases`, and the sharded
    /// dataset of every shard that has one.
    pub(super) fn forget_leased(&self, leases: &[Lease]) {
        let mut found = self.found();
        if found.is_empty() {
            return;
        }
        for lease in leases {
            found.remove(&lease.dataset);
            found.remove(owning_dataset(&lease.dataset).0);
        }
    }
}

impl ClusterNode {
    /// Whether dataset `id` was found to exist nowhere moments ago (module
    /// note): routing then answers without reading PostgreSQL.
    pub fn known_absent(&self, id: &str) -> bool {
        self.unknown.is_unknown_at(id, Instant::now())
    }

    /// Remembers that dataset `id` has no lease and no layout now.
    pub fn remember_absent(&self, id: &str) {
        self.unknown.remember_at(id, Instant::now());
    }

    /// Forgets that dataset `id` was found absent (a creation of it passes
    /// through this node).
    pub fn forget_absent(&self, id: &str) {
        self.unknown.forget(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(dataset: &str) -> Lease {
        Lease {
            dataset: dataset.into(),
            owner: None,
            advertise: None,
            epoch: 1,
            expires_in_ms: 0,
        }
    }

    #[test]
    fn an_absent_name_is_remembered_briefly_and_forgotten_when_created() {
        let (cache, t0) = (UnknownIds::default(), Instant::now());
        assert!(!cache.is_unknown_at("x", t0));
        cache.remember_at("x", t0);
        assert!(cache.is_unknown_at("x", t0 + UNKNOWN_FOR / 2));
        assert!(!cache.is_unknown_at("x", t0 + UNKNOWN_FOR));
        // Expired entries are dropped when read.
        assert!(cache.found().is_empty());
        cache.remember_at("x", t0);
        cache.forget("x");
        assert!(!cache.is_unknown_at("x", t0));
        // A lease of the name, or of one of its shards, forgets it.
        cache.remember_at("a", t0);
        cache.remember_at("big", t0);
        cache.remember_at("c", t0);
        cache.forget_leased(&[lease("a"), lease("big~250")]);
        assert!(!cache.is_unknown_at("a", t0));
        assert!(!cache.is_unknown_at("big", t0));
        assert!(cache.is_unknown_at("c", t0));
    }

    #[test]
    fn the_cache_is_bounded() {
        let (cache, t0) = (UnknownIds::default(), Instant::now());
        for i in 0..UNKNOWN_MAX + 10 {
            cache.remember_at(&format!("d{i}"), t0);
        }
        assert_eq!(cache.found().len(), UNKNOWN_MAX);
        assert!(!cache.is_unknown_at(&format!("d{}", UNKNOWN_MAX + 5), t0));
        // Once the names are stale, new ones take their place.
        let later = t0 + UNKNOWN_FOR;
        cache.remember_at("new", later);
        assert!(cache.is_unknown_at("new", later));
        assert_eq!(cache.found().len(), 1);
    }
}

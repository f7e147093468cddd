//! When a failed call may be sent again, and how long to wait.
//!
//! A request that never reached the server (connection refused) can always be sent
//! again. A request that may have reached it (timeout, reset, 5xx) is resent only
//! when sending it twice is the same as sending it once: reads, the pure
//! accountant, and step reports, which the ledger applies exactly once per step
//! number (a retry of an applied step is answered `duplicate: true` with the
//! original answer). Every other change (creating or archiving a dataset, a
//! refresh, a DP release, the release settings) is sent with an
//! `Idempotency-Key` header, one random key per call, the same on each of its
//! attempts: the server stores the key with the change and answers a retry from
//! the change already made, never applying it twice (a release retried is
//! charged once). So these calls are retried too, including after the server's
//! `urn:dpledger:problem:outcome-unknown` answer (503: its store did not
//! confirm the commit; the change may or may not have been applied).

use std::time::Duration;

/// Exponential backoff with a cap. `Default`: 10 attempts, 100 ms doubling to at
/// most 5 s (about 21 s of waiting in all), enough to ride out a server restart or
/// a cluster failover (the lease's default TTL is 10 s, plus loading the dataset).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first (1 = never retry).
    pub max_attempts: u32,
    /// Wait before the first retry.
    pub initial_backoff: Duration,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Never retry.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The wait after failed attempt `attempt` (1-based): doubling, capped.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(20);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// Whether a call may be sent twice without changing its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// Sending it twice is the same as once.
    Idempotent,
    /// A second delivery could do something different; never resent after it
    /// may have reached the server.
    NotIdempotent,
    /// A change made safe to resend by an `Idempotency-Key` header: the client
    /// draws one key per call and sends it on every attempt.
    Keyed,
}

/// A fresh idempotency key: 128 bits from the process's randomly seeded
/// hasher keys, the time and a counter, as 32 hex digits. Unique, not secret
/// (the key only names a request to its own server).
pub fn new_idempotency_key() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u64(count);
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// Whether an HTTP status says "try again later" rather than "this is wrong".
pub fn transient_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

/// Whether to retry after a transport error: always when the connection was never
/// made (the request cannot have been received), otherwise only for idempotent calls.
pub(crate) fn retry_transport(error: &reqwest::Error, idempotency: Idempotency) -> bool {
    error.is_connect() || idempotency != Idempotency::NotIdempotent
}

/// Whether to retry after an HTTP error status.
pub(crate) fn retry_status(status: u16, idempotency: Idempotency) -> bool {
    idempotency != Idempotency::NotIdempotent && transient_status(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(750),
        };
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(400));
        assert_eq!(p.backoff(4), Duration::from_millis(750));
        assert_eq!(p.backoff(60), Duration::from_millis(750));
    }

    #[test]
    fn only_idempotent_calls_retry_server_errors() {
        for s in [500, 502, 503, 504, 429] {
            assert!(retry_status(s, Idempotency::Idempotent), "{s}");
            assert!(retry_status(s, Idempotency::Keyed), "{s}");
            assert!(!retry_status(s, Idempotency::NotIdempotent), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 413, 415, 422] {
            assert!(!retry_status(s, Idempotency::Idempotent), "{s}");
            assert!(!retry_status(s, Idempotency::Keyed), "{s}");
        }
    }

    #[test]
    fn keys_are_fresh_and_well_formed() {
        let keys: std::collections::HashSet<String> =
            (0..1000).map(|_| new_idempotency_key()).collect();
        assert_eq!(keys.len(), 1000);
        for k in &keys {
            assert_eq!(k.len(), 32);
            assert!(k.bytes().all(|b| b.is_ascii_hexdigit()), "{k}");
        }
    }
}

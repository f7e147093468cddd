//! When a failed call may be sent again, and how long to wait.
//!
//! A request that never reached the server (connection refused) can always be sent
//! again. A request that may have reached it (timeout, reset, 5xx) is resent only
//! when sending it twice is the same as sending it once: reads, archive, refresh
//! (it sets thresholds to a function of the norms), the pure accountant, and step
//! reports, which the ledger applies exactly once per step number (a retry of an
//! applied step is answered `duplicate: true` with the original answer), and the
//! release settings (budget, labels, policy), which are set rather than added to.
//! Creating a dataset is not retried after it may have reached the server: a
//! second attempt would answer 409 for a dataset the first attempt created. Nor is
//! publishing a DP release: each one spends privacy budget, so a second delivery
//! would publish (and charge) a second release.

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
    /// A second delivery could do something different (dataset creation, a DP
    /// release).
    NotIdempotent,
}

/// Whether an HTTP status says "try again later" rather than "this is wrong".
pub fn transient_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

/// Whether to retry after a transport error: always when the connection was never
/// made (the request cannot have been received), otherwise only for idempotent calls.
pub(crate) fn retry_transport(error: &reqwest::Error, idempotency: Idempotency) -> bool {
    error.is_connect() || idempotency == Idempotency::Idempotent
}

/// Whether to retry after an HTTP error status.
pub(crate) fn retry_status(status: u16, idempotency: Idempotency) -> bool {
    idempotency == Idempotency::Idempotent && transient_status(status)
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
            assert!(!retry_status(s, Idempotency::NotIdempotent), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 413, 415] {
            assert!(!retry_status(s, Idempotency::Idempotent), "{s}");
        }
    }
}

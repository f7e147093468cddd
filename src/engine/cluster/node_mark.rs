//! The node mark: an HMAC-SHA256 that only the cluster's nodes can
//! make, over a node-to-node call's method, path, body hash, time and signing
//! node, keyed by the cluster's secret (`dpledger_node_secret`, generated once
//! by the first node to start and read by every other: whoever can read that
//! table controls the log anyway). A shard owner refuses the calls of the
//! cross-shard change protocol (prepare, decide) without a valid, fresh mark,
//! so that a caller's token alone (a curator's, sent by hand) cannot hold a
//! shard's writes. Pure computation: the api layer puts the mark in a header
//! and checks it (`api::cluster::node_client::sign_node_call`).
//!
//! Format: `v1:{unix_ms}:{hex tag}:{node_id}`; the tag covers
//! `dpledger-node-mark-v1\n{METHOD}\n{path?query}\n{unix_ms}\n{node_id}\n`
//! followed by the body's SHA-256. A mark is fresh within [`MARK_WINDOW`] of
//! the checking node's clock (either side: clocks of a cluster are kept by
//! NTP), and accepted once (a replay within the window is refused; after it,
//! the mark is stale).

use hmac::{KeyInit, Mac};
use sha2_011::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = hmac::Hmac<Sha256>;

/// How far a mark's time may be from the checking node's clock.
pub const MARK_WINDOW: Duration = Duration::from_secs(60);
/// Marks remembered for refusing replays at most (a node makes a handful of
/// marked calls per cross-shard change; beyond this many in one window a
/// check answers "retry").
const SEEN_MAX: usize = 100_000;
const DOMAIN: &[u8] = b"dpledger-node-mark-v1\n";

/// Why a mark was refused (the detail of a 403; never the secret, never the
/// expected tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkRefusal {
    /// Not of the form `v1:{ms}:{tag}:{node}`.
    Malformed,
    /// Made more than [`MARK_WINDOW`] from now.
    Stale,
    /// Its tag is not the cluster key's over this request.
    Forged,
    /// The same mark was accepted before.
    Replayed,
    /// Too many marks were accepted within the window to remember another:
    /// retry (a 503).
    Busy,
}

impl std::fmt::Display for MarkRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MarkRefusal::Malformed => "the node mark is malformed",
            MarkRefusal::Stale => "the node mark is stale (made more than 60 s from this node's clock)",
            MarkRefusal::Forged => "the node mark does not match the request (not made by a node of this cluster, or for another request)",
            MarkRefusal::Replayed => "the node mark was used before",
            MarkRefusal::Busy => "too many node calls within the mark window: retry",
        })
    }
}

/// The cluster's key and the marks this node accepted lately. Its `Debug`
/// shows no byte of the key.
pub struct NodeMarks {
    key: Vec<u8>,
    seen: Mutex<HashMap<[u8; 32], u64>>,
}

impl std::fmt::Debug for NodeMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeMarks { key: <redacted> }")
    }
}

/// Milliseconds since the Unix epoch by this machine's clock.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

impl NodeMarks {
    /// Marks keyed by the cluster's secret.
    pub fn new(secret: Vec<u8>) -> NodeMarks {
        NodeMarks {
            key: secret,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn mac(&self, method: &str, path: &str, body: &[u8], at_ms: u64, node: &str) -> HmacSha256 {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(DOMAIN);
        let at = at_ms.to_string();
        for field in [method, path, at.as_str(), node] {
            mac.update(field.as_bytes());
            mac.update(b"\n");
        }
        mac.update(Sha256::digest(body).as_slice());
        mac
    }

    /// The mark of a call by node `node` at `at_ms` (see the module note).
    pub fn mark_at(&self, node: &str, method: &str, path: &str, body: &[u8], at_ms: u64) -> String {
        let tag = self
            .mac(method, path, body, at_ms, node)
            .finalize()
            .into_bytes();
        format!("v1:{at_ms}:{}:{node}", hex(tag.as_slice()))
    }

    /// The mark of a call by node `node` now.
    pub fn mark(&self, node: &str, method: &str, path: &str, body: &[u8]) -> String {
        self.mark_at(node, method, path, body, unix_ms())
    }

    /// Checks `mark` on a call (`method`, `path` with its query, `body`) at
    /// `now_ms`, and remembers it (a second check of it is a replay): the
    /// node that made it, or why it is refused.
    pub fn check_at(
        &self,
        mark: &str,
        method: &str,
        path: &str,
        body: &[u8],
        now_ms: u64,
    ) -> Result<String, MarkRefusal> {
        let mut fields = mark.splitn(4, ':');
        let (Some("v1"), Some(at), Some(tag), Some(node)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(MarkRefusal::Malformed);
        };
        let at_ms: u64 = at.parse().map_err(|_| MarkRefusal::Malformed)?;
        let tag = unhex(tag).ok_or(MarkRefusal::Malformed)?;
        let tag: [u8; 32] = tag.try_into().map_err(|_| MarkRefusal::Malformed)?;
        let window = MARK_WINDOW.as_millis() as u64;
        if at_ms.abs_diff(now_ms) > window {
            return Err(MarkRefusal::Stale);
        }
        // Constant time.
        self.mac(method, path, body, at_ms, node)
            .verify_slice(&tag)
            .map_err(|_| MarkRefusal::Forged)?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains_key(&tag) {
            return Err(MarkRefusal::Replayed);
        }
        if seen.len() >= SEEN_MAX {
            // What is older than the window is refused as stale anyway.
            seen.retain(|_, at| at.abs_diff(now_ms) <= window);
            if seen.len() >= SEEN_MAX {
                return Err(MarkRefusal::Busy);
            }
        }
        seen.insert(tag, at_ms);
        Ok(node.to_string())
    }

    /// [`NodeMarks::check_at`] now.
    pub fn check(
        &self,
        mark: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<String, MarkRefusal> {
        self.check_at(mark, method, path, body, unix_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/v1/datasets/big~0/shard-changes/ab12/prepare";

    fn marks() -> NodeMarks {
        NodeMarks::new(vec![7; 32])
    }

    #[test]
    fn a_mark_checks_once_for_its_own_request_only() {
        let (m, now) = (marks(), 1_700_000_000_000);
        let mark = m.mark_at("n1", "POST", PATH, b"{}", now);
        assert_eq!(
            m.check_at(&mark, "POST", PATH, b"{}", now + 5),
            Ok("n1".into())
        );
        // The same mark again: a replay.
        assert_eq!(
            m.check_at(&mark, "POST", PATH, b"{}", now + 6),
            Err(MarkRefusal::Replayed)
        );
        // Another body, path, method or node: forged.
        let fresh = m.mark_at("n1", "POST", PATH, b"{}", now + 1);
        let forged = [
            ("POST", PATH, &b"{ }"[..]),
            (
                "POST",
                "/v1/datasets/big~1/shard-changes/ab12/prepare",
                b"{}",
            ),
            ("PUT", PATH, b"{}"),
        ];
        for (method, path, body) in forged {
            assert_eq!(
                m.check_at(&fresh, method, path, body, now),
                Err(MarkRefusal::Forged)
            );
        }
        let renamed = fresh.replace(":n1", ":n2");
        assert_eq!(
            m.check_at(&renamed, "POST", PATH, b"{}", now),
            Err(MarkRefusal::Forged)
        );
        // Another cluster's key: forged.
        let other = NodeMarks::new(vec![8; 32]).mark_at("n1", "POST", PATH, b"{}", now);
        assert_eq!(
            m.check_at(&other, "POST", PATH, b"{}", now),
            Err(MarkRefusal::Forged)
        );
        // A tag changed in one digit: forged.
        let mark = m.mark_at("n1", "POST", PATH, b"{}", now + 2);
        let mut fields: Vec<String> = mark.splitn(4, ':').map(str::to_string).collect();
        let first = if fields[2].starts_with('0') { "1" } else { "0" };
        fields[2].replace_range(0..1, first);
        let flipped = fields.join(":");
        assert_eq!(
            m.check_at(&flipped, "POST", PATH, b"{}", now),
            Err(MarkRefusal::Forged)
        );
    }

    #[test]
    fn a_mark_outside_the_window_is_stale_and_garbage_is_malformed() {
        let (m, now) = (marks(), 1_700_000_000_000);
        let window = MARK_WINDOW.as_millis() as u64;
        let old = m.mark_at("n1", "POST", PATH, b"", now - window - 1);
        assert_eq!(
            m.check_at(&old, "POST", PATH, b"", now),
            Err(MarkRefusal::Stale)
        );
        let ahead = m.mark_at("n1", "POST", PATH, b"", now + window + 1);
        assert_eq!(
            m.check_at(&ahead, "POST", PATH, b"", now),
            Err(MarkRefusal::Stale)
        );
        let edge = m.mark_at("n1", "POST", PATH, b"", now - window);
        assert!(m.check_at(&edge, "POST", PATH, b"", now).is_ok());
        for bad in [
            "",
            "v1",
            "v2:1:00:n1",
            "v1:x:00:n1",
            "v1:1:zz:n1",
            "v1:1:00:n1",
            "v1:1:é0:n",
        ] {
            assert_eq!(
                m.check_at(bad, "POST", PATH, b"", now),
                Err(MarkRefusal::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_key_is_never_shown() {
        let m = NodeMarks::new(b"very-secret-bytes".to_vec());
        assert!(!format!("{m:?}").contains("very"));
        assert!(!m.mark("n1", "POST", PATH, b"").contains("very"));
    }
}

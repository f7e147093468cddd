//! A client's idempotency key for one change: the retry rule of the protocol
//! (a change sent again with its key is answered as the first time and never
//! applied twice). The HTTP layer checks a key's form, the engine takes it with
//! the change, and the store keeps it with the change's records
//! (`store::idempotency`). It lives here, below both, so that the engine and
//! the store name the same type without the engine re-exporting a store type.

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// A client's key for one change, stored with the change's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The key as the client sent it: 1 to [`MAX_KEY_BYTES`] visible ASCII characters.
    pub key: String,
    /// Digest of the request it was sent with (same key with another request: refused).
    pub request: Vec<u8>,
    /// What a retry is answered from (the caller's encoding; may be empty).
    pub answer: Vec<u8>,
}

impl IdempotencyKey {
    /// Key `key` (valid: [`valid_key`]) bound to the request it came with:
    /// a digest of its method, path and body, so that the same key with
    /// another request is told apart. Computed in one place, so that a
    /// shard's part sent in-process is bound exactly as one sent over HTTP.
    pub fn for_request(key: &str, method: &str, path: &str, body: &[u8]) -> IdempotencyKey {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        for part in [method.as_bytes(), path.as_bytes(), body] {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        IdempotencyKey {
            key: key.to_string(),
            request: digest.finalize().to_vec(),
            answer: Vec::new(),
        }
    }
}

/// Whether `key` is acceptable: 1 to [`MAX_KEY_BYTES`] visible ASCII characters
/// (no spaces or control characters).
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_BYTES).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_of_bounded_length() {
        assert!(valid_key("a"));
        assert!(valid_key("8e0f6c2a-2f7b-4c55-9a8e-0c3b7d1f9e21"));
        assert!(valid_key(&"k".repeat(MAX_KEY_BYTES)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"k".repeat(MAX_KEY_BYTES + 1)));
        assert!(!valid_key("a b"));
        assert!(!valid_key("a\nb"));
        assert!(!valid_key("clé"));
    }
}

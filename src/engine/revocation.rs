//! Revoked tokens, read and written through the store (`store::revocation`).
//! Tokens are an HTTP concern; the engine only keeps their ids durable, so that
//! every process on the store refuses them.

use super::{Engine, EngineError, EngineResult};

impl Engine {
    /// Record `jti` as revoked, durably; an invalid id is a 400 naming `jti`.
    pub async fn revoke_token(&self, jti: &str) -> EngineResult<()> {
        if !crate::store::revocation::valid_jti(jti) {
            return Err(EngineError::BadRequest {
                field: Some("jti"),
                detail: format!(
                    "a token id is 1 to {} characters of A-Z a-z 0-9 - _ .",
                    crate::store::revocation::MAX_JTI_BYTES
                ),
            });
        }
        let store = self.store.clone();
        let jti = jti.to_string();
        let now = crate::store::snapshots::now_secs();
        tokio::task::spawn_blocking(move || store.revoke_token(&jti, now))
            .await
            .map_err(|_| EngineError::Internal("the revocation failed".into()))?
            .map_err(EngineError::store)
    }

    /// Every revoked token id in the store.
    pub async fn revoked_tokens(&self) -> EngineResult<Vec<String>> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.revoked_tokens())
            .await
            .map_err(|_| EngineError::Internal("reading the revoked tokens failed".into()))?
            .map_err(EngineError::store)
    }
}

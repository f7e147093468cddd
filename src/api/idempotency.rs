//! The `Idempotency-Key` request header (IETF httpapi draft
//! "The Idempotency-Key HTTP Header Field"): every POST and PUT that changes a
//! dataset accepts one. The key is kept raw until the handler has authorised
//! the request, then checked and bound to a digest of the request (method,
//! path, body), so that the engine can tell a retry (same key, same request:
//! answered from the change already made) from a misuse (same key, another
//! request: 422).

use super::problem::Problem;
use crate::ledger::{valid_key, IdempotencyKey};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderValue;

/// The header's name.
pub const HEADER: &str = "idempotency-key";

/// The request's `Idempotency-Key`, if it sent one, with what identifies the
/// request beside its body.
#[derive(Debug)]
pub struct IdempotencyHeader {
    raw: Option<HeaderValue>,
    method: String,
    path: String,
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyHeader {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        Ok(IdempotencyHeader {
            raw: parts.headers.get(HEADER).cloned(),
            method: parts.method.as_str().to_string(),
            path: parts.uri.path().to_string(),
        })
    }
}

impl IdempotencyHeader {
    /// The key bound to this request with `body`; call only after authorising.
    /// A malformed key (not 1–255 visible ASCII characters; the draft's quoted
    /// form `"..."` is accepted too) is a 400.
    pub fn key(&self, body: &[u8]) -> Result<Option<IdempotencyKey>, Problem> {
        let Some(raw) = &self.raw else {
            return Ok(None);
        };
        let malformed = || {
            Problem::bad_request(
                "Idempotency-Key must be 1 to 255 visible ASCII characters (e.g. a UUID)",
            )
            .with_field("Idempotency-Key")
        };
        let text = raw.to_str().map_err(|_| malformed())?.trim();
        let key = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) => inner,
            None => text,
        };
        if !valid_key(key) {
            return Err(malformed());
        }
        Ok(Some(IdempotencyKey::for_request(
            key,
            &self.method,
            &self.path,
            body,
        )))
    }
}

/// Documents the header on a state-changing operation of the OpenAPI document.
pub fn document(op: &mut utoipa::openapi::path::Operation) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::Required;
    let parameter = ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "Makes the request safe to retry (IETF Idempotency-Key draft): the same key with \
             the same request (method, path, body) is answered from the change the first one \
             made, never applied twice; the same key with another request is 422. Stored \
             with the change in the log (kept across restarts), per dataset. Steps are \
             exactly-once by (step, part) with or without a key.",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(255))
                .build(),
        ))
        .build();
    op.parameters.get_or_insert_with(Vec::new).push(parameter);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: Option<&str>, method: &str, path: &str) -> IdempotencyHeader {
        IdempotencyHeader {
            raw: value.map(|v| HeaderValue::from_str(v).unwrap()),
            method: method.into(),
            path: path.into(),
        }
    }

    #[test]
    fn the_digest_binds_method_path_and_body() {
        let a = header(Some("k1"), "POST", "/v1/datasets/d/releases");
        let one = a.key(b"{}").unwrap().unwrap();
        assert_eq!(one.key, "k1");
        assert_eq!(one, a.key(b"{}").unwrap().unwrap());
        assert_ne!(one.request, a.key(b"{ }").unwrap().unwrap().request);
        let b = header(Some("k1"), "PUT", "/v1/datasets/d/releases");
        assert_ne!(one.request, b.key(b"{}").unwrap().unwrap().request);
        let c = header(Some("k1"), "POST", "/v1/datasets/e/releases");
        assert_ne!(one.request, c.key(b"{}").unwrap().unwrap().request);
        let quoted = header(Some("\"k1\""), "POST", "/v1/datasets/d/releases");
        assert_eq!(one, quoted.key(b"{}").unwrap().unwrap());
    }

    #[test]
    fn no_header_is_no_key_and_bad_keys_are_refused() {
        assert_eq!(header(None, "POST", "/").key(b"").unwrap(), None);
        for bad in ["", "a b", "\"\"", &"k".repeat(256)] {
            let e = header(Some(bad), "POST", "/").key(b"").unwrap_err();
            assert_eq!(e.status, 400, "{bad:?}");
            assert_eq!(e.field.as_deref(), Some("Idempotency-Key"));
        }
    }
}

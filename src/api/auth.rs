//! Bearer-JWT authorisation. Every handler names the exact object it touches and
//! asks [`Claims`] whether the token covers it.
//!
//! Roles: `admin` (everything), `curator` (all of one dataset), `trainer` (report
//! steps and read thresholds of one dataset), `owner` (one dataset and a listed set
//! of example ids: their own privacy only), `viewer` (DP-released aggregates and
//! the public worst case of one dataset).
//!
//! Tokens are HS256-signed with a server secret by default; alternatively the server
//! verifies tokens of an external identity provider with its public key (EdDSA or
//! RS256), in which case it cannot mint tokens itself.

use super::problem::Problem;
use crate::engine::sharding::owning_dataset;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Issuer written into (and required of) tokens the server mints.
pub const ISSUER: &str = "dpledger";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, including creating datasets.
    Admin,
    /// Everything about one dataset.
    Curator,
    /// Report steps and refreshes, read thresholds, of one dataset.
    Trainer,
    /// Read the privacy of listed examples of one dataset.
    Owner,
    /// Read DP-released aggregates and the worst case of one dataset.
    Viewer,
    /// Scrape `/metrics` (server-wide, like admin) and nothing else: what a
    /// Prometheus server holds, so that scraping needs no broader credential.
    Metrics,
}

impl Role {
    /// Server-wide roles name no dataset; every other role is bound to one.
    pub fn server_wide(self) -> bool {
        matches!(self, Role::Admin | Role::Metrics)
    }
}

/// The claims of a dpledger token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// Subject: who the token was issued to (free text, for audit).
    pub sub: String,
    /// The role.
    pub role: Role,
    /// The dataset the token is limited to (required for every role but admin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Further datasets the token covers with the same role: several training
    /// runs of one model (seed 001's analysis needs a curator of every run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datasets: Option<BTreeSet<String>>,
    /// Owner tokens: the example ids whose privacy the holder may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<BTreeSet<u64>>,
    /// Expiry (seconds since the epoch).
    pub exp: u64,
    /// Issued at (seconds since the epoch).
    pub iat: u64,
    /// Issuer.
    pub iss: String,
    /// The token's id: what `POST /v1/admin/tokens/{jti}/revoke` names. Every
    /// token the server mints has one (32 random hex digits); a token without
    /// one (minted by an older version, or by an identity provider that sets
    /// none) cannot be revoked, only expire or be refused by rotating the
    /// secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// The ids of revoked tokens, shared by every verification in this process.
/// Replaced wholesale from the store every `serve --revocation-reload`, and
/// added to at once by a revocation through this process.
#[derive(Debug, Default)]
pub struct Revocations {
    ids: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl Revocations {
    /// Whether `jti` was revoked.
    pub fn contains(&self, jti: &str) -> bool {
        self.ids
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(jti)
    }

    /// Add one id (a revocation made through this process).
    pub fn insert(&self, jti: String) {
        self.ids
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(jti);
    }

    /// Replace the set with what the store holds (revocations are never
    /// undone, so ids added meanwhile are kept too).
    pub fn extend(&self, ids: impl IntoIterator<Item = String>) {
        self.ids
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(ids);
    }

    /// How many ids are revoked.
    pub fn len(&self) -> usize {
        self.ids.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an endpoint touches, for [`Claims::authorize`].
#[derive(Debug, Clone, Copy)]
pub enum Access<'a> {
    /// Create or list all datasets, server-wide operations.
    Admin,
    /// Manage a dataset (archive, releases, labels).
    Curate(&'a str),
    /// Report steps or refreshes, read thresholds and status.
    Train(&'a str),
    /// Read one example's privacy.
    Example(&'a str, u64),
    /// Read DP-released aggregates and the worst case.
    View(&'a str),
    /// Use the stateless accountant (any valid token but a metrics token).
    Accountant,
    /// Scrape the Prometheus metrics (admin and metrics tokens).
    Metrics,
}

impl Claims {
    /// Allow or refuse `access`. The refusal says which permission is missing and
    /// nothing about the object.
    pub fn authorize(&self, access: Access<'_>) -> Result<(), Problem> {
        if self.role == Role::Admin {
            return Ok(());
        }
        // A shard of a sharded dataset (`{dataset}~{start}`, cluster mode) is
        // its dataset: the same roles, its example `i` the dataset's `start + i`.
        let shard = |d| owning_dataset(d).0;
        let access = match access {
            Access::Curate(d) => Access::Curate(shard(d)),
            Access::Train(d) => Access::Train(shard(d)),
            Access::View(d) => Access::View(shard(d)),
            Access::Example(d, id) => {
                let (d, start) = owning_dataset(d);
                Access::Example(d, start.saturating_add(id))
            }
            other => other,
        };
        let own = |d: &str| self.covers(d);
        let allowed = match access {
            Access::Admin => false,
            Access::Metrics => self.role == Role::Metrics,
            Access::Accountant => self.role != Role::Metrics,
            Access::Curate(d) => self.role == Role::Curator && own(d),
            Access::Train(d) => matches!(self.role, Role::Curator | Role::Trainer) && own(d),
            Access::Example(d, id) => match self.role {
                Role::Curator => own(d),
                Role::Owner => own(d) && self.examples.as_ref().is_some_and(|e| e.contains(&id)),
                _ => false,
            },
            Access::View(d) => own(d),
        };
        if allowed {
            Ok(())
        } else {
            Err(Problem::forbidden(
                format!(
                    "this {:?} token does not grant {}",
                    self.role,
                    match access {
                        Access::Admin => "administration",
                        Access::Accountant => "the accountant",
                        Access::Metrics => "scraping the metrics",
                        Access::Curate(_) => "curating this dataset",
                        Access::Train(_) => "training access to this dataset",
                        Access::Example(..) => "access to this example",
                        Access::View(_) => "viewing this dataset",
                    }
                )
                .to_lowercase(),
            ))
        }
    }

    /// Whether the token may see dataset `d` at all (for listings).
    pub fn sees_dataset(&self, d: &str) -> bool {
        self.role == Role::Admin || self.covers(owning_dataset(d).0)
    }

    /// Whether `d` is the token's dataset or one of its further datasets.
    fn covers(&self, d: &str) -> bool {
        self.dataset.as_deref() == Some(d) || self.datasets.as_ref().is_some_and(|s| s.contains(d))
    }

    /// The same claims, also covering `more` datasets with the same role (for
    /// `dpledger token --dataset A --dataset B`).
    pub fn covering(mut self, more: impl IntoIterator<Item = String>) -> anyhow::Result<Self> {
        if self.role.server_wide() {
            anyhow::bail!("a server-wide token names no dataset");
        }
        let extra: BTreeSet<String> = more
            .into_iter()
            .filter(|d| self.dataset.as_deref() != Some(d))
            .collect();
        if !extra.is_empty() {
            self.datasets = Some(extra);
        }
        Ok(self)
    }
}

/// Default tolerance for clock skew between the token's issuer and this server
/// when checking `exp`, in seconds. The JWT library's own default is 60 s, which
/// made a token minted with `--ttl 1m` last two minutes; expiry is a security
/// boundary, so the tolerance is explicit, small and set with `--token-leeway`.
pub const DEFAULT_TOKEN_LEEWAY_SECONDS: u64 = 5;

/// Verifies (and, with a local secret, mints) tokens.
pub struct Authorizer {
    decoding: DecodingKey,
    encoding: Option<EncodingKey>,
    validation: Validation,
    revoked: std::sync::Arc<Revocations>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Authorizer")
            .field("can_mint", &self.encoding.is_some())
            .field("algorithms", &self.validation.algorithms)
            .finish()
    }
}

impl Authorizer {
    /// HS256 with a server secret: verifies and mints.
    pub fn hs256(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.leeway = DEFAULT_TOKEN_LEEWAY_SECONDS;
        Self {
            decoding: DecodingKey::from_secret(secret),
            encoding: Some(EncodingKey::from_secret(secret)),
            validation,
            revoked: Default::default(),
        }
    }

    /// An external identity provider's public key (PEM): verifies only.
    pub fn external(
        pem: &[u8],
        algorithm: Algorithm,
        issuer: Option<&str>,
    ) -> anyhow::Result<Self> {
        let decoding = match algorithm {
            Algorithm::EdDSA => DecodingKey::from_ed_pem(pem)?,
            Algorithm::RS256 => DecodingKey::from_rsa_pem(pem)?,
            other => anyhow::bail!("unsupported algorithm {other:?}: use EdDSA or RS256"),
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = DEFAULT_TOKEN_LEEWAY_SECONDS;
        if let Some(iss) = issuer {
            validation.set_issuer(&[iss]);
        }
        Ok(Self {
            decoding,
            encoding: None,
            validation,
            revoked: Default::default(),
        })
    }

    /// Accept tokens up to `seconds` after their `exp` (clock skew between the
    /// issuer and this server). See [`DEFAULT_TOKEN_LEEWAY_SECONDS`].
    pub fn with_leeway(mut self, seconds: u64) -> Self {
        self.validation.leeway = seconds;
        self
    }

    /// The revoked token ids this authorizer refuses.
    pub fn revocations(&self) -> &std::sync::Arc<Revocations> {
        &self.revoked
    }

    /// Whether this authorizer can mint tokens (HS256 with a local secret).
    pub fn can_mint(&self) -> bool {
        self.encoding.is_some()
    }

    /// The tolerance applied to `exp`, in seconds.
    pub fn leeway(&self) -> u64 {
        self.validation.leeway
    }

    /// Verify a bearer token. Errors never echo the token.
    pub fn verify(&self, token: &str) -> Result<Claims, Problem> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| {
                Problem::unauthorized(format!("invalid bearer token: {}", describe(&e)))
            })?;
        let claims = data.claims;
        if claims
            .jti
            .as_deref()
            .is_some_and(|jti| self.revoked.contains(jti))
        {
            return Err(Problem::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "token-revoked",
                "this bearer token was revoked",
            ));
        }
        if !claims.role.server_wide() && claims.dataset.is_none() {
            return Err(Problem::unauthorized(
                "invalid bearer token: a non-admin token must name a dataset",
            ));
        }
        if claims.role.server_wide() && claims.datasets.is_some() {
            return Err(Problem::unauthorized(
                "invalid bearer token: a server-wide token names no datasets",
            ));
        }
        if claims.role == Role::Metrics && claims.dataset.is_some() {
            return Err(Problem::unauthorized(
                "invalid bearer token: a metrics token is server-wide and names no dataset",
            ));
        }
        if claims.role == Role::Owner && claims.examples.as_ref().is_none_or(|e| e.is_empty()) {
            return Err(Problem::unauthorized(
                "invalid bearer token: an owner token must list its examples",
            ));
        }
        Ok(claims)
    }

    /// Mint a token (HS256 mode only).
    pub fn mint(&self, claims: &Claims) -> anyhow::Result<String> {
        let key = self.encoding.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "this server verifies an external identity provider's tokens and cannot mint"
            )
        })?;
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            key,
        )?)
    }
}

fn describe(e: &jsonwebtoken::errors::Error) -> &'static str {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "expired",
        K::InvalidSignature => "bad signature",
        K::InvalidIssuer => "wrong issuer",
        K::InvalidAlgorithm => "wrong algorithm",
        K::Json(_) => "malformed claims",
        _ => "malformed",
    }
}

/// Seconds since the Unix epoch.
pub fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Build claims for `dpledger token`.
pub fn claims_for(
    sub: &str,
    role: Role,
    dataset: Option<String>,
    examples: Option<BTreeSet<u64>>,
    ttl_seconds: u64,
) -> anyhow::Result<Claims> {
    if !role.server_wide() && dataset.is_none() {
        anyhow::bail!("--dataset is required for role {role:?}");
    }
    if role == Role::Metrics && dataset.is_some() {
        anyhow::bail!("a metrics token is server-wide: leave out --dataset");
    }
    if role == Role::Owner && examples.as_ref().is_none_or(|e| e.is_empty()) {
        anyhow::bail!("--examples is required for role owner");
    }
    if role != Role::Owner && examples.is_some() {
        anyhow::bail!("--examples only applies to role owner");
    }
    if ttl_seconds == 0 {
        anyhow::bail!(
            "invalid --ttl: a token's lifetime must be at least 1s (a token with none is \
             expired when minted)"
        );
    }
    let now = now_seconds();
    Ok(Claims {
        sub: sub.to_string(),
        role,
        dataset,
        datasets: None,
        examples,
        exp: now.saturating_add(ttl_seconds),
        iat: now,
        iss: ISSUER.to_string(),
        jti: Some(new_token_id()),
    })
}

/// A fresh token id: 128 random bits as 32 hex digits.
pub fn new_token_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = rand::random();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parse a TTL such as `30d`, `12h`, `15m`, `90s` or a number of seconds.
pub fn parse_ttl(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid --ttl {text:?}: expected e.g. 30d, 12h, 15m, 90s"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("invalid --ttl {text:?}: unit must be s, m, h or d"),
    };
    n.checked_mul(scale)
        .ok_or_else(|| anyhow::anyhow!("invalid --ttl {text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(
        auth: &Authorizer,
        role: Role,
        dataset: Option<&str>,
        examples: Option<&[u64]>,
    ) -> Claims {
        let claims = claims_for(
            "test",
            role,
            dataset.map(String::from),
            examples.map(|e| e.iter().copied().collect()),
            3600,
        )
        .unwrap();
        let jwt = auth.mint(&claims).unwrap();
        auth.verify(&jwt).unwrap()
    }

    #[test]
    fn a_shard_is_authorised_as_its_dataset_with_its_offset() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let owner = token(&auth, Role::Owner, Some("d1"), Some(&[7]));
        // Shard d1~5 holds examples 5.. of d1: its example 2 is d1's 7.
        assert!(owner.authorize(Access::Example("d1~5", 2)).is_ok());
        assert!(owner.authorize(Access::Example("d1~5", 7)).is_err());
        assert!(owner.authorize(Access::Example("d1~0", 7)).is_ok());
        assert!(owner.authorize(Access::Example("d2~0", 7)).is_err());
        let trainer = token(&auth, Role::Trainer, Some("d1"), None);
        assert!(trainer.authorize(Access::Train("d1~5")).is_ok());
        assert!(trainer.authorize(Access::Train("d10~5")).is_err());
        assert!(trainer.sees_dataset("d1~5") && !trainer.sees_dataset("d2~0"));
    }

    #[test]
    fn owner_sees_only_its_examples_of_its_dataset() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let owner = token(&auth, Role::Owner, Some("d1"), Some(&[7]));
        assert!(owner.authorize(Access::Example("d1", 7)).is_ok());
        assert!(owner.authorize(Access::Example("d1", 8)).is_err());
        assert!(owner.authorize(Access::Example("d2", 7)).is_err());
        assert!(owner.authorize(Access::Train("d1")).is_err());
        assert!(owner.authorize(Access::View("d1")).is_ok());
        assert!(owner.authorize(Access::Admin).is_err());
    }

    #[test]
    fn a_token_may_cover_several_runs_with_one_role() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let claims = claims_for("c", Role::Curator, Some("r1".into()), None, 600)
            .unwrap()
            .covering(["r2".to_string(), "r1".to_string()])
            .unwrap();
        let curator = auth.verify(&auth.mint(&claims).unwrap()).unwrap();
        assert_eq!(curator.datasets, Some(["r2".to_string()].into()));
        assert!(curator.authorize(Access::Curate("r1")).is_ok());
        assert!(curator.authorize(Access::Curate("r2")).is_ok());
        assert!(curator.authorize(Access::Curate("r3")).is_err());
        assert!(curator.sees_dataset("r2") && !curator.sees_dataset("r3"));
        let admin = claims_for("a", Role::Admin, None, None, 600).unwrap();
        assert!(admin.clone().covering(["r1".to_string()]).is_err());
        let mut forged = admin;
        forged.datasets = Some(["r1".to_string()].into());
        assert_eq!(
            auth.verify(&auth.mint(&forged).unwrap())
                .unwrap_err()
                .status,
            401
        );
    }

    #[test]
    fn trainer_and_viewer_scopes() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let trainer = token(&auth, Role::Trainer, Some("d1"), None);
        assert!(trainer.authorize(Access::Train("d1")).is_ok());
        assert!(trainer.authorize(Access::Train("d2")).is_err());
        assert!(trainer.authorize(Access::Example("d1", 0)).is_err());
        assert!(trainer.authorize(Access::Curate("d1")).is_err());
        let viewer = token(&auth, Role::Viewer, Some("d1"), None);
        assert!(viewer.authorize(Access::Train("d1")).is_err());
        assert!(viewer.authorize(Access::View("d1")).is_ok());
    }

    #[test]
    fn forged_expired_and_malformed_tokens_are_refused() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let other = Authorizer::hs256(b"another secret, another server!!");
        let claims = claims_for("x", Role::Admin, None, None, 3600).unwrap();
        assert!(auth.verify(&other.mint(&claims).unwrap()).is_err());
        let mut old = claims.clone();
        old.exp = 1;
        assert!(auth.verify(&auth.mint(&old).unwrap()).is_err());
        assert!(auth.verify("not.a.token").is_err());
        let err = auth.verify("garbage-secret-token").unwrap_err();
        assert!(!err.detail.contains("garbage-secret-token"));
    }

    /// An external identity provider signs with its Ed25519 key; the server holds
    /// only the public key: it accepts the provider's tokens, refuses others, and
    /// cannot mint.
    #[test]
    fn external_eddsa_tokens_are_verified_with_the_public_key() {
        use base64::Engine;
        use ring::signature::{Ed25519KeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        // SubjectPublicKeyInfo for Ed25519: fixed 12-byte prefix + the 32-byte key.
        let mut spki = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        spki.extend_from_slice(pair.public_key().as_ref());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(&spki)
        );
        let verifier =
            Authorizer::external(pem.as_bytes(), Algorithm::EdDSA, Some("https-idp")).unwrap();
        let mut claims = claims_for(
            "alice",
            Role::Owner,
            Some("d1".into()),
            Some([7].into()),
            600,
        )
        .unwrap();
        claims.iss = "https-idp".into();
        let signing = EncodingKey::from_ed_der(pkcs8.as_ref());
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &signing).unwrap();
        let verified = verifier.verify(&token).unwrap();
        assert_eq!(verified.examples, Some([7].into()));
        // Another key, another issuer, or an HS256 token: refused.
        let other = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let forged = jsonwebtoken::encode(
            &Header::new(Algorithm::EdDSA),
            &claims,
            &EncodingKey::from_ed_der(other.as_ref()),
        )
        .unwrap();
        assert!(verifier.verify(&forged).is_err());
        let mut wrong_issuer = claims.clone();
        wrong_issuer.iss = "someone-else".into();
        let t =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &wrong_issuer, &signing).unwrap();
        assert!(verifier.verify(&t).is_err());
        let hs = Authorizer::hs256(b"0123456789abcdef0123456789abcdef")
            .mint(&claims)
            .unwrap();
        assert!(verifier.verify(&hs).is_err());
        assert!(verifier.mint(&claims).is_err());
    }

    /// Mint claims for `role` that expired `ago` seconds ago.
    fn expired(auth: &Authorizer, ago: u64) -> String {
        let mut claims = claims_for("test", Role::Admin, None, None, 60).unwrap();
        claims.iat = now_seconds() - ago - 60;
        claims.exp = now_seconds() - ago;
        auth.mint(&claims).unwrap()
    }

    #[test]
    fn expired_tokens_are_refused_after_a_small_explicit_leeway() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        assert_eq!(auth.leeway(), DEFAULT_TOKEN_LEEWAY_SECONDS);
        // Beyond the leeway (the library's default of 60 s accepted this one).
        let late = expired(&auth, DEFAULT_TOKEN_LEEWAY_SECONDS + 10);
        let refused = auth.verify(&late).unwrap_err();
        assert_eq!(refused.status, 401);
        assert!(refused.detail.contains("expired"), "{}", refused.detail);
        // Configurable: an operator whose issuer's clock drifts may widen it.
        let wide = Authorizer::hs256(b"0123456789abcdef0123456789abcdef").with_leeway(120);
        assert!(wide.verify(&expired(&wide, 60)).is_ok());
        let none = Authorizer::hs256(b"0123456789abcdef0123456789abcdef").with_leeway(0);
        assert!(none.verify(&expired(&none, 2)).is_err());
    }

    #[test]
    fn revoked_tokens_are_refused_and_ttl_zero_is_not_minted() {
        let auth = Authorizer::hs256(b"0123456789abcdef0123456789abcdef");
        let claims = claims_for("x", Role::Admin, None, None, 60).unwrap();
        let jti = claims.jti.clone().expect("minted tokens carry an id");
        assert_eq!(jti.len(), 32);
        let token = auth.mint(&claims).unwrap();
        assert!(auth.verify(&token).is_ok());
        auth.revocations().insert(jti);
        let refused = auth.verify(&token).unwrap_err();
        assert_eq!(refused.status, 401);
        assert!(refused.detail.contains("revoked"), "{}", refused.detail);
        assert!(claims_for("x", Role::Admin, None, None, 0).is_err());
    }

    #[test]
    fn ttl_parsing() {
        assert_eq!(parse_ttl("30d").unwrap(), 30 * 86_400);
        assert_eq!(parse_ttl("90").unwrap(), 90);
        assert!(parse_ttl("3w").is_err());
        assert!(claims_for("x", Role::Owner, Some("d".into()), None, 1).is_err());
        assert!(claims_for("x", Role::Trainer, None, None, 1).is_err());
    }
}

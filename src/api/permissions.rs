//! Who may call what: the one table of the service's permissions.
//!
//! [`ENDPOINTS`] names, for every endpoint, the [`Scope`] its handler authorises;
//! what each role may do within a scope is decided by [`Claims::authorize`]. From
//! these two come, so that they cannot disagree:
//! - the permission matrix in `docs/security.md` ([`matrix_markdown`]; a test
//!   checks the document holds it verbatim),
//! - the authorisation line of every operation in the OpenAPI document,
//! - the integration test that sends every endpoint every role's token, for its
//!   own and another dataset and example, to the real server (`tests/api_authz.rs`).

use super::auth::{Access, Claims, Role, ISSUER};

/// What an endpoint's handler authorises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// No token needed (health, readiness, the OpenAPI document).
    Public,
    /// Any valid token; the answer covers only what the token may see.
    AnyToken,
    /// Server administration ([`Access::Admin`]).
    Admin,
    /// Curating the dataset ([`Access::Curate`]).
    Curate,
    /// Training access to the dataset ([`Access::Train`]).
    Train,
    /// One example's privacy ([`Access::Example`]).
    Example,
    /// The dataset's public and DP-released information ([`Access::View`]).
    View,
    /// The stateless accountant ([`Access::Accountant`]).
    Accountant,
    /// The Prometheus metrics ([`Access::Metrics`]).
    Metrics,
    /// Curating every run an analysis names ([`Access::Curate`] of each).
    CurateEveryRun,
    /// One example in every run an analysis names ([`Access::Example`] of each).
    ExampleEveryRun,
}

impl Scope {
    /// The access checked for `dataset` and `example`; `None` when no object is.
    pub fn access(self, dataset: &str, example: u64) -> Option<Access<'_>> {
        Some(match self {
            Scope::Public | Scope::AnyToken => return None,
            Scope::Admin => Access::Admin,
            Scope::Curate | Scope::CurateEveryRun => Access::Curate(dataset),
            Scope::Train => Access::Train(dataset),
            Scope::Example | Scope::ExampleEveryRun => Access::Example(dataset, example),
            Scope::View => Access::View(dataset),
            Scope::Accountant => Access::Accountant,
            Scope::Metrics => Access::Metrics,
        })
    }

    /// Its name in the matrix and in the OpenAPI document.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Public => "public",
            Scope::AnyToken => "any token",
            Scope::Admin => "admin",
            Scope::Curate => "curate",
            Scope::Train => "train",
            Scope::Example => "example",
            Scope::View => "view",
            Scope::Accountant => "accountant",
            Scope::Metrics => "metrics",
            Scope::CurateEveryRun => "curate every run",
            Scope::ExampleEveryRun => "example in every run",
        }
    }
}

/// One endpoint: method, path template (as in the OpenAPI document), scope.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template.
    pub path: &'static str,
    /// What its handler authorises.
    pub scope: Scope,
    /// Query template naming the objects when the path does not (`{dataset}`
    /// and `{example}` as in paths); empty for most endpoints.
    pub query: &'static str,
}

const fn ep(method: &'static str, path: &'static str, scope: Scope) -> Endpoint {
    Endpoint {
        method,
        path,
        scope,
        query: "",
    }
}

/// An endpoint whose objects are named in its query (the runs of an analysis).
const fn epq(
    method: &'static str,
    path: &'static str,
    query: &'static str,
    scope: Scope,
) -> Endpoint {
    Endpoint {
        method,
        path,
        scope,
        query,
    }
}

/// Every endpoint of the JSON API and its scope.
pub const ENDPOINTS: &[Endpoint] = &[
    ep("GET", "/healthz", Scope::Public),
    ep("GET", "/readyz", Scope::Public),
    ep("GET", "/openapi.json", Scope::Public),
    ep("GET", "/metrics", Scope::Metrics),
    ep("POST", "/v1/datasets", Scope::Admin),
    ep("GET", "/v1/admin/storage", Scope::Admin),
    ep("POST", "/v1/admin/tokens", Scope::Admin),
    ep("POST", "/v1/admin/tokens/{jti}/revoke", Scope::Admin),
    ep("GET", "/v1/cluster", Scope::AnyToken),
    ep("POST", "/v1/cluster/nodes/{node}/drain", Scope::Admin),
    ep("GET", "/v1/datasets", Scope::AnyToken),
    ep("GET", "/v1/datasets/{dataset}", Scope::Train),
    ep("POST", "/v1/datasets/{dataset}/steps", Scope::Train),
    ep("GET", "/v1/datasets/{dataset}/thresholds", Scope::Train),
    ep("POST", "/v1/datasets/{dataset}/refresh", Scope::Train),
    ep(
        "GET",
        "/v1/datasets/{dataset}/examples/{example}/privacy",
        Scope::Example,
    ),
    ep("GET", "/v1/datasets/{dataset}/worst-case", Scope::View),
    ep("GET", "/v1/datasets/{dataset}/releases", Scope::View),
    ep("GET", "/v1/datasets/{dataset}/releases/latest", Scope::View),
    ep("POST", "/v1/datasets/{dataset}/releases", Scope::Curate),
    ep("GET", "/v1/datasets/{dataset}/release-budget", Scope::View),
    ep(
        "PUT",
        "/v1/datasets/{dataset}/release-budget",
        Scope::Curate,
    ),
    ep("GET", "/v1/datasets/{dataset}/release-policy", Scope::View),
    ep(
        "PUT",
        "/v1/datasets/{dataset}/release-policy",
        Scope::Curate,
    ),
    ep("PUT", "/v1/datasets/{dataset}/labels", Scope::Curate),
    ep("POST", "/v1/datasets/{dataset}/archive", Scope::Curate),
    epq(
        "GET",
        "/v1/analyses/data-dependent",
        "runs={dataset},{dataset}",
        Scope::CurateEveryRun,
    ),
    epq(
        "GET",
        "/v1/analyses/data-dependent/examples/{example}",
        "runs={dataset},{dataset}",
        Scope::ExampleEveryRun,
    ),
    ep("POST", "/v1/accountant/rdp", Scope::Accountant),
    ep("POST", "/v1/accountant/epsilon", Scope::Accountant),
    ep("POST", "/v1/accountant/noise", Scope::Accountant),
    ep("POST", "/v1/accountant/compare", Scope::Accountant),
    ep("POST", "/v1/accountant/schedule", Scope::Accountant),
];

/// The endpoint of `method` and `path` (a template), if listed.
pub fn endpoint(method: &str, path: &str) -> Option<&'static Endpoint> {
    ENDPOINTS
        .iter()
        .find(|e| e.method.eq_ignore_ascii_case(method) && e.path == path)
}

/// Every role, in the matrix's column order.
pub const ROLES: [Role; 6] = [
    Role::Admin,
    Role::Curator,
    Role::Trainer,
    Role::Owner,
    Role::Viewer,
    Role::Metrics,
];

/// A token of `role`, bound (unless server-wide) to dataset `d` and, for an
/// owner, example 3: the reference token of the matrix.
pub fn reference_claims(role: Role) -> Claims {
    Claims {
        sub: "matrix".into(),
        role,
        dataset: (!role.server_wide()).then(|| "d".to_string()),
        datasets: None,
        examples: (role == Role::Owner).then(|| [3].into_iter().collect()),
        exp: u64::MAX,
        iat: 0,
        iss: ISSUER.into(),
        jti: None,
    }
}

/// Whether `role`'s reference token may call an endpoint of `scope` on its own
/// dataset (`own_dataset`) or another, for its own example (3) or another (4).
pub fn allows(role: Role, scope: Scope, own_dataset: bool, own_example: bool) -> bool {
    let dataset = if own_dataset { "d" } else { "other" };
    let example = if own_example { 3 } else { 4 };
    match scope.access(dataset, example) {
        None => true,
        Some(access) => reference_claims(role).authorize(access).is_ok(),
    }
}

/// What a role may do within a scope, in words. For the analyses over several
/// runs, "its" means every run named (a token may cover several datasets).
pub fn cell(role: Role, scope: Scope) -> &'static str {
    let every_run = matches!(scope, Scope::CurateEveryRun | Scope::ExampleEveryRun);
    if allows(role, scope, false, false) {
        "yes"
    } else if allows(role, scope, true, false) {
        if every_run {
            "all its runs"
        } else {
            "its dataset"
        }
    } else if allows(role, scope, true, true) {
        if every_run {
            "its examples in all its runs"
        } else {
            "its examples"
        }
    } else {
        "no"
    }
}

/// How a role is written in the matrix's header.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Admin => "admin",
        Role::Curator => "curator",
        Role::Trainer => "trainer",
        Role::Owner => "owner",
        Role::Viewer => "viewer",
        Role::Metrics => "metrics",
    }
}

/// The permission matrix as a Markdown table (held verbatim by
/// `docs/security.md`).
pub fn matrix_markdown() -> String {
    let mut out = String::from("| endpoint | scope | no token |");
    for role in ROLES {
        out.push_str(&format!(" {} |", role_name(role)));
    }
    out.push_str("\n|---|---|---|");
    out.push_str(&"---|".repeat(ROLES.len()));
    out.push('\n');
    for e in ENDPOINTS {
        out.push_str(&format!(
            "| `{} {}` | {} | {} |",
            e.method,
            e.path,
            e.scope.name(),
            if e.scope == Scope::Public {
                "yes"
            } else {
                "no"
            }
        ));
        for role in ROLES {
            out.push_str(&format!(" {} |", cell(role, e.scope)));
        }
        out.push('\n');
    }
    out
}

/// The authorisation sentence of an operation in the OpenAPI document.
pub fn openapi_sentence(scope: Scope) -> String {
    if scope == Scope::Public {
        return "Authorisation: none (public).".into();
    }
    let who: Vec<String> = ROLES
        .iter()
        .filter_map(|&role| match cell(role, scope) {
            "no" => None,
            "yes" => Some(role_name(role).to_string()),
            what => Some(format!("{} ({what})", role_name(role))),
        })
        .collect();
    format!(
        "Authorisation ({} scope): {}.",
        scope.name(),
        who.join(", ")
    )
}

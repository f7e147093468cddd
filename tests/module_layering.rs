//! The module structure stays a layering: no import cycle between
//! sibling modules anywhere in `src/` (top-level modules included), and the lower
//! layers never reach up: `engine` knows nothing of `api` or HTTP, and `ledger`,
//! `release`, `store` and `accounting` know nothing of `engine` or `api`; `api`
//! does not use `store`, and of `cli` only `cli::server` (serve) uses `api`.
//!
//! Method: every file under `src/` is a module (`a/b.rs` and `a/b/mod.rs` are
//! `a::b`). Each path it names outside comments (`crate::x::y`, `super::x`,
//! `self::x`, with `{..}` groups expanded) is resolved to a module; a reference
//! from `p` to `r` is an edge between the two children of their deepest common
//! ancestor (`api::routes` -> `api::dataset_routes`, `api` -> `engine`). The
//! edges of each family of siblings must form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

fn modules(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut p = prefix.clone();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut p = prefix.clone();
            if !matches!(name.as_str(), "mod" | "lib" | "main") {
                p.push(name);
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            out.entry(p).or_default().push_str(&code);
        }
    }
}

/// The paths named at `s` (just after `crate::`, `super::` or `self::`), as lists
/// of segments relative to `base`.
fn expand(s: &str, base: Module, out: &mut Vec<Module>) {
    let mut path = base;
    let mut rest = s;
    loop {
        let rest_trim = rest.trim_start();
        if let Some(inner) = rest_trim.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        expand(&inner[start..i], path.clone(), out);
                        start = i + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let ident: String = rest_trim
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        if ident == "super" {
            path.pop();
        } else if ident != "self" {
            path.push(ident.clone());
        }
        rest = &rest_trim[ident.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out.push(path);
}

fn references(module: &Module, code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    // `expand` pops one segment per `super` (from `a::b`, `super` is `a`).
    for (kw, base) in [
        ("crate::", Vec::new()),
        ("super::", module.clone()),
        ("self::", module.clone()),
    ] {
        for (i, _) in code.match_indices(kw) {
            let before = code[..i].chars().last().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' || before == ':' {
                continue;
            }
            let start = if kw == "super::" { i } else { i + kw.len() };
            expand(&code[start..], base.clone(), &mut out);
        }
    }
    out
}

#[test]
fn no_import_cycles_and_layers_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    modules(&src, &Vec::new(), &mut files);
    // Edges between siblings, keyed by their parent.
    let mut edges: BTreeMap<Module, BTreeSet<(String, String)>> = BTreeMap::new();
    for (module, code) in &files {
        for r in references(module, code) {
            let common = module.iter().zip(&r).take_while(|(a, b)| a == b).count();
            if common >= module.len() || common >= r.len() {
                continue; // a module and its own ancestor or descendant
            }
            let target: Module = r[..=common].to_vec();
            if !files.contains_key(&target) {
                continue; // an item of the common ancestor, not a sibling module
            }
            edges
                .entry(module[..common].to_vec())
                .or_default()
                .insert((module[common].clone(), r[common].clone()));
        }
    }
    assert!(
        edges.get(&Vec::new()).is_some_and(|e| !e.is_empty()),
        "the scan found no edges between top-level modules: {edges:?}"
    );
    for (parent, family) in &edges {
        let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in family {
            graph.entry(a).or_default().push(b);
        }
        // Depth-first search for a back edge.
        fn visit<'a>(
            n: &'a str,
            g: &BTreeMap<&'a str, Vec<&'a str>>,
            state: &mut BTreeMap<&'a str, u8>,
            stack: &mut Vec<&'a str>,
        ) -> Option<Vec<String>> {
            state.insert(n, 1);
            stack.push(n);
            for &m in g.get(n).into_iter().flatten() {
                match state.get(m) {
                    Some(1) => {
                        let at = stack.iter().position(|&x| x == m).unwrap();
                        let mut cycle: Vec<String> =
                            stack[at..].iter().map(|s| s.to_string()).collect();
                        cycle.push(m.to_string());
                        return Some(cycle);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = visit(m, g, state, stack) {
                            return Some(c);
                        }
                    }
                }
            }
            stack.pop();
            state.insert(n, 2);
            None
        }
        let mut state = BTreeMap::new();
        for &n in graph.keys() {
            if !state.contains_key(n) {
                let cycle = visit(n, &graph, &mut state, &mut Vec::new());
                assert!(
                    cycle.is_none(),
                    "import cycle among the children of crate::{}: {}",
                    parent.join("::"),
                    cycle.unwrap().join(" -> ")
                );
            }
        }
    }
    let top = &edges[&Vec::new()];
    let forbidden = [
        ("engine", "api"),
        ("engine", "cli"),
        ("ledger", "engine"),
        ("ledger", "api"),
        ("release", "engine"),
        ("release", "api"),
        ("store", "engine"),
        ("store", "api"),
        ("accounting", "engine"),
        ("accounting", "api"),
    ];
    for (from, to) in forbidden {
        assert!(
            !top.contains(&(from.to_string(), to.to_string())),
            "crate::{from} must not use crate::{to}"
        );
    }
    // Two arrows that pointed the wrong way: the CLI reaches the HTTP
    // layer only to serve it (`cli::server`: serve, token, openapi), and handlers
    // never touch the store (the engine does; the wire encoding is the ledger's).
    for (module, code) in &files {
        let tops: BTreeSet<String> = references(module, code)
            .into_iter()
            .filter_map(|r| r.first().cloned())
            .collect();
        let name = module.join("::");
        if module.first().is_some_and(|m| m == "cli") && name != "cli::server" {
            assert!(
                !tops.contains("api"),
                "crate::{name} uses crate::api: only cli::server (serve) may"
            );
        }
        if module.first().is_some_and(|m| m == "api") {
            assert!(
                !tops.contains("store"),
                "crate::{name} uses crate::store: handlers go through the engine"
            );
        }
    }
    for (module, code) in &files {
        if module.first().is_some_and(|m| m == "engine") {
            for word in ["axum", "http::", "StatusCode", "Problem"] {
                assert!(
                    !code.contains(word),
                    "crate::{} mentions {word}: the engine knows nothing of HTTP",
                    module.join("::")
                );
            }
        }
    }
}

/// The `pub use` and `pub(..) use` declarations of `code`, each from just
/// after `use` to its `;`.
fn reexports(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("pub") {
        let before = code[..i].chars().last().unwrap_or(' ');
        if before.is_alphanumeric() || before == '_' {
            continue;
        }
        let mut rest = &code[i + "pub".len()..];
        if let Some(scoped) = rest.trim_start().strip_prefix('(') {
            // `pub(crate)`, `pub(super)`, `pub(in path)`.
            let Some(close) = scoped.find(')') else {
                continue;
            };
            rest = &scoped[close + 1..];
        }
        let Some(after) = rest.trim_start().strip_prefix("use") else {
            continue;
        };
        if !after.starts_with(char::is_whitespace) {
            continue;
        }
        out.push(&after[..after.find(';').unwrap_or(after.len())]);
    }
    out
}

/// The store paths that the re-exports in `code` (module `module`) name.
fn store_reexports(module: &Module, code: &str) -> Vec<String> {
    reexports(code)
        .into_iter()
        .flat_map(|decl| references(module, decl))
        .filter(|r| r.first().is_some_and(|t| t == "store"))
        .map(|r| r.join("::"))
        .collect()
}

/// The engine exposes its own types: a store type re-exported by the engine
/// would reach the HTTP API and the CLI through it, so that they depend on the
/// store after all. An engine type that stands for a store's converts at the
/// store boundary (`From` in the engine); a concept the store only keeps (an
/// idempotency key) lives below both, in the ledger.
#[test]
fn the_engine_reexports_no_store_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    modules(&src, &Vec::new(), &mut files);
    let mut seen = 0;
    for (module, code) in &files {
        if module.first().is_some_and(|m| m == "engine") {
            seen += reexports(code).len();
            let found = store_reexports(module, code);
            assert!(
                found.is_empty(),
                "crate::{} re-exports {}: the engine exposes its own types (convert at the \
                 store boundary), never the store's",
                module.join("::"),
                found.join(", ")
            );
        }
    }
    assert!(seen > 0, "the scan found no `pub use` in crate::engine");
}

/// The scan finds the forms a re-export of the store takes, and only those.
#[test]
fn store_reexports_are_recognised() {
    let cluster: Module = vec!["engine".into(), "cluster".into()];
    for decl in [
        "pub use crate::store::{valid_key, IdempotencyKey};",
        "pub use crate::store::cluster::LeaseRow;",
        "pub(crate) use crate::store::RecordKind;",
        "pub use crate::{ledger::Ledger, store::cluster::{new_change_id, Decision}};",
        "pub(super) use super::super::store::cluster::LayoutRow;",
        "pub\n    use crate::store::cluster::{\n        CrossCommit,\n    };",
    ] {
        assert!(
            !store_reexports(&cluster, decl).is_empty(),
            "missed: {decl}"
        );
    }
    for decl in [
        "use crate::store::cluster::LeaseRow;",
        "pub use crate::ledger::IdempotencyKey;",
        "pub use super::shards::ShardLayout;",
        "pub fn view() -> crate::store::cluster::NodeRow {}",
        "pub user: crate::store::X,",
    ] {
        assert!(
            store_reexports(&cluster, decl).is_empty(),
            "not one: {decl}"
        );
    }
}

/// The signatures of the plain `pub` functions in `code` (from `fn` to the
/// body's `{` or the `;`), with the name of each.
fn pub_signatures(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("pub ") {
        let before = code[..i].chars().last().unwrap_or(' ');
        if before.is_alphanumeric() || before == '_' || before == '(' {
            continue;
        }
        let rest = code[i + "pub ".len()..].trim_start();
        let rest = rest.strip_prefix("async ").unwrap_or(rest).trim_start();
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        let end = sig.find(['{', ';']).unwrap_or(sig.len());
        let name: String = sig
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push((name, sig[..end].to_string()));
    }
    out
}

/// The names a module imports from the store (`use crate::store::...`).
fn store_imports(module: &Module, code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("use ") {
        let before = code[..i].chars().last().unwrap_or(' ');
        if before.is_alphanumeric() || before == '_' {
            continue;
        }
        let decl = &code[i + "use ".len()..];
        let decl = &decl[..decl.find(';').unwrap_or(decl.len())];
        for r in references(module, decl) {
            if r.first().is_some_and(|t| t == "store") {
                if let Some(last) = r.last().filter(|_| r.len() > 1) {
                    names.insert(last.clone());
                }
            }
        }
    }
    names
}

/// The engine's public functions speak the engine's types: one that takes or
/// returns a store type (a stored key, a store's commit outcome) hands the
/// store to its callers after all. The store itself is given only to the
/// constructors that build an engine on it.
#[test]
fn engine_functions_take_and_return_no_store_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    modules(&src, &Vec::new(), &mut files);
    // Building an engine (or a cluster node's) on a store, and commands that
    // run on a store before there is an engine.
    let constructors = ["recover", "for_cluster", "compact_store"];
    let mut seen = 0;
    let mut found = Vec::new();
    for (module, code) in &files {
        if module.first().is_none_or(|m| m != "engine") {
            continue;
        }
        let imported = store_imports(module, code);
        for (name, sig) in pub_signatures(code) {
            seen += 1;
            if constructors.contains(&name.as_str()) {
                continue;
            }
            let words: BTreeSet<&str> = sig
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect();
            let named: Vec<&String> = imported
                .iter()
                .filter(|n| words.contains(n.as_str()) && n.as_str() != "store")
                .collect();
            if sig.contains("store::") || !named.is_empty() {
                let path = format!("{}::{name}", module.join("::"));
                found.push(format!("crate::{path}: {}", sig.trim()));
            }
        }
    }
    assert!(
        seen > 50,
        "the scan found only {seen} public engine functions"
    );
    assert!(
        found.is_empty(),
        "engine functions that take or return a store type (convert at the store boundary \
         and give callers the engine's own):\n{}",
        found.join("\n")
    );
}

/// Changes across shards are coordinated in one place, the engine's
/// `sharding` module, which reaches other nodes only through its `Peers`
/// (implemented over HTTP in `api::cluster`): it names no HTTP crate, and the
/// HTTP layer names none of the protocol's steps (it hands a change to the
/// coordinator, and an owner's part to the engine), so that a coordinator in
/// the HTTP layer cannot come back.
#[test]
fn shard_changes_are_coordinated_by_the_engine_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    modules(&src, &Vec::new(), &mut files);
    let sharding: Vec<&Module> = files
        .keys()
        .filter(|m| m.starts_with(&["engine".to_string(), "sharding".to_string()]))
        .collect();
    assert!(!sharding.is_empty(), "no crate::engine::sharding");
    for (module, code) in &files {
        if module.first().is_some_and(|m| m == "engine") {
            for word in ["reqwest", "hyper::", "HeaderValue", "tower::"] {
                assert!(
                    !code.contains(word),
                    "crate::{} mentions {word}: the engine reaches other nodes through its \
                     Peers, never over HTTP itself",
                    module.join("::")
                );
            }
        }
        if module.first().is_some_and(|m| m == "api") {
            for step in [
                "commit_each_across",
                "release_of_shards",
                "ShardRecordKind",
                "new_change_id",
                "prepare_shard_change",
                "sharded_key",
                "split_labels",
                "dataset_label_names",
            ] {
                assert!(
                    !code.contains(step),
                    "crate::{} names {step}: changes across shards are coordinated by \
                     crate::engine::sharding, not the HTTP layer",
                    module.join("::")
                );
            }
        }
    }
    // The coordinator's commit is the engine's alone.
    for (module, code) in &files {
        let name = module.join("::");
        if code.contains("commit_each_across(") {
            assert!(
                name.starts_with("engine::sharding"),
                "crate::{name} commits a change across shards: only the coordinator does"
            );
        }
    }
}

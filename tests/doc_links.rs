//! The repository stands alone: every relative link and `#anchor` in
//! every Markdown file resolves (anchors as GitHub slugs headings), every test that
//! `docs/spec.md` names (`path::function`) is defined in its file, and no file
//! refers to the shared directory outside the repository.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of the repository, skipping build outputs, virtual environments and
/// other hidden directories (`.git`, `.venv-*`).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let skip = name.starts_with('.')
                || name.starts_with("target")
                || ["node_modules", "__pycache__"].contains(&name.as_str())
                || name.ends_with(".egg-info");
            if !skip {
                files(&path, out);
            }
        } else if kind.is_file() {
            out.push(path);
        }
    }
}

fn repo_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(&root(), &mut out);
    out.sort();
    out
}

fn markdown_files() -> Vec<PathBuf> {
    repo_files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect()
}

/// The lines of a Markdown file outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` without its inline code spans (links inside them are not links).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The heading text as GitHub renders it: code spans keep their text, links
/// their label, emphasis markers go.
fn heading_text(raw: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '`' | '*' => {}
            '[' => {
                // [label](target): keep the label, drop the target.
                if let Some(close) = chars[i..].iter().position(|&c| c == ']') {
                    let close = i + close;
                    if chars.get(close + 1) == Some(&'(') {
                        if let Some(end) = chars[close..].iter().position(|&c| c == ')') {
                            out.extend(&chars[i + 1..close]);
                            i = close + end + 1;
                            continue;
                        }
                    }
                }
                out.push('[');
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_`
/// removed, spaces become `-`.
fn slug(text: &str) -> String {
    heading_text(text)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a Markdown file (duplicates numbered `-1`, `-2`, as GitHub does).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Inline link and image targets of one line: `[label](target "title")`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    out
}

fn is_external(target: &str) -> bool {
    target.starts_with("//")
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
        })
}

/// `base/relative` with `.` and `..` resolved lexically.
fn join(base: &Path, relative: &str) -> PathBuf {
    let mut out = base.to_path_buf();
    for part in Path::new(relative).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = root();
    let mut anchor_cache: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(&root).unwrap().display().to_string();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    join(file.parent().unwrap(), path)
                };
                if !resolved.starts_with(&root) || !resolved.exists() {
                    broken.push(format!("{shown}:{n}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if resolved.extension().is_none_or(|e| e != "md") {
                    broken.push(format!(
                        "{shown}:{n}: {target}: an anchor into a file that is not Markdown"
                    ));
                    continue;
                }
                let known = anchor_cache
                    .entry(resolved.clone())
                    .or_insert_with(|| anchors(&fs::read_to_string(&resolved).unwrap_or_default()));
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{shown}:{n}: {target}: no heading has the anchor #{anchor}"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_test_the_spec_names_exists() {
    let root = root();
    let spec = fs::read_to_string(root.join("docs/spec.md")).unwrap();
    let mut named = 0;
    let mut missing = Vec::new();
    for span in spec.split('`').skip(1).step_by(2) {
        let Some((path, function)) = span.split_once("::") else {
            continue;
        };
        if !(path.ends_with(".rs") && function.chars().all(|c| c.is_alphanumeric() || c == '_')) {
            continue;
        }
        named += 1;
        let source = fs::read_to_string(root.join(path)).unwrap_or_default();
        let defined = source.contains(&format!("fn {function}("));
        let is_test = source
            .split(&format!("fn {function}("))
            .next()
            .and_then(|before| before.rsplit("\n\n").next())
            .is_some_and(|attrs| attrs.contains("#[test]") || attrs.contains("::test"));
        if !(defined && is_test) {
            missing.push(format!("{path}::{function}"));
        }
    }
    assert!(
        named > 40,
        "only {named} tests named: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "named in docs/spec.md but not a test there: {missing:?}"
    );
}

#[test]
fn nothing_refers_to_the_shared_directory_outside_the_repository() {
    // Built from pieces so that this file does not match itself.
    let patterns = [
        format!("../{}", "shared"),
        format!("shared/{}", "spec"),
        format!("shared/{}", "seeds"),
    ];
    let mut found = Vec::new();
    let root = root();
    for file in repo_files() {
        let Ok(text) = fs::read_to_string(&file) else {
            continue; // not text (a screenshot, say)
        };
        for (n, line) in text.lines().enumerate() {
            if patterns.iter().any(|p| line.contains(p.as_str())) {
                let shown = file.strip_prefix(&root).unwrap().display();
                found.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the contract is docs/spec.md; these refer outside the repository:\n{}",
        found.join("\n")
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("3. The ledger protocol (what makes the numbers a guarantee)"),
        "3-the-ledger-protocol-what-makes-the-numbers-a-guarantee"
    );
    assert_eq!(
        slug("7. Individual filter (Feldman & Zrnic 2021)"),
        "7-individual-filter-feldman--zrnic-2021"
    );
    assert_eq!(
        slug("The PLD worst case in the service (spec §8)"),
        "the-pld-worst-case-in-the-service-spec-8"
    );
    assert_eq!(slug("`/dashboard`"), "dashboard");
    assert_eq!(
        slug("Per-example PLD estimate (`method=pld_estimate`, not a guarantee)"),
        "per-example-pld-estimate-methodpld_estimate-not-a-guarantee"
    );
    let doubled = anchors("# A\n\n```sh\n# not a heading\n```\n## A\n");
    assert_eq!(doubled, HashSet::from(["a".to_string(), "a-1".to_string()]));
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](no.md)` and ![i](p.png \"t\")"),
        vec!["a.md#b".to_string(), "p.png".to_string()]
    );
}

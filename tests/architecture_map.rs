//! The documentation follows the code.
//!
//! * `docs/architecture.md`'s module map names every file under `src/`, each
//!   with its job, and names no file that does not exist.
//! * No tracker numbers in `src/`, `docs/` or `README.md`: a reader has no
//!   tracker to resolve them, so each names its concept or links the doc
//!   section instead (history belongs in `CHANGELOG.md`).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir`, as paths relative to `base` with `/` separators.
fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            walk(base, &path, out);
        } else if kind.is_file() {
            let rel = path.strip_prefix(base).expect("under base");
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(rel.join("/"));
        }
    }
}

/// The rows of the module map: `| `path` | job |` lines between the heading
/// `## Module map` and the next `## ` heading.
fn module_map(text: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == "## Module map";
            continue;
        }
        if !inside || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let path = cells[0].trim().trim_matches('`').to_string();
        let job = cells
            .get(1)
            .map(|j| j.trim().to_string())
            .unwrap_or_default();
        rows.push((path, job));
    }
    rows
}

#[test]
fn the_module_map_names_every_file_under_src() {
    let text = fs::read_to_string(root().join("docs/architecture.md")).expect("architecture.md");
    let rows = module_map(&text);
    assert!(
        rows.len() > 50,
        "docs/architecture.md has no \"## Module map\" table of `path` | job rows"
    );
    let mut named = BTreeSet::new();
    for (path, job) in &rows {
        assert!(
            !job.is_empty(),
            "docs/architecture.md names `{path}` without saying its job"
        );
        assert!(
            named.insert(path.clone()),
            "docs/architecture.md names `{path}` twice in its module map"
        );
    }
    let src = root().join("src");
    let mut files = Vec::new();
    walk(&src, &src, &mut files);
    let files: BTreeSet<String> = files.into_iter().collect();
    let unnamed: Vec<&String> = files.difference(&named).collect();
    let missing: Vec<&String> = named.difference(&files).collect();
    assert!(
        unnamed.is_empty(),
        "files under src/ missing from docs/architecture.md's module map \
         (add a row `| `path` | its one job |`): {unnamed:?}"
    );
    assert!(
        missing.is_empty(),
        "docs/architecture.md's module map names files that do not exist under src/: {missing:?}"
    );
}

/// Where `text` cites a tracker number: "issue 26", "issue-26", "issues 14
/// and 24", in any case. Returns the offending lines.
fn tracker_numbers(text: &str) -> Vec<(usize, String)> {
    let mut hits = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let bytes = lower.as_bytes();
        let mut from = 0;
        while let Some(at) = lower[from..].find("issue") {
            let mut i = from + at + "issue".len();
            if bytes.get(i) == Some(&b's') {
                i += 1;
            }
            if matches!(bytes.get(i), Some(b' ') | Some(b'-'))
                && bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit())
            {
                hits.push((n + 1, line.trim().to_string()));
                break;
            }
            from = from + at + 1;
        }
    }
    hits
}

#[test]
fn no_tracker_numbers_in_src_docs_or_readme() {
    let base = root();
    let mut files = Vec::new();
    for dir in ["src", "docs"] {
        walk(&base, &base.join(dir), &mut files);
    }
    files.push("README.md".to_string());
    let mut found = Vec::new();
    for rel in files {
        // Text files only (screenshots and other binaries are skipped).
        let Ok(text) = fs::read_to_string(base.join(&rel)) else {
            continue;
        };
        for (line, content) in tracker_numbers(&text) {
            found.push(format!("{rel}:{line}: {content}"));
        }
    }
    assert!(
        found.is_empty(),
        "tracker numbers a reader cannot resolve (name the concept or link the doc \
         section; history goes to CHANGELOG.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_tracker_number_check_sees_what_it_should() {
    assert_eq!(tracker_numbers("see issue 26, item 4").len(), 1);
    assert_eq!(tracker_numbers("the issue-15 grid").len(), 1);
    assert_eq!(tracker_numbers("Issues 14 and 24").len(), 1);
    assert!(tracker_numbers("the issuer and this server").is_empty());
    assert!(tracker_numbers("no issue here; issue tracking").is_empty());
}

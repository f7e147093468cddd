//! The README's walk-through, run against the real server.
//!
//! The first `sh` block under "## Walk-through" is read line by line: `serve`
//! starts the binary (on a free port and a temporary data directory instead of
//! `localhost:8080` and `./data`), the wait loop is checked to wait for the
//! token file and the server, `NAME=$(...)` lines read the admin token or mint
//! a token with `dpledger token`, and every `curl` is sent as written (method,
//! headers with the variables filled in, body). The comment lines right after a
//! `curl` are its answer as the README shows it: an optional status, then JSON
//! in which `...` stands for members or items left out. The test requires the
//! real answer to have the status (2xx when none is shown), the same keys in
//! every object shown whole, every key shown in an object with `...`, the same
//! strings (a `…` or `...` inside a string skips text), and the same numbers
//! within rounding (0.5% relative; integers exactly). So it fails when the
//! README's shapes or numbers go stale. Any other line in the block fails the
//! test: what a reader pastes is what is checked.

mod common;

use common::*;
use serde_json::Value;
use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

fn readme() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md");
    fs::read_to_string(path).expect("README.md")
}

/// The first ```sh block after the "## Walk-through" heading.
fn walkthrough_block(text: &str) -> Vec<String> {
    let start = text
        .find("\n## Walk-through")
        .expect("README.md has a \"## Walk-through\" section");
    let rest = &text[start..];
    let open = rest
        .find("```sh\n")
        .expect("a ```sh block in the walk-through")
        + 6;
    let close = rest[open..].find("\n```").expect("the block's end") + open;
    rest[open..close].lines().map(String::from).collect()
}

/// One line a reader pastes, with the comment lines that follow it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// Join `\` continuations; attach the comment lines right after a command (up
/// to a blank line) to it as its shown answer. Comments after a blank line are
/// notes for the reader and are not checked.
fn steps(block: &[String]) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut pending = String::new();
    let mut attach = false;
    for line in block {
        let trimmed = line.trim();
        if pending.is_empty() && trimmed.starts_with('#') {
            if attach {
                let shown = trimmed.trim_start_matches('#').trim().to_string();
                out.last_mut().expect("a command").shown.push(shown);
            }
            continue;
        }
        if trimmed.is_empty() {
            attach = false;
            continue;
        }
        // Bash removes a backslash-newline and nothing else.
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        out.push(Step {
            command: std::mem::take(&mut pending),
            shown: Vec::new(),
        });
        attach = true;
    }
    assert!(pending.is_empty(), "the block ends inside a command");
    out
}

/// A shell word: its text (quotes removed, variables filled in) and whether any
/// of it was quoted.
fn words(command: &str, vars: &HashMap<String, String>) -> Vec<String> {
    let chars: Vec<char> = command.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut i = 0;
    let var = |i: &mut usize, word: &mut String| {
        let mut name = String::new();
        while *i < chars.len() && (chars[*i].is_ascii_alphanumeric() || chars[*i] == '_') {
            name.push(chars[*i]);
            *i += 1;
        }
        let value = vars
            .get(&name)
            .unwrap_or_else(|| panic!("${name} is used before the walk-through sets it"));
        word.push_str(value);
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '\'')
                    .expect("closing '")
                    + i
                    + 1;
                word.extend(&chars[i + 1..end]);
                in_word = true;
                i = end + 1;
            }
            '"' => {
                i += 1;
                while chars[i] != '"' {
                    if chars[i] == '$' {
                        i += 1;
                        var(&mut i, &mut word);
                    } else {
                        word.push(chars[i]);
                        i += 1;
                    }
                }
                in_word = true;
                i += 1;
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                let mut depth = 0;
                let start = i;
                loop {
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                word.extend(&chars[start..=i]);
                in_word = true;
                i += 1;
            }
            '$' => {
                i += 1;
                var(&mut i, &mut word);
                in_word = true;
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
                i += 1;
            }
            c => {
                word.push(c);
                in_word = true;
                i += 1;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The answer the README shows: a status when one is written, and the JSON
/// with every `...` outside strings turned into a marker member (`"…": true`
/// in an object, `"…"` in an array).
fn shown_answer(lines: &[String]) -> (Option<u16>, Option<Value>) {
    let text = lines.join(" ");
    let text = text.trim();
    if text.is_empty() {
        return (None, None);
    }
    let (status, json) = match text.split_once(' ') {
        Some((code, rest)) if code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit()) => {
            (Some(code.parse().unwrap()), rest.trim())
        }
        _ => (None, text),
    };
    let mut marked = String::new();
    let mut stack = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let bytes: Vec<char> = json.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            marked.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => stack.push(c),
            '}' | ']' => {
                stack.pop();
            }
            _ => {}
        }
        if c == '.' && bytes.get(i + 1) == Some(&'.') && bytes.get(i + 2) == Some(&'.') {
            marked.push_str(if stack.last() == Some(&'{') {
                "\"…\": true"
            } else {
                "\"…\""
            });
            i += 3;
            continue;
        }
        marked.push(c);
        i += 1;
    }
    let value: Value = serde_json::from_str(&marked)
        .unwrap_or_else(|e| panic!("README shows an answer that is not JSON ({e}): {json}"));
    (status, Some(value))
}

/// Whether `actual` is what the README shows, with the path of the first
/// difference.
fn compare(shown: &Value, actual: &Value, path: &str) -> Result<(), String> {
    match (shown, actual) {
        (Value::Object(s), Value::Object(a)) => {
            let open = s.contains_key("…");
            for (key, value) in s {
                if key == "…" {
                    continue;
                }
                let Some(real) = a.get(key) else {
                    return Err(format!(
                        "{path}.{key}: shown, but the answer has no such key"
                    ));
                };
                compare(value, real, &format!("{path}.{key}"))?;
            }
            if !open {
                let extra: Vec<&String> = a.keys().filter(|k| !s.contains_key(*k)).collect();
                if !extra.is_empty() {
                    return Err(format!(
                        "{path}: the answer has keys the README does not show: {extra:?} \
                         (show them or write `...`)"
                    ));
                }
            }
            Ok(())
        }
        (Value::Array(s), Value::Array(a)) => {
            let items: Vec<&Value> = s.iter().filter(|v| v.as_str() != Some("…")).collect();
            let open = items.len() != s.len();
            if (open && a.len() < items.len()) || (!open && a.len() != items.len()) {
                return Err(format!(
                    "{path}: {} items shown, the answer has {}",
                    items.len(),
                    a.len()
                ));
            }
            for (i, (s, a)) in items.iter().zip(a).enumerate() {
                compare(s, a, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        (Value::Number(s), Value::Number(a)) => {
            let (sv, av) = (s.as_f64().unwrap(), a.as_f64().unwrap());
            let close = if s.is_f64() {
                (sv - av).abs() <= 0.005 * sv.abs().max(av.abs()) + 1e-12
            } else {
                sv == av
            };
            if close {
                Ok(())
            } else {
                Err(format!("{path}: the README shows {s}, the answer is {a}"))
            }
        }
        (Value::String(s), Value::String(a)) => {
            let parts: Vec<&str> = s.split(['…']).flat_map(|p| p.split("...")).collect();
            let mut rest = a.as_str();
            for (i, part) in parts.iter().enumerate() {
                let found = if i == 0 {
                    rest.starts_with(part).then_some(0)
                } else {
                    rest.find(part)
                };
                match found {
                    Some(at) => rest = &rest[at + part.len()..],
                    None => {
                        return Err(format!(
                            "{path}: the README shows {s:?}, the answer is {a:?}"
                        ))
                    }
                }
            }
            if parts.len() == 1 && !rest.is_empty() {
                return Err(format!(
                    "{path}: the README shows {s:?}, the answer is {a:?}"
                ));
            }
            Ok(())
        }
        (s, a) if s == a => Ok(()),
        (s, a) => Err(format!("{path}: the README shows {s}, the answer is {a}")),
    }
}

/// `dpledger token ...` arguments: (role, dataset, examples).
fn token_args(args: &[String]) -> (String, Option<String>, Option<String>) {
    let mut role = None;
    let mut dataset = None;
    let mut examples = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().cloned();
        match flag.as_str() {
            "--role" => role = value,
            "--dataset" => dataset = value,
            "--examples" => examples = value,
            other => panic!("dpledger token {other}: the walk-through test does not know it"),
        }
    }
    (role.expect("--role"), dataset, examples)
}

/// A `curl` line: method, URL path, headers, body.
struct Curl {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

fn parse_curl(words: &[String]) -> Curl {
    let mut method = None;
    let mut url = None;
    let mut headers = Vec::new();
    let mut body = None;
    let mut it = words[1..].iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "-X" => method = it.next().cloned(),
            "-H" => {
                let h = it.next().expect("-H value");
                let (k, v) = h.split_once(':').expect("a header `Name: value`");
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
            "-d" => body = it.next().cloned(),
            "-s" | "-sS" => {}
            w if w.starts_with('-') => panic!("curl {w}: the walk-through test does not know it"),
            w => url = Some(w.to_string()),
        }
    }
    let url = url.expect("a URL");
    let path = url
        .trim_start_matches("http://")
        .strip_prefix("localhost:8080")
        .unwrap_or_else(|| panic!("the walk-through talks to localhost:8080, not {url}"))
        .to_string();
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    Curl {
        method,
        path,
        headers,
        body,
    }
}

fn send(base: &str, curl: &Curl) -> (u16, Value) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let mut req = agent.request(&curl.method, &format!("{base}{}", curl.path));
    for (k, v) in &curl.headers {
        req = req.set(k, v);
    }
    let result = match &curl.body {
        Some(body) => req.send_string(body),
        None => req.call(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{} {}: {e}", curl.method, curl.path),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn the_readme_walkthrough_runs_and_shows_the_real_answers() {
    let text = readme();
    let steps = steps(&walkthrough_block(&text));
    let dir = tempfile::tempdir().unwrap();
    let mut server: Option<Server> = None;
    let mut waited = false;
    let mut vars: HashMap<String, String> = HashMap::new();
    let mut checked = 0;
    for step in &steps {
        let words = words(&step.command, &vars);
        let line = step.command.trim();
        match words.first().map(String::as_str) {
            Some("cargo") if words.contains(&"serve".to_string()) => {
                assert_eq!(
                    words.last().map(String::as_str),
                    Some("&"),
                    "serve runs in the background so that the block can go on"
                );
                server = Some(Server::start(dir.path(), None));
            }
            Some("until") => {
                // The first paste used to fail: `cat data/admin.token` ran before
                // the server had written it. The wait must come before it.
                assert!(
                    line.contains("data/admin.token") && line.contains("/healthz"),
                    "the wait loop waits for the token file and the server: {line}"
                );
                waited = true;
            }
            Some(w) if w.contains('=') => {
                let (name, value) = w.split_once('=').unwrap();
                let server = server.as_ref().expect("serve comes first");
                let inner = value
                    .strip_prefix("$(")
                    .and_then(|v| v.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("{name}=...: expected $(...)"));
                let inner_words = self::words(inner, &vars);
                let token = if inner_words == ["cat", "data/admin.token"] {
                    assert!(waited, "data/admin.token is read before the wait loop");
                    server.admin_token()
                } else if let Some(at) = inner_words.iter().position(|w| w == "token") {
                    assert_eq!(&inner_words[..2], ["cargo", "run"], "{inner}");
                    let (role, dataset, examples) = token_args(&inner_words[at + 1..]);
                    server.token(&role, dataset.as_deref(), examples.as_deref())
                } else {
                    panic!("{name}=$({inner}): the walk-through test does not know it")
                };
                vars.insert(name.to_string(), token);
            }
            Some("curl") => {
                let server = server.as_ref().expect("serve comes first");
                let curl = parse_curl(&words);
                let (status, body) = send(&server.url, &curl);
                let (shown_status, shown) = shown_answer(&step.shown);
                match shown_status {
                    Some(s) => assert_eq!(status, s, "{line}\nanswered {status}: {body}"),
                    None => assert!(
                        (200..300).contains(&status),
                        "{line}\nanswered {status}: {body}"
                    ),
                }
                if let Some(shown) = shown {
                    if let Err(diff) = compare(&shown, &body, "") {
                        panic!(
                            "the README's answer to\n  {line}\nis stale: {diff}\nthe real answer: {body}"
                        );
                    }
                    checked += 1;
                }
            }
            _ => panic!("a line of the walk-through the test does not know: {line}"),
        }
    }
    assert!(
        waited,
        "the walk-through waits for the server before using it"
    );
    assert!(
        checked >= 5,
        "only {checked} answers shown in the walk-through were checked"
    );
}

#[test]
fn shown_answers_parse_with_elisions() {
    let (status, value) = shown_answer(&[
        "409 {\"a\":1.5,...,\"b\":[1,...],".to_string(),
        "\"c\":\"x ... y\"}".to_string(),
    ]);
    assert_eq!(status, Some(409));
    let real = serde_json::json!({"a": 1.501, "z": 0, "b": [1, 2], "c": "x and y"});
    compare(&value.unwrap(), &real, "").unwrap();
    let (_, closed) = shown_answer(&["{\"a\":1}".to_string()]);
    assert!(compare(&closed.unwrap(), &serde_json::json!({"a": 1, "b": 2}), "").is_err());
    let (_, stale) = shown_answer(&["{\"a\":0.5}".to_string()]);
    assert!(compare(&stale.unwrap(), &serde_json::json!({"a": 0.6}), "").is_err());
}

/// The README opens with what dpledger is, then the two commands a newcomer
/// runs, then "What it does", and stays short enough to read.
#[test]
fn the_readme_opens_with_the_pitch_and_the_two_commands() {
    let text = readme();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() <= 200,
        "README.md has {} lines (at most 200): move depth into docs/",
        lines.len()
    );
    assert_eq!(lines[0], "# dpledger");
    let pitch = text[text.find('\n').unwrap()..].trim_start();
    assert!(
        pitch.starts_with("dpledger is "),
        "the first line after the title says what dpledger is"
    );
    let block = &pitch[pitch.find("```sh\n").expect("the commands block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        ["cargo run --release -- serve", "scripts/test"],
        "the first block is the two commands: run the service, run every test"
    );
    let first_section = text.find("\n## ").expect("a section");
    assert!(
        text[first_section..].starts_with("\n## What it does"),
        "the first section is \"What it does\""
    );
    assert!(
        text.find("```sh").unwrap() < first_section,
        "the commands come before \"What it does\""
    );
}

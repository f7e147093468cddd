//! A trace with a norm JSON cannot hold as a finite number (`1e999`, `NaN`) is
//! refused by the CLI's trace readers with a message a person can act on: the
//! run (its file), the line and the field, and that norms must be finite,
//! as the HTTP API says for a step report.

use std::path::Path;
use std::process::Command;

const DATASET: &str = r#"{"dataset": {"examples": 3, "max_grad_norm": 1.0, "noise_multiplier": 1.0, "sampling_rate": 0.5}}"#;

fn write(dir: &Path, name: &str, lines: &[&str]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

/// Exit status and standard error of `dpledger args`.
fn refused(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpledger"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn replay_names_the_run_line_and_field_of_a_non_finite_norm() {
    let dir = tempfile::tempdir().unwrap();
    for (norms, token) in [
        ("[0.5, 1e999]", "1e999"),
        ("[0.5, NaN]", "NaN"),
        ("[0.5, -1e999]", "-1e999"),
        ("[0.5, Infinity]", "Infinity"),
    ] {
        let step = format!(r#"{{"step": 1, "ids": [0, 2], "norms": {norms}}}"#);
        let trace = write(
            dir.path(),
            "run.jsonl",
            &[DATASET, r#"{"step": 0, "ids": [1], "norms": [0.3]}"#, &step],
        );
        let (code, err) = refused(&["replay", "--trace", &trace, "--delta", "1e-5"]);
        assert_eq!(code, 2, "{err}");
        let want = format!(
            "{trace}: line 3: invalid norms: norms[1] = {token} is not a finite number: every norm must be a finite number >= 0"
        );
        assert!(err.contains(&want), "{err}\nlacks\n{want}");
        assert!(
            !err.contains("number out of range") && !err.contains("expected value"),
            "{err}"
        );
    }
}

#[test]
fn data_dependent_names_the_run_line_and_field_of_a_non_finite_norm() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "a.jsonl",
        &[
            DATASET,
            r#"{"refresh": {"ids": [0, 1, 2], "norms": [0.1, 0.2, 0.3]}}"#,
            r#"{"step": 0, "ids": [1], "norms": [0.3]}"#,
        ],
    );
    let bad = write(
        dir.path(),
        "b.jsonl",
        &[
            DATASET,
            r#"{"refresh": {"ids": [0, 1, 2], "norms": [0.1, 1e999, 0.3]}}"#,
            r#"{"step": 0, "ids": [1], "norms": [0.3]}"#,
        ],
    );
    let (code, err) = refused(&[
        "data-dependent",
        "--trace",
        &good,
        "--trace",
        &bad,
        "--delta",
        "1e-5",
    ]);
    assert_eq!(code, 2, "{err}");
    let want = format!(
        "{bad}: run 1, line 2: invalid norms: refresh.norms[1] = 1e999 is not a finite number"
    );
    assert!(err.contains(&want), "{err}\nlacks\n{want}");
}

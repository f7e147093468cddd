//! `dpledger epsilon|compare|noise` end to end: PLD is the default and
//! below RDP, RDP is on request, calibration by PLD needs less noise, the output
//! names the method, and bad input exits 2 with a message.

use serde_json::Value;
use std::process::Command;

fn run(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpledger"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text output (no `--json`).
fn text(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dpledger"))
        .args(args)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const RUN: [&str; 8] = [
    "--sampling-rate",
    "0.01",
    "--noise-multiplier",
    "1.1",
    "--steps",
    "10000",
    "--delta",
    "1e-5",
];

#[test]
fn pld_epsilon_and_compare_row_are_below_rdp() {
    let mut pld_args = vec!["epsilon", "--json", "--method", "pld"];
    pld_args.extend(RUN);
    let (code, pld, _) = run(&pld_args);
    assert_eq!(code, 0);
    assert_eq!(pld["method"], "pld");
    let mut rdp_args = vec!["epsilon", "--json", "--method", "rdp"];
    rdp_args.extend(RUN);
    let (_, rdp, _) = run(&rdp_args);
    let (p, r) = (
        pld["epsilon"].as_f64().unwrap(),
        rdp["epsilon"].as_f64().unwrap(),
    );
    assert!(p < 0.95 * r, "pld {p} rdp {r}");
    let mut cmp = vec!["compare", "--json"];
    cmp.extend(RUN);
    let (_, table, _) = run(&cmp);
    let rows = table["rows"].as_array().unwrap();
    let row = rows.iter().find(|r| r["method"] == "pld").expect("pld row");
    assert_eq!(row["epsilon"].as_f64().unwrap(), p);
    assert_eq!(row["guarantee"], true);
}

#[test]
fn pld_noise_is_smaller_and_says_by_how_much() {
    let (code, out, _) = run(&[
        "noise",
        "--json",
        "--method",
        "pld",
        "--target-epsilon",
        "2",
        "--delta",
        "1e-5",
        "--sampling-rate",
        "0.01",
        "--steps",
        "2000",
    ]);
    assert_eq!(code, 0);
    let pld = out["noise_multiplier"].as_f64().unwrap();
    let rdp = out["rdp_noise_multiplier"].as_f64().unwrap();
    assert!(pld < rdp, "{out}");
    let saving = out["noise_saving"].as_f64().unwrap();
    assert!((saving - (1.0 - pld / rdp)).abs() < 1e-12 && saving > 0.0);
}

#[test]
fn bad_input_exits_2_with_a_message() {
    for (flag, value, needle) in [
        ("--delta", "1.5", "--delta"),
        ("--value-discretization", "0.5", "--value-discretization"),
        ("--steps", "100000000000000", "method rdp has none"),
    ] {
        let mut args = vec!["epsilon", "--method", "pld"];
        let mut run_args: Vec<&str> = RUN.to_vec();
        if let Some(i) = run_args.iter().position(|a| *a == flag) {
            run_args[i + 1] = value;
        } else {
            run_args.extend([flag, value]);
        }
        args.extend(run_args);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn pld_is_the_default_and_rdp_is_on_request() {
    let with = |extra: &[&'static str]| {
        let mut args = vec!["epsilon", "--json"];
        args.extend(RUN);
        args.extend(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let default = with(&[]);
    assert_eq!(default["method"], "pld", "{default}");
    assert_eq!(default, with(&["--method", "pld"]));
    assert!(default["order"].is_null());
    let rdp = with(&["--method", "rdp"]);
    assert_eq!(rdp["method"], "rdp");
    assert!(rdp["order"].as_f64().unwrap() > 1.0);
    // The published RDP figure for this run, and PLD is tighter.
    let r = rdp["epsilon"].as_f64().unwrap();
    assert!((r - 5.632).abs() < 1e-3, "{rdp}");
    assert!(default["epsilon"].as_f64().unwrap() < r);
    let classic = with(&["--method", "rdp", "--conversion", "classic"]);
    assert!(classic["epsilon"].as_f64().unwrap() > r);

    // The text says which method produced the number.
    let mut args = vec!["epsilon"];
    args.extend(RUN);
    assert!(text(&args).contains("by PLD"), "{}", text(&args));
    args.extend(["--method", "rdp"]);
    assert!(
        text(&args).contains("by RDP, optimal order"),
        "{}",
        text(&args)
    );

    // RDP-only options are refused with the PLD default, not ignored.
    for extra in [["--orders", "2,4,8"], ["--conversion", "classic"]] {
        let mut args = vec!["epsilon", "--json"];
        args.extend(RUN);
        args.extend(extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{extra:?}");
        assert!(
            err.contains(extra[0]) && err.contains("method rdp"),
            "{err}"
        );
    }

    // noise and compare lead with PLD too.
    let (code, noise, _) = run(&[
        "noise",
        "--json",
        "--target-epsilon",
        "2",
        "--delta",
        "1e-5",
        "--sampling-rate",
        "0.01",
        "--steps",
        "2000",
    ]);
    assert_eq!(code, 0);
    assert_eq!(noise["method"], "pld");
    let mut cmp = vec!["compare", "--json"];
    cmp.extend(RUN);
    let (_, table, _) = run(&cmp);
    assert_eq!(table["rows"][0]["method"], "pld", "{table}");
    assert_eq!(table["rows"][1]["method"], "rdp", "{table}");
    assert_eq!(table["rows"][0]["epsilon"], default["epsilon"]);
    assert_eq!(table["rows"][1]["epsilon"], rdp["epsilon"]);
}

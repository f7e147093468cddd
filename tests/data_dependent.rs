//! Seed 001's data-dependent composition against the independent
//! mpmath oracle in `tests/fixtures/data_dependent.json` (regenerate with
//! `scripts/gen-fixtures --only data_dependent`), its two reduction checks, and
//! every refusal.

use dpledger::accounting::conversion::{epsilon_from_rdp, Conversion};
use dpledger::accounting::data_dependent::trace::RawCheckpoint;
use dpledger::accounting::data_dependent::{
    analyze, compose, compose_rounded, read_run, DataDependentError, Options, Rounding, RunSet,
    RunTrace, TraceConfig,
};
use dpledger::accounting::sgm::sgm_rdp;
use serde_json::Value;

fn fixture() -> Value {
    let path = format!(
        "{}/tests/fixtures/data_dependent.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json")
}

fn config(n: u64, c: f64, r: f64, q: f64, sigma: f64) -> TraceConfig {
    TraceConfig {
        examples: n,
        max_grad_norm: c,
        rounding: Some(r),
        noise_multiplier: sigma,
        sampling_rate: q,
        orders: None,
    }
}

/// The fixture case's runs as parsed traces (so that bucketing is ours).
fn traces_of(case: &Value) -> Vec<RunTrace> {
    let steps: Vec<(f64, f64)> = case["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_f64().unwrap(), s[1].as_f64().unwrap()))
        .collect();
    let n = case["examples"].as_u64().unwrap();
    let c = case["max_grad_norm"].as_f64().unwrap();
    let r = case["rounding"].as_f64().unwrap();
    case["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| RunTrace {
            config: config(n, c, r, steps[0].0, steps[0].1),
            steps: steps.clone(),
            checkpoints: run
                .as_array()
                .unwrap()
                .iter()
                .map(|cp| RawCheckpoint {
                    before_step: cp["before_step"].as_u64().unwrap(),
                    entries: cp["norms"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .enumerate()
                        .map(|(i, x)| (i as u64, x.as_f64().unwrap()))
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

fn close(ours: f64, theirs: f64, tol: f64) -> bool {
    (ours - theirs).abs() <= tol * theirs.abs().max(1e-12)
}

#[test]
fn agrees_with_the_mpmath_oracle_to_1e9() {
    let fx = fixture();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut analysed = 0;
    for (i, case) in cases.iter().enumerate() {
        let runs = RunSet::from_traces(&traces_of(case)).unwrap();
        let orders: Vec<f64> = case["orders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let holder = case["holder"]
            .as_f64()
            .unwrap_or(3.0 * runs.steps().len() as f64);
        let comp = compose(&runs, &orders, holder, 2);
        let want = &case["expected"];
        for e in 0..runs.examples() {
            for (o, &got) in comp.example(e).iter().enumerate() {
                let exp = want["rdp"][e][o].as_f64().unwrap();
                assert!(
                    close(got, exp, 1e-9),
                    "case {i} example {e} order {o}: {got} vs {exp}"
                );
            }
        }
        if runs.runs() >= 2 {
            let options = Options {
                orders: orders.clone(),
                holder: case["holder"].as_f64(),
                delta: case["delta"].as_f64().unwrap(),
                conversion: Conversion::Improved,
                threads: 1,
                rounding: Rounding::EXACT,
            };
            let a = analyze(&runs, &options).unwrap();
            assert!(!a.guarantee);
            for x in &a.examples {
                let exp = want["epsilon"][x.id as usize].as_f64().unwrap();
                assert!(
                    close(x.epsilon, exp, 1e-9),
                    "case {i}: {} vs {exp}",
                    x.epsilon
                );
                assert!(!x.guarantee);
            }
            analysed += 1;
        }
    }
    assert!(analysed >= 30, "only {analysed} multi-run cases");
}

/// Same steps, one checkpoint per run at step 0 with the given norms.
fn runs_with(norms_per_run: &[Vec<f64>], steps: &[(f64, f64)], c: f64) -> RunSet {
    let n = norms_per_run[0].len() as u64;
    let traces: Vec<RunTrace> = norms_per_run
        .iter()
        .map(|norms| RunTrace {
            config: config(n, c, c / 100.0, steps[0].0, steps[0].1),
            steps: steps.to_vec(),
            checkpoints: vec![RawCheckpoint {
                before_step: 0,
                entries: norms
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| (i as u64, x))
                    .collect(),
            }],
        })
        .collect();
    RunSet::from_traces(&traces).unwrap()
}

#[test]
fn one_run_and_large_p_tends_to_plain_rdp_composition() {
    let steps = vec![(0.02, 1.1); 40];
    let norms = vec![0.9, 0.37, 0.05, 1.0];
    let runs = runs_with(std::slice::from_ref(&norms), &steps, 1.0);
    let orders = [1.5, 4.0, 12.5, 64.0];
    for (e, &g) in norms.iter().enumerate() {
        let v = runs.grid().value(runs.grid().bucket_of(g));
        let sigma = 1.1 / v;
        let mut previous = f64::INFINITY;
        for p in [10.0, 1e3, 1e5, 1e8, 1e11] {
            let comp = compose(&runs, &orders, p, 1);
            // The last order's gap must shrink as p grows and vanish in the limit.
            let plain = 40.0 * sgm_rdp(0.02, sigma, 64.0);
            let got = comp.example(e)[3];
            assert!(got >= plain * (1.0 - 1e-12), "below plain composition");
            assert!(
                got - plain < previous,
                "not decreasing in p: e={e} p={p} {got} {plain} {previous}"
            );
            previous = got - plain;
            if p == 1e11 {
                for (o, &a) in orders.iter().enumerate() {
                    let plain = 40.0 * sgm_rdp(0.02, sigma, a);
                    let got = comp.example(e)[o];
                    let near = 40.0 * sgm_rdp(0.02, sigma, a * (1.0 + 1e-7));
                    assert!(
                        (got - plain).abs() <= 1e-6 * plain,
                        "e={e} a={a} {got} vs {plain}, near {near}"
                    );
                }
            }
        }
    }
}

#[test]
fn identical_runs_at_full_sensitivity_never_beat_the_data_independent_accountant() {
    for &(q, sigma, t) in &[
        (0.01, 1.0, 30),
        (0.2, 0.8, 10),
        (0.5, 3.0, 5),
        (1.0, 2.0, 4),
    ] {
        let steps = vec![(q, sigma); t];
        let norms = vec![5.0, 1.0, 2.5]; // all at or above C = 1
        let runs = runs_with(&[norms.clone(), norms.clone(), norms], &steps, 1.0);
        let orders = vec![1.25, 2.0, 8.0, 32.0, 256.0];
        let di: Vec<f64> = orders
            .iter()
            .map(|&a| t as f64 * sgm_rdp(q, sigma, a))
            .collect();
        for p in [None, Some(1.5), Some(4.0), Some(1e4)] {
            let options = Options {
                orders: orders.clone(),
                holder: p,
                delta: 1e-5,
                conversion: Conversion::Improved,
                threads: 2,
                rounding: Rounding::EXACT,
            };
            let a = analyze(&runs, &options).unwrap();
            let di_eps = epsilon_from_rdp(&orders, &di, 1e-5, Conversion::Improved).epsilon;
            assert!((a.data_independent.epsilon - di_eps).abs() <= 1e-12 * di_eps);
            for x in &a.examples {
                assert!(
                    x.epsilon >= di_eps,
                    "{} < {di_eps} (q={q}, p={p:?})",
                    x.epsilon
                );
                let curve = &a.rdp_curves[x.id as usize * orders.len()..][..orders.len()];
                for (c, d) in curve.iter().zip(&di) {
                    assert!(*c >= *d, "{c} < {d}");
                }
            }
        }
    }
}

#[test]
fn smaller_sensitivities_give_smaller_estimates() {
    let steps = vec![(0.05, 1.0); 20];
    let runs = runs_with(&[vec![1.0, 0.5, 0.1], vec![1.0, 0.6, 0.05]], &steps, 1.0);
    let options = Options {
        orders: vec![2.0, 8.0, 32.0],
        holder: None,
        delta: 1e-5,
        conversion: Conversion::Improved,
        threads: 1,
        rounding: Rounding::EXACT,
    };
    let a = analyze(&runs, &options).unwrap();
    let e: Vec<f64> = a.examples.iter().map(|x| x.epsilon).collect();
    assert!(e[0] > e[1] && e[1] > e[2], "{e:?}");
    assert_eq!(a.runs, 2);
    assert_eq!(a.intervals.len(), 1);
    assert_eq!(a.examples[0].relative_contributions.len(), 1);
}

fn expect_err(
    r: Result<impl std::fmt::Debug, DataDependentError>,
    want: fn(&DataDependentError) -> bool,
) {
    let e = r.expect_err("must be refused");
    assert!(want(&e), "wrong error: {e}");
    assert!(!e.to_string().is_empty());
}

#[test]
fn refuses_what_cannot_be_analysed() {
    let steps = vec![(0.05, 1.0); 3];
    let good = |norms: Vec<f64>| RunTrace {
        config: config(2, 1.0, 0.01, 0.05, 1.0),
        steps: steps.clone(),
        checkpoints: vec![RawCheckpoint {
            before_step: 1,
            entries: norms
                .into_iter()
                .enumerate()
                .map(|(i, x)| (i as u64, x))
                .collect(),
        }],
    };
    let options = Options {
        orders: vec![2.0, 8.0],
        holder: None,
        delta: 1e-5,
        conversion: Conversion::Improved,
        threads: 1,
        rounding: Rounding::EXACT,
    };
    // One run.
    let one = RunSet::from_traces(&[good(vec![0.5, 0.5])]).unwrap();
    expect_err(analyze(&one, &options), |e| {
        matches!(e, DataDependentError::TooFewRuns(1))
    });
    // Different configurations.
    let mut other = good(vec![0.5, 0.5]);
    other.config.noise_multiplier = 2.0;
    expect_err(RunSet::from_traces(&[good(vec![0.5, 0.5]), other]), |e| {
        matches!(e, DataDependentError::ConfigMismatch(_))
    });
    let mut other = good(vec![0.5, 0.5]);
    other.steps[2].1 = 1.5;
    expect_err(RunSet::from_traces(&[good(vec![0.5, 0.5]), other]), |e| {
        matches!(e, DataDependentError::ConfigMismatch(_))
    });
    let mut other = good(vec![0.5, 0.5]);
    other.steps.pop();
    expect_err(RunSet::from_traces(&[good(vec![0.5, 0.5]), other]), |e| {
        matches!(e, DataDependentError::ConfigMismatch(_))
    });
    // A checkpoint missing an example, or naming one twice.
    expect_err(
        RunSet::from_traces(&[good(vec![0.5, 0.5]), good(vec![0.5])]),
        |e| matches!(e, DataDependentError::IncompleteCheckpoint(_)),
    );
    let mut twice = good(vec![0.5, 0.5]);
    twice.checkpoints[0].entries[1].0 = 0;
    expect_err(RunSet::from_traces(&[good(vec![0.5, 0.5]), twice]), |e| {
        matches!(e, DataDependentError::IncompleteCheckpoint(_))
    });
    // Norms that are not finite and non-negative.
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        expect_err(
            RunSet::from_traces(&[good(vec![0.5, 0.5]), good(vec![bad, 0.5])]),
            |e| matches!(e, DataDependentError::InvalidNorm(_)),
        );
    }
    // Arguments.
    let two = RunSet::from_traces(&[good(vec![0.5, 0.5]), good(vec![0.2, 0.9])]).unwrap();
    assert!(analyze(&two, &options).is_ok());
    for (orders, holder, delta) in [
        (vec![1.0], None, 1e-5),
        (vec![f64::NAN], None, 1e-5),
        (vec![2.0], Some(1.0), 1e-5),
        (vec![2.0], Some(0.5), 1e-5),
        (vec![2.0], Some(f64::INFINITY), 1e-5),
        (vec![2.0], None, 0.0),
        (vec![2.0], None, 1.0),
    ] {
        let o = Options {
            orders,
            holder,
            delta,
            ..options.clone()
        };
        expect_err(analyze(&two, &o), |e| {
            matches!(e, DataDependentError::InvalidArgument(_))
        });
    }
}

#[test]
fn reads_traces_merging_split_refreshes_and_ignoring_retries() {
    let text = "{\"dataset\": {\"examples\": 3, \"max_grad_norm\": 1.0, \"noise_multiplier\": 1.0, \"sampling_rate\": 0.1}}\n\
        {\"refresh\": {\"ids\": [0, 1], \"norms\": [0.5, 2.0]}}\n\
        {\"refresh\": {\"ids\": [2], \"norms\": [0.25]}}\n\
        {\"step\": 0, \"ids\": [1], \"norms\": [0.3]}\n\
        {\"step\": 0, \"ids\": [1], \"norms\": [0.3]}\n\
        \n\
        {\"step\": 1, \"ids\": [], \"norms\": [], \"noise_multiplier\": 2.0}\n";
    let run = read_run(text.as_bytes(), 0).unwrap();
    assert_eq!(run.steps, vec![(0.1, 1.0), (0.1, 2.0)]);
    assert_eq!(run.checkpoints.len(), 1);
    assert_eq!(run.checkpoints[0].entries.len(), 3);
    let bad = "{\"dataset\": {\"examples\": 1, \"max_grad_norm\": 1.0, \"noise_multiplier\": 1.0, \"sampling_rate\": 0.1}}\n{\"step\": 3, \"ids\": [], \"norms\": []}\n";
    let e = read_run(bad.as_bytes(), 4).unwrap_err();
    assert!(
        matches!(
            e,
            DataDependentError::Trace {
                run: 4,
                line: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn cli_reports_estimates_beside_both_baselines_and_refuses_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let head = "{\"dataset\": {\"examples\": 3, \"max_grad_norm\": 1.0, \"noise_multiplier\": 1.0, \"sampling_rate\": 0.1}}\n";
    let write = |name: &str, norms: &str, sigma: f64| {
        let mut s = head.replace(
            "\"noise_multiplier\": 1.0",
            &format!("\"noise_multiplier\": {sigma}"),
        );
        s += &format!("{{\"refresh\": {{\"ids\": [0, 1, 2], \"norms\": [{norms}]}}}}\n");
        for t in 0..6 {
            s += &format!("{{\"step\": {t}, \"ids\": [0], \"norms\": [0.4]}}\n");
        }
        let p = dir.path().join(name);
        std::fs::write(&p, s).unwrap();
        p
    };
    let a = write("a.jsonl", "0.4, 2.0, 0.1", 1.0);
    let b = write("b.jsonl", "0.5, 1.5, 0.2", 1.0);
    let c = write("c.jsonl", "0.5, 1.5, 0.2", 2.0);
    let bin = env!("CARGO_BIN_EXE_dpledger");
    let out = std::process::Command::new(bin)
        .args(["data-dependent", "--json", "--delta", "1e-5", "--trace"])
        .arg(&a)
        .arg("--trace")
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["guarantee"], false);
    assert_eq!(v["runs"], 2);
    assert_eq!(v["examples"].as_array().unwrap().len(), 3);
    let replay = std::process::Command::new(bin)
        .args(["replay", "--json", "--delta", "1e-5", "--trace"])
        .arg(&a)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&replay.stdout).unwrap();
    let di = v["data_independent"]["epsilon"].as_f64().unwrap();
    let worst = r["worst_case"]["rdp"]["epsilon"].as_f64().unwrap();
    assert!((di - worst).abs() <= 1e-9 * worst, "{di} vs {worst}");
    for x in v["examples"].as_array().unwrap() {
        assert_eq!(x["guarantee"], false);
        assert_eq!(x["per_instance_epsilon"].as_array().unwrap().len(), 2);
        assert_eq!(x["data_independent_epsilon"].as_f64().unwrap(), di);
    }
    let id0 = v["examples"][0]["per_instance_epsilon"][0]
        .as_f64()
        .unwrap();
    assert_eq!(id0, r["examples"][0]["rdp_epsilon"].as_f64().unwrap());
    for args in [vec![&a], vec![&a, &c]] {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["data-dependent", "--delta", "1e-5"]);
        for p in args {
            cmd.arg("--trace").arg(p);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(!out.stderr.is_empty());
    }
}

/// Rounding step orders and levels up (the fast path) never gives less than the
/// exact composition, on every fixture case, example and order; and it stays
/// within a few percent of it on these small cases.
#[test]
fn rounding_only_loosens_the_exact_composition() {
    let fx = fixture();
    let mut checked = 0;
    for (i, case) in fx["cases"].as_array().unwrap().iter().enumerate() {
        let runs = RunSet::from_traces(&traces_of(case)).unwrap();
        let orders: Vec<f64> = case["orders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let holder = case["holder"]
            .as_f64()
            .unwrap_or(3.0 * runs.steps().len() as f64);
        let exact = compose(&runs, &orders, holder, 1);
        for rounding in [
            Rounding::FAST,
            Rounding {
                order_ratio: 1.1,
                level_stride: 7,
            },
        ] {
            let fast = compose_rounded(&runs, &orders, holder, rounding, 2);
            for (k, (&f, &x)) in fast.rdp.iter().zip(&exact.rdp).enumerate() {
                assert!(
                    f >= x * (1.0 - 1e-12),
                    "case {i} value {k}: rounded {f} < exact {x}"
                );
                if rounding == Rounding::FAST {
                    assert!(f <= x * 1.05 + 1e-12, "case {i} value {k}: {f} vs {x}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked}");
}

//! TensorBoard scalars: the Rust writer's files read back by this
//! crate's reader and by TensorBoard's own `EventAccumulator`, with the values the
//! API answers; a file written by tensorboardX reads back with this reader.

mod common;

use common::{config, Env};
use dpledger_client::tensorboard::{
    privacy_scalars, quantile_tag, read_events, SummaryWriter, What,
};
use dpledger_client::{BudgetRequest, DatasetSetup, PrivacyQuery, ReleaseRequest, StepReport};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `(step, value)` per tag over every scalar event of every file in `logdir`.
fn scalars_in(logdir: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for entry in std::fs::read_dir(logdir).unwrap() {
        for event in read_events(entry.unwrap().path()).unwrap() {
            if let What::Scalars(values) = event.what {
                for (tag, v) in values {
                    out.entry(tag).or_default().push((event.step, v));
                }
            }
        }
    }
    out
}

/// A Python with the `tensorboard` package: `$DPLEDGER_TENSORBOARD_PYTHON`, else
/// the browser-test venv `scripts/test-dashboard` makes.
fn tensorboard_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DPLEDGER_TENSORBOARD_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-browser/bin/python");
    venv.exists().then_some(venv)
}

/// What TensorBoard's `EventAccumulator` reads from `logdir`: tag -> [(step,
/// value)], each value passed as its f32 bit pattern so the comparison is exact
/// (decimal JSON floats need not parse back to the same bits).
fn accumulator_scalars(python: &Path, logdir: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
    let script = r#"
import json, struct, sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(sys.argv[1])
acc.Reload()
bits = lambda v: struct.unpack("<I", struct.pack("<f", v))[0]
print(json.dumps({t: [[e.step, bits(e.value)] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let out = Command::new(python)
        .args(["-c", script])
        .arg(logdir)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "EventAccumulator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bits: BTreeMap<String, Vec<(i64, u32)>> =
        serde_json::from_slice(&out.stdout).expect("json from EventAccumulator");
    bits.into_iter()
        .map(|(t, s)| {
            (
                t,
                s.into_iter().map(|(k, b)| (k, f32::from_bits(b))).collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn privacy_scalars_equal_the_api_and_tensorboard_reads_them() {
    let env = Env::start();
    let setup = DatasetSetup {
        release_budget: Some(BudgetRequest::rho(1.0)),
        labels: None,
        release_policy: None,
    };
    env.admin
        .create_dataset_with("tb", &config(10, 0.5, 1.0), &setup)
        .await
        .unwrap();
    let viewer = env.client_as("viewer", Some("tb"), None);
    let logdir = env.dir.path().join("tb-logs");
    let mut writer = SummaryWriter::new(&logdir).unwrap();
    let mut written = Vec::new();
    for t in 0..3u64 {
        env.admin
            .report_step(
                "tb",
                &StepReport::new(t, vec![0, 1, 2], vec![0.1, 0.5, 3.0]),
            )
            .await
            .unwrap();
        if t >= 1 {
            let request = ReleaseRequest::default()
                .mean(1e-4)
                .quantiles(1e-4, vec![0.1, 0.5, 0.999]);
            env.admin.create_release("tb", &request).await.unwrap();
        }
        let scalars = privacy_scalars(&viewer, "tb", t, 10).await.unwrap();
        writer.add_scalars(&scalars, t + 1).unwrap();
        written.push(scalars);
    }
    writer.flush().unwrap();

    // Before any release: only the worst case and the retired share.
    let tags = |s: &[(String, f64)]| s.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    assert_eq!(
        tags(&written[0]),
        ["privacy/retired_share", "privacy/worst_case_epsilon"]
    );
    assert_eq!(
        tags(&written[2]),
        [
            "privacy/dp_mean_epsilon",
            "privacy/dp_quantile/q10",
            "privacy/dp_quantile/q50",
            "privacy/dp_quantile/q99.9",
            "privacy/retired_share",
            "privacy/worst_case_epsilon",
        ]
    );
    let last: BTreeMap<_, _> = written[2].iter().cloned().collect();
    let latest = viewer.latest_release("tb").await.unwrap();
    let pop = latest.values.population.unwrap();
    assert_eq!(last["privacy/dp_mean_epsilon"], pop.mean.unwrap().mean);
    for q in pop.quantiles.unwrap() {
        assert_eq!(last[&quantile_tag(q.level)], q.value);
    }
    let worst = viewer
        .worst_case("tb", PrivacyQuery::default())
        .await
        .unwrap();
    assert_eq!(last["privacy/worst_case_epsilon"], worst.epsilon);
    assert!(worst.epsilon > 0.0);

    // Read back by this crate's reader: f32 on disk, steps as written.
    let got = scalars_in(&logdir);
    let worst_series = &got["privacy/worst_case_epsilon"];
    assert_eq!(
        worst_series.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(
        worst_series.windows(2).all(|w| w[0].1 < w[1].1),
        "{worst_series:?}"
    );
    for (tag, value) in &written[2] {
        assert_eq!(got[tag].last().unwrap(), &(3, *value as f32), "{tag}");
    }
    assert_eq!(got["privacy/retired_share"], [(1, 0.0), (2, 0.1), (3, 0.2)]);

    // Read back by TensorBoard itself.
    match tensorboard_python() {
        Some(python) => {
            assert_eq!(accumulator_scalars(&python, &logdir), got);
        }
        None => eprintln!(
            "no Python with tensorboard (DPLEDGER_TENSORBOARD_PYTHON, .venv-browser): \
             EventAccumulator check not run; scripts/test-dashboard runs it"
        ),
    }
}

#[test]
fn a_tensorboardx_file_reads_back() {
    // Written by tensorboardX 2.6.5: add_scalar("privacy/worst_case_epsilon", 0.5,
    // 1), (..., 1.25, 2), add_scalar("privacy/dp_quantile/q99.9", 3.0, 2), and
    // add_text("note", ..., 2), which is not a simple_value and is skipped.
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tensorboardx/events.out.tfevents.fixture");
    let events = read_events(&path).unwrap();
    assert_eq!(events[0].what, What::FileVersion("brain.Event:2".into()));
    let scalars: Vec<(i64, String, f32)> = events
        .iter()
        .filter_map(|e| match &e.what {
            What::Scalars(v) if !v.is_empty() => Some((e.step, v[0].0.clone(), v[0].1)),
            _ => None,
        })
        .collect();
    assert_eq!(
        scalars,
        [
            (1, "privacy/worst_case_epsilon".to_string(), 0.5),
            (2, "privacy/worst_case_epsilon".to_string(), 1.25),
            (2, "privacy/dp_quantile/q99.9".to_string(), 3.0),
        ]
    );
    // A flipped byte anywhere fails the checksum.
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("events.out.tfevents.bad");
    std::fs::write(&bad, bytes).unwrap();
    assert!(read_events(&bad).is_err());
}

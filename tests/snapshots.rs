//! Snapshots against the real server: a restart loads the newest
//! snapshot and replays only the log after it, and serves exactly what a
//! replay of the whole log serves; a corrupted newest snapshot is skipped (an
//! older one is used); `dpledger compact` keeps the pinned snapshot, after which
//! restarts still serve the same values, and a damaged pinned snapshot refuses
//! the start instead of serving a partial history. SQLite and PostgreSQL.

mod common;

use common::pg_schema::TestSchema;
use common::*;
use dpledger::store::{self, Store};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const N: u64 = 400;
const FLAGS: &[&str] = &[
    "--snapshot-records",
    "6",
    "--snapshot-seconds",
    "1",
    "--snapshot-keep",
    "2",
];

fn url(server: &Server, path: &str) -> String {
    format!("{}/v1/datasets/s{path}", server.url)
}

/// A dataset with a filter, releases, labels, refreshes, hyperparameter changes
/// and a multi-part step left half received.
fn build(server: &Server, admin: &str) {
    let mut config = poisson_config(N, 0.05, 1.0);
    config["individual_budget"] = json!({"epsilon": 4.0, "delta": 1e-5});
    let r = post(
        &format!("{}/v1/datasets", server.url),
        Some(admin),
        &json!({"id": "s", "config": config}),
    );
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = put(
        &url(server, "/release-budget"),
        Some(admin),
        &json!({"rho": 1.0}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let labels: Vec<String> = (0..N).map(|i| format!("g{}", i % 3)).collect();
    let ids: Vec<u64> = (0..N).collect();
    let r = put(
        &url(server, "/labels"),
        Some(admin),
        &json!({"ids": ids, "labels": labels}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    for t in 0..40u64 {
        let ids: Vec<u64> = (0..N).filter(|i| (i * 7 + t * 13) % 19 == 0).collect();
        let norms: Vec<f64> = ids.iter().map(|i| ((i + t) % 17) as f64 / 12.0).collect();
        let mut body = json!({"step": t, "ids": ids, "norms": norms});
        if t % 9 == 4 {
            body["noise_multiplier"] = json!(1.3);
        }
        let r = post(&url(server, "/steps"), Some(admin), &body);
        assert_eq!(r.status, 200, "{:?}", r.body);
        if t % 11 == 5 {
            let ids: Vec<u64> = (0..N).step_by(3).collect();
            let norms: Vec<f64> = ids.iter().map(|i| (i % 5) as f64 / 10.0).collect();
            let r = post(
                &url(server, "/refresh"),
                Some(admin),
                &json!({"ids": ids, "norms": norms}),
            );
            assert_eq!(r.status, 200, "{:?}", r.body);
        }
        if t % 15 == 14 {
            let r = post(
                &url(server, "/releases"),
                Some(admin),
                &json!({"mean": {"rho": 0.01}, "by_group": true}),
            );
            assert_eq!(r.status, 201, "{:?}", r.body);
        }
    }
}

/// The first part of step 40 (of 2): the dataset then has a step in progress.
fn half_step(server: &Server, admin: &str, count: u32) {
    let r = post(
        &url(server, "/steps"),
        Some(admin),
        &json!({"step": 40, "ids": [1, 2], "norms": [0.3, 0.4], "part": {"index": 0, "count": count}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
}

/// Everything served about the dataset, for exact comparison.
fn observe(server: &Server, admin: &str) -> Value {
    let mut status = get(&url(server, ""), Some(admin)).body;
    status["status"]["memory_bytes"] = Value::Null;
    let privacy: Vec<Value> = (0..N)
        .step_by(7)
        .map(|i| get(&url(server, &format!("/examples/{i}/privacy")), Some(admin)).body)
        .collect();
    json!({
        "status": status,
        "thresholds": get(&url(server, &format!("/thresholds?from=0&to={N}")), Some(admin)).body,
        "worst": get(&url(server, "/worst-case"), Some(admin)).body,
        "releases": get(&url(server, "/releases"), Some(admin)).body,
        "budget": get(&url(server, "/release-budget"), Some(admin)).body,
        "privacy": privacy,
    })
}

fn metric(server: &Server, admin: &str, name: &str) -> f64 {
    let text = ureq::get(&format!("{}/metrics", server.url))
        .set("Authorization", &format!("Bearer {admin}"))
        .call()
        .expect("metrics")
        .into_string()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// `GET /v1/admin/storage` and the entry of dataset `s` in it.
fn storage(server: &Server, admin: &str) -> (Value, Value) {
    let r = get(&format!("{}/v1/admin/storage", server.url), Some(admin));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let entry = r.body["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == "s")
        .cloned()
        .unwrap_or_else(|| panic!("no dataset s in {}", r.body));
    (r.body, entry)
}

/// Wait until the policy has written a snapshot covering everything (and at
/// least `count` snapshots exist).
fn wait_for_snapshot(store: &dyn Store, count: usize) -> Vec<store::SnapshotInfo> {
    for _ in 0..200 {
        let list = store.snapshots().unwrap();
        let last = {
            let mut last = 0;
            store
                .load_after(0, &mut |r| {
                    last = r.seq;
                    Ok(())
                })
                .unwrap();
            last
        };
        if list.first().is_some_and(|s| s.seq == last) && list.len() >= count {
            return list;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let list = store.snapshots();
    panic!("no snapshot covered the log: {list:?}");
}

fn compact(data_dir: &Path, store_url: &str) -> Value {
    json_output(
        Command::new(binary())
            .args(["compact", "--store", store_url, "--data-dir"])
            .arg(data_dir),
    )
}

/// The whole story on one store; `corrupt` damages a snapshot's bytes in place.
fn story(dir: &Path, store_url: &str, corrupt: &dyn Fn(u64)) {
    let mut server = Server::start_flags(dir, Some(store_url), FLAGS);
    let admin = server.admin_token();
    build(&server, &admin);
    let store = store::open(store_url).unwrap();
    wait_for_snapshot(store.as_ref(), 1);
    half_step(&server, &admin, 2);
    let snaps = wait_for_snapshot(store.as_ref(), 2);
    let served = observe(&server, &admin);

    server.restart();
    assert_eq!(
        observe(&server, &admin),
        served,
        "restart from the snapshot"
    );
    assert_eq!(
        metric(&server, &admin, "dpledger_recovery_snapshots_loaded"),
        1.0
    );
    assert_eq!(
        metric(&server, &admin, "dpledger_recovery_records_replayed"),
        0.0
    );

    corrupt(snaps[0].id);
    server.restart();
    assert_eq!(
        observe(&server, &admin),
        served,
        "fell back to the older snapshot"
    );
    assert_eq!(
        metric(&server, &admin, "dpledger_snapshots_skipped_total"),
        1.0
    );
    assert_eq!(
        metric(&server, &admin, "dpledger_recovery_snapshots_loaded"),
        1.0
    );
    assert!(metric(&server, &admin, "dpledger_recovery_records_replayed") > 0.0);

    // Steps continue after the restart; then compact up to the newest snapshot.
    let r = post(
        &url(&server, "/steps"),
        Some(&admin),
        &json!({"step": 40, "ids": [3], "norms": [0.5], "part": {"index": 1, "count": 2}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["complete"], true);
    let snaps = wait_for_snapshot(store.as_ref(), 2);
    let served = observe(&server, &admin);
    let outcome = compact(dir, store_url);
    let compaction = &outcome[0]["compaction"];
    assert!(compaction["records"].as_u64().unwrap() > 40, "{outcome}");
    assert_eq!(compaction["snapshot"], snaps[0].id);
    let pinned = store.snapshots().unwrap();
    assert!(pinned.iter().any(|s| s.id == snaps[0].id && s.pinned));
    // Every record so far is covered: rows and checksums stay, payloads go.
    let sizes = store.storage().unwrap();
    assert!(sizes.records > 40, "{sizes:?}");
    assert_eq!(sizes.log_bytes, 0, "{sizes:?}");
    assert_eq!(sizes.datasets["s"].records, sizes.records, "{sizes:?}");
    // The admin's storage report says the same, from the server.
    let (report, s) = storage(&server, &admin);
    assert_eq!(report["log_records"], json!(sizes.records), "{report}");
    assert_eq!(report["log_bytes"], json!(0), "{report}");
    assert_eq!(
        report["snapshot_bytes"],
        json!(sizes.snapshot_bytes),
        "{report}"
    );
    assert!(sizes.snapshot_bytes > 0, "{sizes:?}");
    assert_eq!(s["log_records"], json!(sizes.records), "{s}");
    assert_eq!(s["newest_snapshot"]["id"], json!(snaps[0].id), "{s}");
    assert_eq!(s["newest_snapshot"]["pinned"], json!(true), "{s}");
    assert_eq!(s["newest_snapshot"]["seq"], s["last_seq"], "{s}");
    assert_eq!(s["records_since_snapshot"], json!(0), "{s}");
    assert_eq!(s["paged_out"], json!(false), "{s}");
    assert_eq!(s["examples"], json!(N), "{s}");
    assert_eq!(s["steps"], json!(41), "{s}");
    server.restart();
    assert_eq!(observe(&server, &admin), served, "restart after compaction");
    // The policy's pruning never deletes the pinned snapshot.
    for t in 41..60u64 {
        let r = post(
            &url(&server, "/steps"),
            Some(&admin),
            &json!({"step": t, "ids": [t % N], "norms": [0.2]}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    wait_for_snapshot(store.as_ref(), 2);
    assert!(store
        .snapshots()
        .unwrap()
        .iter()
        .any(|s| s.id == snaps[0].id));
    let served = observe(&server, &admin);
    server.restart();
    assert_eq!(observe(&server, &admin), served, "restart after more steps");

    // Without its pinned snapshot (and the newer ones) the history is gone:
    // the server refuses to start rather than serve a partial ledger.
    server.kill();
    for s in store.snapshots().unwrap() {
        corrupt(s.id);
    }
    let refused = Server::try_start_with(dir, Some(store_url), FLAGS)
        .err()
        .expect("the server started without the compacted history");
    assert!(refused.contains("compacted"), "{refused}");
}

#[test]
fn sqlite_restarts_from_snapshots_and_compacts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dpledger.sqlite");
    let store_url = format!("sqlite:{}", db.display());
    let corrupt = |id: u64| {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute(
            "UPDATE dpledger_snapshot_chunks SET data = randomblob(length(data)) WHERE snapshot = ?1",
            [id as i64],
        )
        .unwrap();
    };
    story(dir.path(), &store_url, &corrupt);
}

#[test]
fn postgres_restarts_from_snapshots_and_compacts() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let corrupt = |id: u64| {
        let url = schema.url.clone();
        std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .execute(
                    "UPDATE dpledger_snapshot_chunks SET data = overlay(data placing '\\xdeadbeef'::bytea from 9) WHERE snapshot = $1",
                    &[&(id as i64)],
                )
                .unwrap();
        })
        .join()
        .unwrap();
    };
    story(dir.path(), &schema.url, &corrupt);
}

#[test]
fn snapshot_and_tail_equal_a_replay_of_the_whole_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_flags(dir.path(), None, FLAGS);
    let admin = server.admin_token();
    build(&server, &admin);
    half_step(&server, &admin, 4);
    let db = dir.path().join("dpledger.sqlite");
    let store = store::open(&format!("sqlite:{}", db.display())).unwrap();
    wait_for_snapshot(store.as_ref(), 1);
    drop(store);
    // More records after the newest snapshot: the restart replays a tail.
    for t in 0..3u64 {
        let r = post(
            &url(&server, "/steps"),
            Some(&admin),
            &json!({"step": 40, "ids": [10 + t], "norms": [0.5], "part": {"index": 1 + t as u32, "count": 4}}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    server.restart();
    let from_snapshot = observe(&server, &admin);
    assert_eq!(
        metric(&server, &admin, "dpledger_recovery_snapshots_loaded"),
        1.0
    );
    server.kill();
    // The same store without any snapshot: a replay of the whole log.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("DELETE FROM dpledger_snapshot_chunks; DELETE FROM dpledger_snapshots;")
        .unwrap();
    drop(conn);
    let server = Server::start_flags(
        dir.path(),
        None,
        &["--snapshot-records", "0", "--snapshot-seconds", "0"],
    );
    assert_eq!(
        metric(&server, &admin, "dpledger_recovery_snapshots_loaded"),
        0.0
    );
    assert_eq!(observe(&server, &admin), from_snapshot);
}

/// Wait until the counter `name` reaches `at_least` (metrics reads touch no
/// dataset, so they do not keep one in memory).
fn wait_for_metric(server: &Server, admin: &str, name: &str, at_least: f64) {
    for _ in 0..300 {
        if metric(server, admin, name) >= at_least {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{name} never reached {at_least}");
}

/// Every example's privacy as its owner reads it: the default query for each,
/// another delta and the PLD estimate for some.
fn every_owner_answer(server: &Server, admin: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..N {
        let path = format!("/examples/{i}/privacy");
        out.push(get(&url(server, &path), Some(admin)).body);
        if i % 40 == 0 {
            for query in ["?delta=1e-7", "?method=pld_estimate"] {
                let r = get(&url(server, &format!("{path}{query}")), Some(admin));
                assert_eq!(r.status, 200, "{:?}", r.body);
                out.push(r.body);
            }
        }
    }
    out
}

/// Idle datasets leave memory and come back exactly: a
/// paged-out dataset serves the same values once a request loads it back (a
/// multi-part step in progress included), takes the rest of that step and
/// more steps, is paged out again when archived, answers every owner from the
/// store exactly as from memory without loading it, and a restart (a replay of
/// snapshot and log) serves what the paged-in copy served.
#[test]
fn idle_datasets_leave_memory_and_come_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let flags: Vec<&str> = FLAGS
        .iter()
        .copied()
        .chain([
            "--page-out-seconds",
            "1",
            "--page-out-archived-seconds",
            "1",
            "--storage-gauge-seconds",
            "1",
        ])
        .collect();
    let mut server = Server::start_flags(dir.path(), None, &flags);
    let admin = server.admin_token();
    build(&server, &admin);
    half_step(&server, &admin, 2);
    let served = observe(&server, &admin);
    wait_for_metric(&server, &admin, "dpledger_page_outs_total", 1.0);
    assert_eq!(metric(&server, &admin, "dpledger_page_ins_total"), 0.0);
    assert_eq!(observe(&server, &admin), served, "after paging in");
    assert_eq!(metric(&server, &admin, "dpledger_page_ins_total"), 1.0);

    // A writer loads it back too: the rest of step 40, then more steps.
    wait_for_metric(&server, &admin, "dpledger_page_outs_total", 2.0);
    let r = post(
        &url(&server, "/steps"),
        Some(&admin),
        &json!({"step": 40, "ids": [3], "norms": [0.5], "part": {"index": 1, "count": 2}}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    for t in 41..45u64 {
        let ids: Vec<u64> = (0..N).filter(|i| (i + t) % 23 == 0).collect();
        let norms: Vec<f64> = ids.iter().map(|i| (i % 9) as f64 / 8.0).collect();
        let r = post(
            &url(&server, "/steps"),
            Some(&admin),
            &json!({"step": t, "ids": ids, "norms": norms}),
        );
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let r = post(&url(&server, "/archive"), Some(&admin), &json!({}));
    assert!(r.status < 300, "{:?}", r.body);
    let archived = observe(&server, &admin);
    assert_eq!(
        archived["status"]["archived"],
        json!(true),
        "{}",
        archived["status"]
    );
    let owners = every_owner_answer(&server, &admin);
    // Just touched, so in memory (page-outs wait for a second of idleness).
    let (_, hot) = storage(&server, &admin);
    assert_eq!(hot["paged_out"], json!(false), "{hot}");
    let outs = metric(&server, &admin, "dpledger_page_outs_total");
    wait_for_metric(&server, &admin, "dpledger_page_outs_total", outs + 1.0);

    // Archived and out of memory: owners are answered from the store, exactly
    // as from memory, and nothing is loaded back (the storage report included).
    let ins = metric(&server, &admin, "dpledger_page_ins_total");
    let (report, cold) = storage(&server, &admin);
    assert_eq!(cold["paged_out"], json!(true), "{cold}");
    assert_eq!(report["datasets_paged_out"], json!(1), "{report}");
    for same in ["archived", "examples", "steps", "last_seq", "log_records"] {
        assert_eq!(cold[same], hot[same], "{same}: {hot} vs {cold}");
    }
    assert_eq!(cold["archived"], json!(true), "{cold}");
    assert_eq!(
        (cold["examples"].clone(), cold["steps"].clone()),
        (json!(N), json!(45))
    );
    let (hot_bytes, cold_bytes) = (
        hot["memory_bytes"].as_u64().unwrap(),
        cold["memory_bytes"].as_u64().unwrap(),
    );
    assert!(
        cold_bytes * 2 < hot_bytes,
        "{hot_bytes} B in memory, {cold_bytes} B paged out"
    );
    assert!(cold["archive_bytes"].as_u64().unwrap() > 0, "{cold}");
    assert_eq!(cold["newest_snapshot"]["seq"], cold["last_seq"], "{cold}");
    assert_eq!(cold["records_since_snapshot"], json!(0), "{cold}");
    // The same figures as Prometheus gauges, refreshed every second here.
    wait_for_metric(&server, &admin, "dpledger_dataset_paged_out", 1.0);
    wait_for_metric(&server, &admin, "dpledger_store_archive_bytes", 1.0);
    assert!(metric(&server, &admin, "dpledger_dataset_log_records") >= 45.0);
    assert_eq!(
        every_owner_answer(&server, &admin),
        owners,
        "from the archive"
    );
    assert_eq!(metric(&server, &admin, "dpledger_page_ins_total"), ins);
    assert_eq!(
        metric(&server, &admin, "dpledger_archive_queries_total"),
        owners.len() as f64
    );
    let r = get(
        &url(&server, &format!("/examples/{N}/privacy")),
        Some(&admin),
    );
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(observe(&server, &admin), archived, "archived, paged in");

    server.restart();
    assert_eq!(observe(&server, &admin), archived, "after a restart");

    // A damaged archive block is never trusted: the ledger is loaded back and
    // answers exactly as before.
    wait_for_metric(&server, &admin, "dpledger_page_outs_total", 1.0);
    let conn = rusqlite::Connection::open(dir.path().join("dpledger.sqlite")).unwrap();
    conn.execute(
        "UPDATE dpledger_archive_blocks SET data = randomblob(length(data)) WHERE block = 0",
        [],
    )
    .unwrap();
    let r = get(&url(&server, "/examples/0/privacy"), Some(&admin));
    assert_eq!(r.body, owners[0], "a damaged block");
    assert_eq!(
        metric(&server, &admin, "dpledger_archive_read_failures_total"),
        1.0
    );
    assert_eq!(metric(&server, &admin, "dpledger_page_ins_total"), 1.0);
}

/// SQLite reads each snapshot chunk straight into a reused buffer; a chunk
/// longer than a chunk can be is corruption (found before any of it is
/// allocated or trusted), and an intact snapshot reads back whole.
#[test]
fn sqlite_snapshot_chunks_longer_than_a_chunk_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dpledger.sqlite");
    let store = store::open(&format!("sqlite:{}", db.display())).unwrap();
    let bytes: Vec<u8> = (0..3 * store::CHUNK_BYTES as u64 / 2)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let info = store.write_snapshot("d", 7, &bytes).unwrap();
    assert_eq!(store.read_snapshot(&info).unwrap(), bytes);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE dpledger_snapshot_chunks SET data = zeroblob(length(data) + 1) \
         WHERE snapshot = ?1 AND idx = 0",
        [info.id as i64],
    )
    .unwrap();
    let err = store.read_snapshot(&info).unwrap_err().to_string();
    assert!(err.contains("more than a chunk"), "{err}");
}

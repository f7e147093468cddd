//! Fencing: a write under a stale lease epoch never reaches the log.
//! First at the database itself (the trigger refuses a stale or missing epoch
//! in the same transaction), then with real processes: an owner paused with
//! SIGSTOP past its lease, taken over, then resumed, lands no record under its
//! old epoch after the takeover and answers for the dataset no more.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::*;
use common::pg_schema::TestSchema;
use common::*;
use dpledger::store::cluster::ClusterDb;
use dpledger::store::{Record, RecordKind, StoreError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn record(dataset: &str, kind: RecordKind) -> Record {
    Record {
        dataset: dataset.into(),
        kind,
        step: None,
        part: None,
        payload: b"{}".to_vec(),
    }
}

#[test]
fn the_database_refuses_writes_under_a_stale_epoch() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let store = dpledger::store::open(&schema.url).expect("store");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ttl = Duration::from_millis(300);
    let db = rt
        .block_on(ClusterDb::connect(&schema.url, Duration::from_secs(5)))
        .expect("cluster tables");
    let epoch = rt.block_on(db.claim_new("d", "a", ttl)).unwrap();
    assert_eq!(epoch, Some(1));
    // Another node cannot claim it; the holder's retry gets its own lease.
    assert_eq!(rt.block_on(db.claim_new("d", "b", ttl)).unwrap(), None);
    assert_eq!(rt.block_on(db.claim_new("d", "a", ttl)).unwrap(), Some(1));
    store
        .append_fenced(vec![record("d", RecordKind::DatasetCreated)], None, 1)
        .expect("the holder writes");
    for (epoch, what) in [(Some(2), "a future epoch"), (None, "no epoch")] {
        let refused = match epoch {
            Some(e) => store.append_fenced(vec![record("d", RecordKind::Refresh)], None, e),
            None => store.append(vec![record("d", RecordKind::Refresh)]),
        };
        assert!(
            matches!(refused, Err(StoreError::Fenced { .. })),
            "{what}: {refused:?}"
        );
    }
    // While the lease is live nobody takes it; once it expired, b does, at 2.
    assert!(rt
        .block_on(db.acquire_expired("b", ttl, 10))
        .unwrap()
        .is_empty());
    std::thread::sleep(ttl + Duration::from_millis(100));
    let taken = rt.block_on(db.acquire_expired("b", ttl, 10)).unwrap();
    assert_eq!(taken, vec![("d".to_string(), 2)]);
    // The old holder's write is refused, all of it; the new holder's lands.
    let stale = store.append_fenced(
        vec![
            record("d", RecordKind::Refresh),
            record("d", RecordKind::BudgetChange),
        ],
        None,
        1,
    );
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    store
        .append_fenced(vec![record("d", RecordKind::Refresh)], None, 2)
        .expect("the new holder writes");
    // The old holder can neither renew nor release what it lost.
    assert!(rt.block_on(db.renew("a", ttl)).unwrap().is_empty());
    assert!(!rt.block_on(db.release("d", "a", 1)).unwrap());
    let mut raw = schema.raw();
    let epochs: Vec<Option<i64>> = raw
        .query("SELECT epoch FROM dpledger_events ORDER BY seq", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(epochs, vec![Some(1), Some(2)]);
    drop(store);
}

#[test]
fn a_paused_owner_is_fenced_and_stops_answering() {
    // n2 offers little memory, so that placement puts d on n1.
    let Some(mut cluster) = Cluster::start_with(2, 1000, |i| match i {
        1 => vec!["--node-memory-bytes".into(), "100000000".into()],
        _ => Vec::new(),
    }) else {
        return;
    };
    let (n, q) = (60u64, 0.2);
    cluster.create(0, "d", n, q);
    assert_eq!(
        cluster.wait_owner("d", None, Duration::from_secs(10)).0,
        "n1"
    );
    let admin = cluster.admin_token();
    let trace = Arc::new(poisson_trace(5, n, q, 100_000));
    // A trainer streams steps to the owner, n1, only.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let trainer = {
        let (url, admin, trace, stop, acked) = (
            cluster.nodes[0].url.clone(),
            admin.clone(),
            trace.clone(),
            stop.clone(),
            acked.clone(),
        );
        std::thread::spawn(move || stream(vec![url], "d".into(), admin, trace, stop, acked))
    };
    while acked.load(Ordering::SeqCst) < 30 {
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.nodes[0].pause();
    let paused_at = acked.load(Ordering::SeqCst);
    // n2 takes the dataset over once n1's lease expired, at a higher epoch.
    let (owner, epoch) = cluster.wait_owner("d", Some("n1"), Duration::from_secs(20));
    assert_eq!(owner, "n2");
    assert!(epoch >= 2, "epoch {epoch}");
    // More steps through n2 while n1 is still frozen (the trainer's own
    // in-flight request stays frozen with n1: a second trainer goes on).
    // Fewer than the 32 most recent steps a retry may name: the frozen
    // request, forwarded after the resume, is then answered as a duplicate.
    let url = cluster.nodes[1].url.clone();
    let mut n2_steps = paused_at;
    for _ in 0..20 {
        match try_post(
            &format!("{url}/v1/datasets/d/steps"),
            &admin,
            &trace[n2_steps as usize],
            Duration::from_secs(10),
        ) {
            Some((200, body)) => {
                assert_eq!(body["step"], n2_steps);
                n2_steps += 1;
            }
            other => panic!("step {n2_steps} through the new owner: {other:?}"),
        }
    }
    cluster.nodes[0].resume();
    stop.store(true, Ordering::SeqCst);
    let seen = trainer.join().unwrap();
    // Whatever n1 answered its frozen request, it was either stored before
    // the takeover (epoch 1) or forwarded to n2; nothing else.
    assert!(seen.failures.is_empty(), "{:?}", seen.failures);
    assert_epochs_monotone(&cluster, "d");
    // n1 no longer answers from its stale memory: through n1, the dataset has
    // every step n2 stored (forwarded, or refused as retryable).
    let status = get_retrying(&cluster, "/v1/datasets/d", &admin, Duration::from_secs(20));
    let through_n1 = get(
        &format!("{}/v1/datasets/d", cluster.nodes[0].url),
        Some(&admin),
    );
    assert!(
        through_n1.status == 200 || through_n1.status == 503,
        "{through_n1:?}"
    );
    if through_n1.status == 200 {
        assert_eq!(
            through_n1.body["status"]["steps"],
            status["status"]["steps"]
        );
    } else {
        assert_eq!(through_n1.body["type"], "urn:dpledger:problem:not-owner");
    }
    let steps = status["status"]["steps"].as_u64().unwrap();
    assert!(steps >= n2_steps, "{steps} < {n2_steps}");
    let map = cluster.map(0);
    let d = map["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dataset"] == "d")
        .unwrap();
    assert_eq!(d["owner"], "n2", "{map}");
    // Every step stored once, under epochs that never go back.
    let logged = cluster.logged_steps("d");
    let mut numbers: Vec<i64> = logged.iter().map(|r| r.1).collect();
    numbers.dedup();
    assert_eq!(numbers.len(), logged.len());
    assert_eq!(numbers, (0..steps as i64).collect::<Vec<_>>());
    assert_matches_replay(&cluster, "d", n, q, &trace, steps);
}

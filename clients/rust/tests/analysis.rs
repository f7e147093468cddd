//! Thudi et al.'s data-dependent analysis through the client, against the real
//! server: three runs with a refresh every two steps; the whole analysis for an
//! admin, one example for its owner (equal to the admin's view of it), and the
//! refusals the caller sees.

mod common;

use common::{config, rel, Env, Rng};
use dpledger_client::{AnalysisQuery, Error, StepReport};

async fn train(env: &Env, id: &str, seed: u64, steps: u64) {
    let n = 10;
    env.admin
        .create_dataset(id, &config(n, 0.3, 1.0))
        .await
        .unwrap();
    let mut rng = Rng(seed);
    for t in 0..steps {
        if t % 2 == 0 {
            let ids: Vec<u64> = (0..n).collect();
            let norms: Vec<f64> = ids
                .iter()
                .map(|&i| (0.1 + 0.15 * i as f64) * (0.5 + rng.uniform()))
                .collect();
            env.admin.refresh(id, &ids, &norms).await.unwrap();
        }
        let ids = rng.batch(n, 0.3);
        let norms = ids.iter().map(|_| rng.uniform()).collect();
        env.admin
            .report_step(id, &StepReport::new(t, ids, norms))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn analysis_for_curators_and_owners() {
    let env = Env::start();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        train(&env, id, 11 + i as u64, 6).await;
    }
    let mut query = AnalysisQuery::runs(["a", "b", "c"]);
    query.delta = Some(1e-5);
    let all = env.admin.data_dependent_analysis(&query).await.unwrap();
    assert!(!all.guarantee);
    assert_eq!((all.runs, all.steps, all.examples.len()), (3, 6, 10));
    assert_eq!(all.datasets, vec!["a", "b", "c"]);
    assert_eq!(all.intervals.len(), 3);
    let summary = all.summary.as_ref().unwrap();
    assert!(summary.epsilon.min <= summary.epsilon.max);
    for x in &all.examples {
        assert!(!x.guarantee && x.epsilon > 0.0);
        assert_eq!(x.per_instance_epsilon.as_ref().unwrap().len(), 3);
        assert_eq!(x.data_independent_epsilon, all.data_independent.epsilon);
    }
    // Exact evaluation: never above the rounded one.
    let exact = env
        .admin
        .data_dependent_analysis(&query.clone().exact())
        .await
        .unwrap();
    assert_eq!(exact.order_ratio, 1.0);
    for (e, f) in exact.examples.iter().zip(&all.examples) {
        assert!(e.epsilon <= f.epsilon * (1.0 + 1e-12));
    }
    // The owner of example 4 in every run reads it, and only it.
    let token = env
        .server
        .token_for("owner", &["a", "b", "c"], Some("4"))
        .unwrap();
    let owner = env.admin.with_token(&token).unwrap();
    let mine = owner.data_dependent_example(4, &query).await.unwrap();
    assert_eq!(mine.example.id, 4);
    assert!(rel(mine.example.epsilon, all.examples[4].epsilon) < 1e-9);
    assert_eq!(mine.boundaries, vec![0, 2, 4, 6]);
    match owner.data_dependent_example(5, &query).await {
        Err(Error::Api { problem, .. }) => assert_eq!(problem.status, 403),
        other => panic!("{other:?}"),
    }
    match owner.data_dependent_analysis(&query).await {
        Err(Error::Api { problem, .. }) => assert_eq!(problem.status, 403),
        other => panic!("{other:?}"),
    }
    // Too few runs: 400 naming `runs`.
    match env
        .admin
        .data_dependent_analysis(&AnalysisQuery::runs(["a"]))
        .await
    {
        Err(Error::Api { problem, .. }) => {
            assert_eq!(problem.status, 400);
            assert_eq!(problem.field.as_deref(), Some("runs"));
        }
        other => panic!("{other:?}"),
    }
}

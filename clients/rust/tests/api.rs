//! The client against the real server: datasets, privacy queries, the accountant,
//! operations, and how refusals (problem details, 401, 403) reach the caller.

mod common;

use common::{config, rel, Env};
use dpledger_client::accountant::{
    AccountantMethod, CompareRequest, EpsilonRequest, NoiseRequest, RdpRequest, ScheduleKind,
    ScheduleRequest,
};
use dpledger_client::{
    Client, Conversion, Error, IndividualBudget, LedgerKind, PrivacyKind, PrivacyQuery,
    RetryPolicy, StepReport,
};

/// The problem of an `Error::Api`, or a panic naming what came instead.
fn problem(result: Result<impl std::fmt::Debug, Error>) -> (u16, String, Option<String>, u32) {
    match result {
        Err(Error::Api { problem, attempts }) => {
            (problem.status, problem.detail, problem.field, attempts)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn datasets_create_list_get_archive() {
    let env = Env::start();
    let mut cfg = config(50, 0.1, 1.0);
    cfg.individual_budget = Some(IndividualBudget {
        epsilon: 4.0,
        delta: 1e-5,
    });
    let view = env.admin.create_dataset("run-a", &cfg).await.unwrap();
    assert_eq!(view.id, "run-a");
    assert!(!view.archived);
    assert_eq!(view.config, cfg);
    assert_eq!(view.status.examples, 50);
    assert_eq!(view.status.steps, 0);
    // The sampled protocol (tests/common): no per-example proven statement.
    assert!(!view.status.guarantee);
    assert_eq!(view.status.filter.as_ref().unwrap().epsilon, 4.0);
    assert_eq!(view.worst_case.steps, 0);
    assert!(view.worst_case.epsilon >= 0.0 && view.worst_case.rdp.rdp.iter().all(|&r| r == 0.0));
    env.admin
        .create_dataset("run-b", &config(10, 0.5, 2.0))
        .await
        .unwrap();

    // Taken id: 409 with the server's detail; not retried (a refusal, not a failure).
    let (status, detail, _, attempts) = problem(env.admin.create_dataset("run-a", &cfg).await);
    assert_eq!((status, attempts), (409, 1));
    assert!(detail.contains("already exists"), "{detail}");
    // Ids a URL cannot address are refused before sending.
    assert!(matches!(
        env.admin.create_dataset("..", &cfg).await,
        Err(Error::InvalidRequest(_))
    ));

    assert_eq!(
        env.admin.list_datasets().await.unwrap(),
        vec!["run-a".to_string(), "run-b".to_string()]
    );
    let trainer_b = env.client_as("trainer", Some("run-b"), None);
    assert_eq!(trainer_b.list_datasets().await.unwrap(), vec!["run-b"]);
    let got = trainer_b.dataset("run-b").await.unwrap();
    assert_eq!(got.config.noise_multiplier, 2.0);

    // A curator archives; a trainer may not; an archived dataset refuses steps.
    let curator = env.client_as("curator", Some("run-b"), None);
    let (status, detail, _, _) = problem(trainer_b.archive_dataset("run-b").await);
    assert_eq!(status, 403, "{detail}");
    let archived = curator.archive_dataset("run-b").await.unwrap();
    assert!(archived.archived);
    assert!(curator.archive_dataset("run-b").await.unwrap().archived);
    let (status, detail, _, _) = problem(
        trainer_b
            .report_step("run-b", &StepReport::new(0, vec![1], vec![0.5]))
            .await,
    );
    assert_eq!(status, 409);
    assert!(detail.contains("archived"), "{detail}");
}

#[tokio::test(flavor = "multi_thread")]
async fn problem_details_surface_as_errors() {
    let env = Env::start();
    env.admin
        .create_dataset("d", &config(20, 0.2, 1.0))
        .await
        .unwrap();
    let c = &env.admin;

    let (status, detail, field, attempts) = problem(
        c.report_step("d", &StepReport::new(0, vec![1, 2], vec![0.5, -1.0]))
            .await,
    );
    assert_eq!((status, attempts), (400, 1));
    assert_eq!(field.as_deref(), Some("norms"));
    assert!(detail.contains("norms[1] = -1"), "{detail}");

    let (status, _, field, _) = problem(
        c.report_step("d", &StepReport::new(0, vec![20], vec![0.5]))
            .await,
    );
    assert_eq!((status, field.as_deref()), (400, Some("ids")));

    c.report_step("d", &StepReport::new(0, vec![1], vec![0.5]))
        .await
        .unwrap();
    // A gap names the step the ledger expects.
    let (status, detail, _, _) = problem(
        c.report_step("d", &StepReport::new(5, vec![1], vec![0.5]))
            .await,
    );
    assert_eq!(status, 409);
    assert!(detail.contains("expects step 1"), "{detail}");

    let (status, _, _, _) = problem(c.dataset("nope").await);
    assert_eq!(status, 404);
    let (status, _, field, _) =
        problem(c.example_privacy("d", 1, PrivacyQuery::at_delta(2.0)).await);
    assert_eq!((status, field.as_deref()), (400, Some("delta")));
    let (status, _, _, _) = problem(c.thresholds("d", Some(9), Some(3)).await);
    assert_eq!(status, 400);
    let (status, detail, field, _) = problem(
        c.accountant_epsilon(&EpsilonRequest {
            sampling_rate: 1.5,
            noise_multiplier: 1.0,
            steps: 10,
            delta: 1e-5,
            orders: None,
            conversion: None,
            method: None,
            value_discretization: None,
        })
        .await,
    );
    assert_eq!((status, field.as_deref()), (400, Some("sampling_rate")));
    assert!(detail.contains("1.5"), "{detail}");
    // The error's Display carries the detail too.
    let err = c.dataset("nope").await.unwrap_err();
    assert!(err.to_string().contains("no dataset"), "{err}");
    assert_eq!(err.status(), Some(404));
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_failures_are_clear() {
    let env = Env::start();
    env.admin
        .create_dataset("mine", &config(20, 0.2, 1.0))
        .await
        .unwrap();
    env.admin
        .create_dataset("other", &config(20, 0.2, 1.0))
        .await
        .unwrap();

    let anonymous = Client::builder(env.server.url()).build().unwrap();
    let (status, detail, _, attempts) = problem(anonymous.dataset("mine").await);
    assert_eq!((status, attempts), (401, 1));
    assert!(detail.contains("Authorization"), "{detail}");
    let forged = env.admin.with_token("not.a.jwt").unwrap();
    let (status, detail, _, _) = problem(forged.list_datasets().await);
    assert_eq!(status, 401);
    assert!(detail.contains("invalid bearer token"), "{detail}");

    let trainer = env.client_as("trainer", Some("mine"), None);
    trainer
        .report_step("mine", &StepReport::new(0, vec![3], vec![0.2]))
        .await
        .unwrap();
    let (status, detail, _, _) = problem(
        trainer
            .report_step("other", &StepReport::new(0, vec![3], vec![0.2]))
            .await,
    );
    assert_eq!(status, 403);
    assert!(detail.contains("training access"), "{detail}");
    let (status, _, _, _) = problem(trainer.create_dataset("x", &config(5, 0.1, 1.0)).await);
    assert_eq!(status, 403);
    // A trainer does not read per-example privacy.
    let (status, _, _, _) = problem(
        trainer
            .example_privacy("mine", 3, PrivacyQuery::default())
            .await,
    );
    assert_eq!(status, 403);

    let owner = env.client_as("owner", Some("mine"), Some("3"));
    owner
        .example_privacy("mine", 3, PrivacyQuery::default())
        .await
        .unwrap();
    let (status, detail, _, _) = problem(
        owner
            .example_privacy("mine", 4, PrivacyQuery::default())
            .await,
    );
    assert_eq!(status, 403);
    assert!(detail.contains("access to this example"), "{detail}");

    let viewer = env.client_as("viewer", Some("mine"), None);
    viewer
        .worst_case("mine", PrivacyQuery::default())
        .await
        .unwrap();
    let (status, _, _, _) = problem(viewer.worst_case("other", PrivacyQuery::default()).await);
    assert_eq!(status, 403);
    let (status, _, _, _) = problem(
        viewer
            .example_privacy("mine", 3, PrivacyQuery::default())
            .await,
    );
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn owner_privacy_and_worst_case() {
    let env = Env::start();
    let mut cfg = config(100, 0.05, 1.0);
    let orders = vec![2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
    cfg.orders = Some(orders.clone());
    env.admin.create_dataset("p", &cfg).await.unwrap();
    let trainer = env.client_as("trainer", Some("p"), None);
    // Example 7 is always sampled with a small norm; 8 with a norm above C.
    for t in 0..5 {
        let out = trainer
            .report_step("p", &StepReport::new(t, vec![7, 8], vec![0.305, 2.5]))
            .await
            .unwrap();
        assert!(rel(out.thresholds[0], 0.31) < 1e-12 && out.thresholds[1] == 1.0);
        assert!(!out.duplicate && out.complete);
    }

    let owner = env.client_as("owner", Some("p"), Some("7,8"));
    let seven = owner
        .example_privacy("p", 7, PrivacyQuery::default())
        .await
        .unwrap();
    assert_eq!(seven.delta, 1e-5);
    assert_eq!(seven.example.id, 7);
    assert_eq!(seven.example.steps, 5);
    assert!(rel(seven.example.threshold, 0.31) < 1e-12);
    // The sampled protocol: the ledger's numbers are estimates.
    assert!(seven.example.ledger == LedgerKind::Sampled && !seven.example.retired);
    assert_eq!(seven.example.estimate.kind, PrivacyKind::Estimate);
    assert_eq!(seven.example.guarantee.kind, PrivacyKind::WorstCase);
    assert_eq!(seven.example.rdp.len(), orders.len());
    let eight = owner
        .example_privacy("p", 8, PrivacyQuery::default())
        .await
        .unwrap();
    assert!(seven.example.rdp_epsilon < eight.example.rdp_epsilon);
    assert!(seven
        .example
        .rdp
        .iter()
        .zip(&eight.example.rdp)
        .all(|(a, b)| a < b));
    // Clipped at C every step: exactly the worst case.
    assert!(rel(eight.example.epsilon, eight.worst_case.epsilon) < 1e-12);

    // The worst case equals the stateless accountant for the same steps and orders.
    let worst = owner
        .worst_case("p", PrivacyQuery::default())
        .await
        .unwrap();
    assert_eq!(worst, seven.worst_case);
    assert_eq!(worst.steps, 5);
    let offline = env
        .admin
        .accountant_epsilon(&EpsilonRequest {
            sampling_rate: 0.05,
            noise_multiplier: 1.0,
            steps: 5,
            delta: 1e-5,
            orders: Some(orders.clone()),
            conversion: None,
            method: Some(AccountantMethod::Rdp),
            value_discretization: None,
        })
        .await
        .unwrap();
    // Its RDP part equals the stateless RDP accountant; the headline is the
    // tighter of PLD and RDP, never above it.
    assert!(rel(worst.rdp.epsilon, offline.epsilon.unwrap()) < 1e-9);
    assert!(worst.epsilon <= worst.rdp.epsilon * (1.0 + 1e-12));

    // Another delta and the classic conversion give larger epsilons.
    let tighter = owner
        .example_privacy("p", 7, PrivacyQuery::at_delta(1e-8))
        .await
        .unwrap();
    assert_eq!(tighter.delta, 1e-8);
    assert!(tighter.example.rdp_epsilon > seven.example.rdp_epsilon);
    let classic = owner
        .example_privacy(
            "p",
            7,
            PrivacyQuery {
                delta: None,
                conversion: Some(Conversion::Classic),
            },
        )
        .await
        .unwrap();
    assert!(classic.example.rdp_epsilon > seven.example.rdp_epsilon);
}

#[tokio::test(flavor = "multi_thread")]
async fn accountant_calls() {
    let env = Env::start();
    let c = env.client_as("viewer", Some("anything"), None);

    // The published figure: q = 0.01, sigma = 1.1, 10,000 steps, delta = 1e-5.
    let run = EpsilonRequest {
        sampling_rate: 0.01,
        noise_multiplier: 1.1,
        steps: 10_000,
        delta: 1e-5,
        orders: None,
        conversion: None,
        method: Some(AccountantMethod::Rdp),
        value_discretization: None,
    };
    let e = c.accountant_epsilon(&run).await.unwrap();
    assert!((e.epsilon.unwrap() - 5.632).abs() < 1e-3, "{e:?}");
    assert_eq!((e.delta, e.method), (1e-5, AccountantMethod::Rdp));
    // The default is the tightest method, PLD.
    let tight = c
        .accountant_epsilon(&EpsilonRequest {
            method: None,
            ..run.clone()
        })
        .await
        .unwrap();
    assert_eq!(tight.method, AccountantMethod::Pld);
    assert!(tight.epsilon.unwrap() < e.epsilon.unwrap(), "{tight:?}");

    // q = 1: the plain Gaussian mechanism, RDP = alpha / (2 sigma^2).
    let rdp = c
        .accountant_rdp(&RdpRequest {
            sampling_rate: 1.0,
            noise_multiplier: 2.0,
            orders: Some(vec![2.0, 32.0]),
        })
        .await
        .unwrap();
    assert_eq!(rdp.orders, vec![2.0, 32.0]);
    assert!(rel(rdp.rdp[0].unwrap(), 2.0 / 8.0) < 1e-9);
    assert!(rel(rdp.rdp[1].unwrap(), 32.0 / 8.0) < 1e-9);
    // sigma = 0 has no privacy: infinite RDP reads as None.
    let none = c
        .accountant_rdp(&RdpRequest {
            sampling_rate: 0.5,
            noise_multiplier: 0.0,
            orders: Some(vec![2.0]),
        })
        .await
        .unwrap();
    assert_eq!(none.rdp, vec![None]);

    // Calibrated noise meets the target, tightly.
    let noise = c
        .accountant_noise(&NoiseRequest {
            target_epsilon: 2.0,
            delta: 1e-5,
            sampling_rate: 0.02,
            steps: 1000,
            orders: None,
            method: Some(AccountantMethod::Rdp),
            value_discretization: None,
        })
        .await
        .unwrap();
    assert_eq!(noise.method, AccountantMethod::Rdp);
    let at = c
        .accountant_epsilon(&EpsilonRequest {
            sampling_rate: 0.02,
            noise_multiplier: noise.noise_multiplier,
            steps: 1000,
            delta: 1e-5,
            orders: None,
            conversion: Some(Conversion::Improved),
            method: Some(AccountantMethod::Rdp),
            value_discretization: None,
        })
        .await
        .unwrap()
        .epsilon
        .unwrap();
    assert!(at <= 2.0 && at > 1.99, "{at}");

    let table = c
        .accountant_compare(&CompareRequest {
            sampling_rate: 0.01,
            noise_multiplier: 1.1,
            steps: 10_000,
            delta: 1e-5,
        })
        .await
        .unwrap();
    assert_eq!(table.rows[0].method, "pld");
    assert_eq!(table.rows[1].method, "rdp");
    assert!(table.rows[0].guarantee && table.rows[1].guarantee);
    assert!(rel(table.rows[0].epsilon.unwrap(), tight.epsilon.unwrap()) < 1e-9);
    assert!(rel(table.rows[1].epsilon.unwrap(), e.epsilon.unwrap()) < 1e-9);
    assert!(table.rows.len() >= 4);

    let mut req = ScheduleRequest::new(ScheduleKind::Constant, 1.0);
    req.budget_epsilon = Some(3.0);
    req.delta = Some(1e-5);
    req.sampling_rate = Some(0.01);
    req.max_epochs = Some(1000);
    let plan = c.accountant_schedule(&req).await.unwrap();
    assert_eq!(plan.unit, "epsilon");
    let stop = plan
        .stop_epoch
        .expect("a constant sigma exhausts the budget") as usize;
    assert!(stop > 0);
    assert!(plan.epochs[..stop].iter().all(|e| e.within_budget));
    assert!(!plan.epochs[stop].within_budget);
    assert!(plan.sigma_per_epoch.iter().all(|&s| s == 1.0));
    let spent: Vec<f64> = plan.epochs.iter().map(|e| e.spent.unwrap()).collect();
    assert!(spent.windows(2).all(|w| w[0] < w[1]));
    assert!(spent[stop - 1] <= 3.0 && spent[stop] > 3.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn operations_endpoints() {
    let env = Env::start();
    let anonymous = Client::builder(env.server.url()).build().unwrap();
    assert_eq!(anonymous.health().await.unwrap().status, "ok");
    assert_eq!(anonymous.ready().await.unwrap().status, "ok");
    env.admin
        .create_dataset("m", &config(10, 0.5, 1.0))
        .await
        .unwrap();
    env.admin
        .report_step("m", &StepReport::new(0, vec![1, 2], vec![0.1, 0.2]))
        .await
        .unwrap();
    // The admin's storage report, typed: dataset m's records and memory.
    let report = env.admin.storage().await.unwrap();
    let m = report.datasets.iter().find(|d| d.id == "m").unwrap();
    assert_eq!((m.examples, m.steps, m.paged_out), (10, 1, false));
    assert!(m.log_records >= 2 && m.memory_bytes > 0);
    assert!(report.memory_bytes >= m.memory_bytes);
    assert!(anonymous.storage().await.is_err());
    // /metrics names datasets and groups: it needs an admin or metrics token.
    let refused = anonymous.metrics().await.unwrap_err();
    assert!(
        matches!(&refused, Error::Api { problem, .. } if problem.status == 401),
        "{refused:?}"
    );
    let metrics = env.admin.metrics().await.unwrap();
    assert!(metrics.contains("dpledger_steps_total"), "{metrics}");
    assert!(
        metrics.contains("dpledger_norms_ingested_total"),
        "{metrics}"
    );

    // Every endpoint this client calls is in the served document.
    let doc = anonymous.openapi().await.unwrap();
    let paths = doc["paths"].as_object().expect("paths");
    for p in [
        "/v1/datasets",
        "/v1/datasets/{dataset}",
        "/v1/datasets/{dataset}/archive",
        "/v1/datasets/{dataset}/steps",
        "/v1/datasets/{dataset}/thresholds",
        "/v1/datasets/{dataset}/refresh",
        "/v1/datasets/{dataset}/examples/{example}/privacy",
        "/v1/datasets/{dataset}/worst-case",
        "/v1/accountant/rdp",
        "/v1/accountant/epsilon",
        "/v1/accountant/noise",
        "/v1/accountant/compare",
        "/v1/accountant/schedule",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(
            paths.contains_key(p),
            "{p} missing from the OpenAPI document"
        );
    }

    // Nothing listens: a transport error after the configured attempts.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = Client::builder(format!("http://127.0.0.1:{port}"))
        .retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: std::time::Duration::from_millis(10),
            max_backoff: std::time::Duration::from_millis(20),
        })
        .build()
        .unwrap();
    match dead.health().await {
        Err(Error::Transport { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

//! DP releases against the real server: a release's cost reaches every
//! owner's RDP and the worst case by exactly `alpha * rho`; viewers read releases
//! at no cost; over-budget refusals carry the budget extension; a release whose
//! answer was lost is never sent again; per-group releases follow the labels; a
//! policy releases every N steps.

mod common;

use common::proxy::{answer_dropping_proxy, socket_addr};
use common::{config, rel, Env, Rng};
use dpledger_client::{
    BudgetRequest, Client, DatasetConfig, DatasetSetup, Error, PrivacyQuery, PrivacyView,
    ReleaseList, ReleasePolicy, ReleaseRequest, ReleaseTrigger, RetryPolicy, StepReport,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

const N: u64 = 200;
/// Rényi orders of the test datasets, up to 1024 like the server's default list.
const ORDERS: [f64; 12] = [
    1.25, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0,
];

fn dataset_config() -> DatasetConfig {
    let mut c = config(N, 0.1, 1.0);
    c.orders = Some(ORDERS.to_vec());
    c
}

/// Even ids "even", odd ids "odd".
fn parity_labels() -> Vec<Option<String>> {
    (0..N)
        .map(|i| Some(if i % 2 == 0 { "even" } else { "odd" }.to_string()))
        .collect()
}

/// Steps `from..to` of Poisson batches; odd ids have small gradients (their
/// epsilons stay far below the worst case), even ids are clipped at `C`.
async fn run_steps(trainer: &Client, dataset: &str, from: u64, to: u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ from);
    for t in from..to {
        let ids = rng.batch(N, 0.1);
        let norms = ids
            .iter()
            .map(|i| if i % 2 == 1 { 0.05 } else { 2.0 })
            .collect();
        let out = trainer
            .report_step(dataset, &StepReport::new(t, ids, norms))
            .await
            .unwrap();
        assert!(out.complete && !out.duplicate);
    }
}

/// The dataset's release list once `done` holds of it (at most 20 s): steps
/// never wait for policy releases, which are published shortly after the step
/// that made them due, so a reader polls as a dashboard would.
async fn wait_for_list(
    client: &Client,
    dataset: &str,
    done: impl Fn(&ReleaseList) -> bool,
) -> ReleaseList {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = client.releases(dataset, None).await.unwrap();
        if done(&list) || std::time::Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn privacy(owner: &Client, dataset: &str, id: u64) -> PrivacyView {
    owner
        .example_privacy(dataset, id, PrivacyQuery::default())
        .await
        .unwrap()
}

fn summary(rho_each: f64) -> ReleaseRequest {
    ReleaseRequest::default()
        .mean(rho_each)
        .quantiles(rho_each, vec![0.9, 0.1, 0.5])
        .histogram(rho_each, 5)
}

fn retrying(url: String, token: String) -> Client {
    Client::builder(url)
        .token(token)
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_is_charged_to_every_owner_and_the_worst_case() {
    let env = Env::start();
    let setup = DatasetSetup {
        release_budget: Some(BudgetRequest::rho(0.01)),
        labels: Some(parity_labels()),
        release_policy: None,
    };
    let view = env
        .admin
        .create_dataset_with("d", &dataset_config(), &setup)
        .await
        .unwrap();
    assert_eq!(view.status.releases, 0);
    let trainer = env.client_as("trainer", Some("d"), None);
    let curator = env.client_as("curator", Some("d"), None);
    let viewer = env.client_as("viewer", Some("d"), None);
    let owner = env.client_as("owner", Some("d"), Some("7"));

    let budget = viewer.release_budget("d").await.unwrap();
    assert_eq!(
        (budget.rho_budget, budget.rho_spent, budget.releases),
        (Some(0.01), 0.0, 0)
    );
    assert_eq!(budget.rho_left(), Some(0.01));
    let none = viewer.latest_release("d").await.unwrap_err();
    assert_eq!(none.status(), Some(404), "{none}");

    run_steps(&trainer, "d", 0, 20).await;
    let before = privacy(&owner, "d", 7).await;

    // Mean, quantiles and a histogram in one release.
    let outcome = curator.create_release("d", &summary(0.001)).await.unwrap();
    let release = &outcome.release;
    assert_eq!(
        (release.id, release.step, release.trigger),
        (1, 20, ReleaseTrigger::Request)
    );
    assert!(rel(release.rho, 0.003) < 1e-15, "{}", release.rho);
    assert!(rel(release.rho, summary(0.001).rho()) < 1e-15);
    assert!(rel(outcome.budget.rho_spent, 0.003) < 1e-15);
    assert_eq!(outcome.budget.releases, 1);
    assert_eq!(release.delta, 1e-5);
    // The bound B is the worst case before the release.
    let bound = release.bound;
    assert!(rel(bound, before.worst_case.epsilon) < 1e-12, "{bound}");
    let pop = release.values.population.as_ref().unwrap();
    assert!(release.values.groups.is_none());
    let mean = pop.mean.unwrap();
    assert!((0.0..=bound).contains(&mean.mean) && mean.count >= 0.0);
    let quantiles = pop.quantiles.as_ref().unwrap();
    let levels: Vec<f64> = quantiles.iter().map(|q| q.level).collect();
    assert_eq!(levels, vec![0.1, 0.5, 0.9]);
    assert_eq!(release.request.quantiles.as_ref().unwrap().levels, levels);
    assert!(quantiles.windows(2).all(|w| w[0].value <= w[1].value));
    assert!(quantiles.iter().all(|q| (0.0..=bound).contains(&q.value)));
    let histogram = pop.histogram.as_ref().unwrap();
    assert_eq!((histogram.counts.len(), histogram.edges.len()), (5, 6));
    assert_eq!(histogram.edges[0], 0.0);
    assert!(rel(histogram.edges[5], bound) < 1e-12);
    assert!(histogram.counts.iter().all(|&c| c >= 0.0));

    // Spec §6: the owner's RDP and the worst case rise by alpha * rho at every order.
    let after = privacy(&owner, "d", 7).await;
    assert_eq!(after.example.rdp.len(), ORDERS.len());
    for (j, alpha) in ORDERS.iter().enumerate() {
        let charge = alpha * release.rho;
        let own = after.example.rdp[j] - before.example.rdp[j];
        let worst = after.worst_case.rdp.rdp[j] - before.worst_case.rdp.rdp[j];
        assert!(
            own >= charge * (1.0 - 1e-9),
            "order {alpha}: {own} < {charge}"
        );
        assert!(rel(own, charge) < 1e-9, "order {alpha}: {own} vs {charge}");
        assert!(
            rel(worst, charge) < 1e-9,
            "worst case, order {alpha}: {worst} vs {charge}"
        );
    }
    assert!(after.example.epsilon > before.example.epsilon);
    assert!(after.worst_case.epsilon > before.worst_case.epsilon);
    assert_eq!(after.example.steps, 20);

    // Viewers read the latest release and the list at no new cost.
    for _ in 0..3 {
        assert_eq!(&viewer.latest_release("d").await.unwrap(), release);
    }
    let list = viewer.releases("d", Some(10)).await.unwrap();
    assert_eq!(list.releases, vec![release.clone()]);
    assert_eq!(list.budget, outcome.budget);
    assert!(list.policy.is_none() && list.policy_error.is_none());
    assert_eq!(privacy(&owner, "d", 7).await, after);
    // A viewer may not publish.
    let err = viewer
        .create_release("d", &summary(0.001))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");

    // Over budget: 409 with the spend, the request and the budget; nothing changes.
    let err = curator
        .create_release("d", &summary(0.003))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    let refusal = err.budget().expect("a budget extension");
    assert!(rel(refusal.rho_spent, 0.003) < 1e-15, "{refusal:?}");
    assert!(rel(refusal.rho_requested, 0.009) < 1e-15, "{refusal:?}");
    assert_eq!(refusal.rho_budget, Some(0.01));
    assert!(matches!(err, Error::Api { attempts: 1, .. }));
    assert_eq!(privacy(&owner, "d", 7).await, after);
    assert_eq!(
        viewer.release_budget("d").await.unwrap(),
        outcome.budget,
        "a refusal spends nothing"
    );
    assert_eq!(env.admin.dataset("d").await.unwrap().status.releases, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_whose_answer_was_lost_is_retried_with_its_key_and_charged_once() {
    let env = Env::start();
    let setup = DatasetSetup {
        release_budget: Some(BudgetRequest::rho(0.01)),
        ..DatasetSetup::default()
    };
    env.admin
        .create_dataset_with("r", &dataset_config(), &setup)
        .await
        .unwrap();
    run_steps(&env.client_as("trainer", Some("r"), None), "r", 0, 5).await;
    let token = env.server.token("curator", Some("r"), None).unwrap();

    // The server publishes the release but its answer never arrives: the client
    // sends it again with the same Idempotency-Key, and the server answers with
    // the release it published instead of publishing (and charging) a second one.
    let (proxy, dropped) = answer_dropping_proxy(
        socket_addr(env.server.url()),
        b"POST /v1/datasets/r/releases",
        1,
    )
    .await;
    let through_proxy = retrying(format!("http://{proxy}"), token.clone());
    let request = ReleaseRequest::default().mean(0.002);
    let outcome = through_proxy.create_release("r", &request).await.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(outcome.release.id, 1);
    let list = env.admin.releases("r", None).await.unwrap();
    assert_eq!(list.releases.len(), 1, "{list:?}");
    assert_eq!(list.budget.releases, 1);
    assert!(rel(list.budget.rho_spent, 0.002) < 1e-15);
    assert!(rel(outcome.budget.rho_spent, 0.002) < 1e-15);
    assert_eq!(
        env.admin.latest_release("r").await.unwrap(),
        outcome.release
    );

    // A second call is a new release (a new key), charged again.
    let second = through_proxy.create_release("r", &request).await.unwrap();
    assert_eq!(second.release.id, 2);
    assert!(rel(second.budget.rho_spent, 0.004) < 1e-15);

    // Setting the budget is idempotent: its lost answer is retried and succeeds.
    let (proxy, dropped) = answer_dropping_proxy(
        socket_addr(env.server.url()),
        b"PUT /v1/datasets/r/release-budget",
        1,
    )
    .await;
    let through_proxy = retrying(format!("http://{proxy}"), token);
    let budget = through_proxy
        .set_release_budget("r", &BudgetRequest::rho(0.02))
        .await
        .unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(budget.rho_budget, Some(0.02));
    assert!(rel(budget.rho_spent, 0.004) < 1e-15);
    assert_eq!(budget.releases, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn per_group_releases_follow_the_labels() {
    let env = Env::start();
    let setup = DatasetSetup {
        release_budget: Some(BudgetRequest::rho(0.01)),
        labels: Some(parity_labels()),
        release_policy: None,
    };
    env.admin
        .create_dataset_with("g", &dataset_config(), &setup)
        .await
        .unwrap();
    let trainer = env.client_as("trainer", Some("g"), None);
    // A full-batch refresh first: odd ids sit at their small threshold from step 0,
    // so the groups' mean epsilons differ by about the whole bound B, far beyond
    // the noise of a per-group mean at rho = 0.004 (sd ~0.3 each). Without it odd
    // ids keep C until first sampled and the ordering below flakes (gap ~0.8).
    let ids: Vec<u64> = (0..N).collect();
    let norms: Vec<f64> = ids
        .iter()
        .map(|i| if i % 2 == 1 { 0.05 } else { 2.0 })
        .collect();
    trainer.refresh("g", &ids, &norms).await.unwrap();
    run_steps(&trainer, "g", 0, 20).await;
    let curator = env.client_as("curator", Some("g"), None);

    // One entry per label in order of first use, the unlabelled (none here) last.
    let out = curator
        .create_release("g", &ReleaseRequest::default().mean(0.004).by_group())
        .await
        .unwrap();
    let values = &out.release.values;
    assert!(values.population.is_none());
    let labels: Vec<Option<&str>> = values
        .groups
        .as_ref()
        .unwrap()
        .iter()
        .map(|g| g.label.as_deref())
        .collect();
    assert_eq!(labels, vec![Some("even"), Some("odd"), None]);
    // Odd examples (norm 0.05) leak far less than even ones (norm 2 > C).
    let mean_of = |label| values.group(label).unwrap().mean.unwrap().mean;
    assert!(
        mean_of(Some("odd")) < mean_of(Some("even")),
        "{:?}",
        values.groups
    );
    assert!(values.group(Some("even")).unwrap().quantiles.is_none());

    // Relabelling: a new group, and an unlabelled example.
    let view = curator
        .set_labels("g", &[0, 1], &[Some("new".to_string()), None])
        .await
        .unwrap();
    assert_eq!(view.groups, vec!["even", "odd", "new"]);
    let out = curator
        .create_release(
            "g",
            &ReleaseRequest::default()
                .histogram(0.001, 4)
                .by_group()
                .at_delta(1e-6),
        )
        .await
        .unwrap();
    assert_eq!(out.release.delta, 1e-6);
    let groups = out.release.values.groups.as_ref().unwrap();
    let labels: Vec<Option<&str>> = groups.iter().map(|g| g.label.as_deref()).collect();
    assert_eq!(labels, vec![Some("even"), Some("odd"), Some("new"), None]);
    assert!(groups
        .iter()
        .all(|g| g.statistics.histogram.as_ref().unwrap().counts.len() == 4));
    assert!(rel(out.budget.rho_spent, 0.005) < 1e-15);

    // Refused labels: unknown ids (400 naming the field), and mismatched lengths,
    // which never leave the client.
    let err = curator
        .set_labels("g", &[N], &[Some("x".to_string())])
        .await
        .unwrap_err();
    assert_eq!(
        (err.status(), err.problem().and_then(|p| p.field.as_deref())),
        (Some(400), Some("ids")),
        "{err}"
    );
    assert!(matches!(
        curator.set_labels("g", &[1, 2], &[None]).await,
        Err(Error::InvalidRequest(_))
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_without_a_budget_labels_or_steps() {
    let env = Env::start();
    env.admin
        .create_dataset("n", &dataset_config())
        .await
        .unwrap();
    let curator = env.client_as("curator", Some("n"), None);
    let request = ReleaseRequest::default().mean(0.001);

    // No budget yet: 409, with a budget extension saying none is set.
    let budget = curator.release_budget("n").await.unwrap();
    assert_eq!((budget.rho_budget, budget.releases), (None, 0));
    assert_eq!(budget.rho_left(), None);
    let err = curator.create_release("n", &request).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    let refusal = err.budget().expect("a budget extension");
    assert_eq!(refusal.rho_budget, None);
    assert_eq!(refusal.rho_requested, 0.001);
    assert!(err.problem().unwrap().detail.contains("release-budget"));

    // A budget as (epsilon, delta), converted to rho by the server.
    let budget = curator
        .set_release_budget("n", &BudgetRequest::epsilon(1.0, 1e-6))
        .await
        .unwrap();
    let rho = budget.rho_budget.unwrap();
    assert!(rho > 0.02 && rho < 0.05, "{rho}");
    assert_eq!(curator.release_budget("n").await.unwrap(), budget);

    // Nothing to release before the first step: 409 without a budget extension.
    let err = curator.create_release("n", &request).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert!(err.budget().is_none());
    assert!(err.problem().unwrap().detail.contains("nothing to release"));

    run_steps(&env.client_as("trainer", Some("n"), None), "n", 0, 3).await;
    // by_group needs labels.
    let err = curator
        .create_release("n", &request.clone().by_group())
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert_eq!(err.problem().unwrap().field.as_deref(), Some("by_group"));
    // An empty request names the field.
    let err = curator
        .create_release("n", &ReleaseRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        (err.status(), err.problem().and_then(|p| p.field.as_deref())),
        (Some(400), Some("release"))
    );
    // None of it spent anything.
    assert_eq!(curator.release_budget("n").await.unwrap(), budget);
    assert_eq!(
        curator.latest_release("n").await.unwrap_err().status(),
        Some(404)
    );
    // The budget cannot drop below the spend.
    curator.create_release("n", &request).await.unwrap();
    let err = curator
        .set_release_budget("n", &BudgetRequest::rho(0.0005))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_releases_every_n_steps_until_the_budget_is_spent() {
    let env = Env::start();
    let every_two = ReleasePolicy {
        every_steps: 2,
        request: ReleaseRequest::default().mean(0.0005),
    };
    let setup = DatasetSetup {
        release_budget: Some(BudgetRequest::rho(0.0025)),
        labels: None,
        release_policy: Some(every_two.clone()),
    };
    env.admin
        .create_dataset_with("p", &dataset_config(), &setup)
        .await
        .unwrap();
    let curator = env.client_as("curator", Some("p"), None);
    let viewer = env.client_as("viewer", Some("p"), None);
    let view = viewer.release_policy("p").await.unwrap();
    assert_eq!(view.policy, Some(every_two));
    assert!(view.policy_error.is_none());

    // Replace it: every 4 steps.
    let every_four = ReleasePolicy {
        every_steps: 4,
        request: ReleaseRequest::default().mean(0.001),
    };
    let view = curator
        .set_release_policy("p", Some(&every_four))
        .await
        .unwrap();
    assert_eq!(view.policy.as_ref(), Some(&every_four));
    assert_eq!(viewer.release_policy("p").await.unwrap(), view);

    // Steps 0..12: releases after steps 4 and 8; the third (after 12) is over
    // budget, which the policy records while the step itself is accepted.
    // Each release is awaited before the next due step (a release that falls
    // due while the previous one computes is deferred to a later step).
    let trainer = env.client_as("trainer", Some("p"), None);
    for (from, count) in [(0, 1), (4, 2)] {
        run_steps(&trainer, "p", from, from + 4).await;
        let list = wait_for_list(&viewer, "p", |l| l.releases.len() == count).await;
        assert_eq!(list.releases.len(), count, "{list:?}");
    }
    run_steps(&trainer, "p", 8, 12).await;
    let list = wait_for_list(&viewer, "p", |l| l.policy_error.is_some()).await;
    let steps: Vec<u64> = list.releases.iter().map(|r| r.step).collect();
    assert_eq!(steps, vec![8, 4], "{list:?}");
    assert!(list
        .releases
        .iter()
        .all(|r| r.trigger == ReleaseTrigger::Policy && r.request == every_four.request));
    assert!(rel(list.budget.rho_spent, 0.002) < 1e-15);
    assert_eq!(list.policy.as_ref(), Some(&every_four));
    let error = list.policy_error.as_deref().unwrap_or_default();
    assert!(error.contains("budget"), "{list:?}");
    assert_eq!(
        viewer.release_policy("p").await.unwrap().policy_error,
        list.policy_error
    );
    assert_eq!(
        viewer.releases("p", Some(1)).await.unwrap().releases.len(),
        1
    );
    assert_eq!(env.admin.dataset("p").await.unwrap().status.steps, 12);

    // Removing the policy stops it.
    let view = curator.set_release_policy("p", None).await.unwrap();
    assert!(view.policy.is_none());
    assert!(viewer.release_policy("p").await.unwrap().policy.is_none());
    // A viewer may not change it.
    let err = viewer
        .set_release_policy("p", Some(&every_four))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
}

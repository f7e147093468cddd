"""DP releases through the Python client, against the real server:
budgets, the cost reaching every owner's epsilon and the worst case by exactly
``alpha * rho``, free reads for viewers, budget refusals with their numbers,
per-group releases, policies, and a release charged once when retried after a lost answer.
(The server's own tests: ``tests/api_releases.rs``.)"""

from __future__ import annotations

import random
import time
from typing import List

import pytest

from dpledger import (
    BadRequest,
    BudgetRequest,
    Client,
    Conflict,
    Forbidden,
    HistogramRequest,
    MeanRequest,
    NotFound,
    QuantilesRequest,
    Release,
    ReleasePolicy,
    ReleaseRequest,
)

from conftest import FAST_RETRY, poisson_config, rel
from test_retries import flaky

N = 200
ORDERS = [1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0]
LABELS = ["even" if i % 2 == 0 else "odd" for i in range(N)]


def summary(rho_each: float) -> ReleaseRequest:
    return ReleaseRequest(
        mean=MeanRequest(rho=rho_each),
        quantiles=QuantilesRequest(rho=rho_each, levels=[0.9, 0.1, 0.5]),
        histogram=HistogramRequest(rho=rho_each, bins=5),
    )


def run_steps(client: Client, ds: str, start: int, end: int) -> None:
    """Steps like the server's test: odd ids have small gradients (0.05), even
    ones are clipped (2.0 > C = 1), so odd examples leak far less."""
    rng = random.Random(start)
    for t in range(start, end):
        ids = [i for i in range(N) if rng.random() < 0.1]
        norms = [0.05 if i % 2 else 2.0 for i in ids]
        client.report_step(ds, t, ids, norms)


def wait_for_releases(client: Client, ds: str, count: int, timeout: float = 20.0):
    """The dataset's releases once there are `count` (policy releases are
    published shortly after the step that made them due answers)."""
    deadline = time.monotonic() + timeout
    while True:
        releases = client.list_releases(ds).releases
        if len(releases) >= count or time.monotonic() > deadline:
            return releases
        time.sleep(0.02)


def wait_for_policy_error(client: Client, ds: str, timeout: float = 20.0):
    """The dataset's release list once its policy has recorded a refusal (a
    deferred policy release records it when its task ends)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = client.list_releases(ds)
        if listed.policy_error is not None or time.monotonic() > deadline:
            return listed
        time.sleep(0.02)


def as_role(server, role: str, ds: str, examples: List[int] = None) -> Client:
    return Client(server.url, server.token(role, ds, examples), retry=FAST_RETRY)


def setup(admin: Client, ds: str, budget=None, steps: int = 0, **kw) -> None:
    admin.create_dataset(
        ds, poisson_config(N, q=0.1, orders=ORDERS), release_budget=budget, labels=LABELS, **kw
    )
    if steps:
        # A full-batch refresh first puts odd ids at their small threshold from step
        # 0: the groups' mean epsilons then differ by about the whole bound B, far
        # beyond a per-group mean's noise (without it the gap is ~0.8 at a noise sd
        # of ~0.4, and comparing the groups flakes).
        admin.refresh(ds, list(range(N)), [0.05 if i % 2 else 2.0 for i in range(N)])
    run_steps(admin, ds, 0, steps)


def test_release_cost_reaches_every_owner_and_the_worst_case(server, admin: Client, new_id):
    ds = new_id()
    setup(admin, ds, budget=0.01, steps=20)
    owner = as_role(server, "owner", ds, [7])
    curator = as_role(server, "curator", ds)
    viewer = as_role(server, "viewer", ds)
    assert viewer.get_budget(ds).rho_budget == 0.01
    assert viewer.latest_release(ds, missing_ok=True) is None
    with pytest.raises(NotFound):
        viewer.latest_release(ds)
    before = owner.example_privacy(ds, 7)

    out = curator.create_release(ds, summary(0.001))
    release = out.release
    assert (release.id, release.step, release.trigger) == (1, 20, "request")
    assert rel(release.rho, 0.003) < 1e-15 and rel(out.budget.rho_spent, 0.003) < 1e-15
    assert out.budget.releases == 1 and rel(out.budget.rho_left, 0.007) < 1e-12
    # The request as stored: the server sorts the levels.
    assert release.request.mean == MeanRequest(rho=0.001) and release.request.rho == release.rho
    assert release.request.quantiles.levels == [0.1, 0.5, 0.9]

    # Values in [0, B], B the worst-case epsilon before the release.
    bound = release.bound
    assert rel(bound, before.worst_case.epsilon) < 1e-12
    pop = release.population
    assert pop is not None and release.groups == {}
    assert 0.0 <= pop.mean.mean <= bound and pop.mean.count >= 0
    assert [q.level for q in pop.quantiles] == [0.1, 0.5, 0.9]
    values = [q.value for q in pop.quantiles]
    assert values == sorted(values) and all(0.0 <= v <= bound for v in values)
    assert pop.quantile(0.5) == values[1] and pop.quantile(0.25) is None
    assert len(pop.histogram.counts) == 5 and len(pop.histogram.edges) == 6
    assert pop.histogram.edges[0] == 0.0 and rel(pop.histogram.edges[-1], bound) < 1e-12

    # Every example's RDP and the worst case rise by alpha * rho at every order.
    after = owner.example_privacy(ds, 7)
    assert len(after.example.rdp) == len(ORDERS)
    for j, alpha in enumerate(ORDERS):
        charge = alpha * release.rho
        assert rel(after.example.rdp[j] - before.example.rdp[j], charge) < 1e-9, alpha
        assert rel(after.worst_case.rdp.rdp[j] - before.worst_case.rdp.rdp[j], charge) < 1e-9, alpha
    assert after.example.epsilon > before.example.epsilon
    assert after.worst_case.epsilon > before.worst_case.epsilon
    public = admin.worst_case(ds)
    for j, alpha in enumerate(ORDERS):
        assert rel(public.rdp.rdp[j] - before.worst_case.rdp.rdp[j], alpha * release.rho) < 1e-9

    # Viewers poll the latest release at no new cost.
    for _ in range(3):
        latest = viewer.latest_release(ds)
        assert isinstance(latest, Release) and latest == release
    assert viewer.latest_release(ds, missing_ok=True) == release
    assert owner.example_privacy(ds, 7).example == after.example
    assert viewer.get_budget(ds) == out.budget
    listed = viewer.list_releases(ds)
    assert listed.releases == [release] and listed.budget == out.budget and listed.policy is None

    # Over budget: 409 with the spend and the request, and nothing changes.
    with pytest.raises(Conflict) as refused:
        curator.create_release(ds, summary(0.003))
    budget = refused.value.budget
    assert budget is not None and refused.value.attempts == 1
    assert rel(budget.rho_spent, 0.003) < 1e-15
    assert rel(budget.rho_requested, 0.009) < 1e-15
    assert budget.rho_budget == 0.01
    assert owner.example_privacy(ds, 7).example == after.example
    assert viewer.get_budget(ds) == out.budget

    # Roles: viewers and owners read, only curators (and admins) release.
    for reader in (viewer, owner):
        with pytest.raises(Forbidden):
            reader.create_release(ds, mean=0.0001)
    with pytest.raises(Forbidden):
        viewer.set_budget(ds, 1.0)


def test_per_group_release_and_labels(server, admin: Client, new_id):
    ds = new_id()
    setup(admin, ds, budget=BudgetRequest(rho=0.1), steps=20)
    curator = as_role(server, "curator", ds)
    out = curator.create_release(ds, mean=0.004, by_group=True)
    release = out.release
    assert release.population is None and release.request.by_group
    assert [g.label for g in release.values.groups] == ["even", "odd", None]
    groups = release.groups
    # Odd examples (norm 0.05) leak far less than even ones (norm 2.0 > C).
    assert groups["odd"].mean.mean < groups["even"].mean.mean
    assert rel(release.rho, 0.004) < 1e-15  # the groups are disjoint: no extra cost
    # Labels: unknown ids are refused and change nothing; null unlabels.
    with pytest.raises(BadRequest) as e:
        curator.set_labels(ds, [N], ["x"])
    assert e.value.field == "ids"
    assert curator.set_labels(ds, [0, 1], ["new", None]).groups == ["even", "odd", "new"]
    # Idempotent: again, and as a mapping.
    assert curator.set_labels(ds, {0: "new", 1: None}).groups == ["even", "odd", "new"]
    release = curator.create_release(ds, ReleaseRequest(mean=MeanRequest(rho=0.001), by_group=True)).release
    assert [g.label for g in release.values.groups] == ["even", "odd", "new", None]


def test_by_group_needs_labels_and_budgets_refuse(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(N, q=0.1))
    curator = as_role(server, "curator", ds)
    # No budget yet: a conflict whose budget extension has no budget.
    run_steps(admin, ds, 0, 3)
    with pytest.raises(Conflict) as e:
        curator.create_release(ds, mean=0.1)
    assert "release-budget" in e.value.detail
    assert e.value.budget is not None and e.value.budget.rho_budget is None
    # Budget by epsilon and delta (converted by the server), or rho, not both.
    status = curator.set_budget(ds, epsilon=1.0, delta=1e-6)
    assert 0.02 < status.rho_budget < 0.05 and status.rho_spent == 0.0
    with pytest.raises(BadRequest) as e:
        curator.set_budget(ds, 0.1, epsilon=1.0)
    assert e.value.field == "budget"
    assert curator.set_budget(ds, 0.02).rho_budget == 0.02
    assert curator.set_budget(ds, 0.02).rho_budget == 0.02  # absolute: repeating is harmless
    # Without labels there are no groups to release.
    with pytest.raises(Conflict) as e:
        curator.create_release(ds, mean=0.001, by_group=True)
    assert e.value.budget is None
    # Invalid requests name the field.
    with pytest.raises(BadRequest) as e:
        curator.create_release(ds, ReleaseRequest())
    assert e.value.field == "release"
    with pytest.raises(BadRequest) as e:
        curator.create_release(ds, quantiles=QuantilesRequest(rho=0.001, levels=[0.5, 1.5]))
    assert e.value.field == "quantiles.levels"
    with pytest.raises(TypeError):
        curator.create_release(ds, ReleaseRequest(mean=MeanRequest(0.001)), mean=0.001)
    assert curator.get_budget(ds).releases == 0
    curator.create_release(ds, mean=0.015)
    # A budget never goes below what is spent.
    with pytest.raises(Conflict):
        curator.set_budget(ds, 0.01)
    with pytest.raises(NotFound):
        admin.latest_release("no-such-dataset", missing_ok=True)


def test_create_release_is_retried_with_its_key_and_charged_once(server, admin: Client, new_id):
    ds = new_id()
    setup(admin, ds, budget=0.01, steps=5)
    # The answer is lost twice (the release was made and charged): the retries
    # carry the same Idempotency-Key and are answered with that release.
    client, transport = flaky(server, ["lose", "lose"])
    first = client.create_release(ds, mean=0.001)
    assert len(transport.seen) == 3 and len(set(transport.keys)) == 1
    assert first.release.id == 1
    listed = admin.list_releases(ds)
    assert len(listed.releases) == 1 and rel(listed.budget.rho_spent, 0.001) < 1e-15
    assert listed.releases[0] == first.release
    # A 503 and a refused connection are retried the same way: one more release.
    client, transport = flaky(server, ["503", "refuse"])
    out = client.create_release(ds, mean=0.001)
    assert len(transport.seen) == 3 and out.release.id == 2
    assert out.budget.releases == 2 and rel(out.budget.rho_spent, 0.002) < 1e-15
    # Reads and settings are retried after lost answers.
    client, transport = flaky(server, ["lose", "503"])
    assert client.latest_release(ds) == out.release
    assert len(transport.seen) == 3
    client, transport = flaky(server, ["lose"])
    assert client.set_budget(ds, 0.02).rho_budget == 0.02
    assert len(transport.seen) == 2
    client, transport = flaky(server, ["lose"])
    assert client.set_labels(ds, [3], ["three"]).groups == ["even", "odd", "three"]
    assert len(transport.seen) == 2
    assert [r.id for r in admin.list_releases(ds, limit=1).releases] == [2]


def test_a_policy_releases_every_n_steps_until_the_budget_is_spent(server, admin: Client, new_id):
    ds = new_id()
    setup(admin, ds, budget=0.0025)
    curator = as_role(server, "curator", ds)
    viewer = as_role(server, "viewer", ds)
    assert viewer.get_policy(ds).policy is None
    policy = ReleasePolicy(every_steps=4, request=ReleaseRequest(mean=MeanRequest(rho=0.001)))
    view = curator.set_policy(ds, policy)
    assert view.policy == policy and view.policy_error is None
    assert curator.set_policy(ds, policy).policy == policy  # absolute: repeating is harmless
    assert viewer.get_policy(ds).policy == policy
    # Releases after steps 4 and 8; the third (after 12) is over budget, but the
    # step itself is accepted. Each release is awaited before the next due step
    # (one that falls due while the previous one computes is deferred).
    for start, count in [(0, 1), (4, 2)]:
        run_steps(admin, ds, start, start + 4)
        assert len(wait_for_releases(viewer, ds, count)) == count
    run_steps(admin, ds, 8, 12)
    listed = wait_for_policy_error(viewer, ds)
    assert [r.step for r in listed.releases] == [8, 4]
    assert all(r.trigger == "policy" for r in listed.releases)
    assert listed.policy == policy and "budget" in listed.policy_error
    assert rel(listed.budget.rho_spent, 0.002) < 1e-15
    assert "budget" in viewer.get_policy(ds).policy_error
    assert viewer.latest_release(ds) == listed.releases[0]
    # Removing the policy stops it.
    assert curator.set_policy(ds, None).policy is None
    assert viewer.get_policy(ds).policy is None
    run_steps(admin, ds, 12, 16)
    assert len(viewer.list_releases(ds).releases) == 2


def test_create_dataset_with_a_policy_and_lost_answer(server, admin: Client, new_id):
    ds = new_id()
    policy = ReleasePolicy(every_steps=2, request=ReleaseRequest(mean=MeanRequest(rho=0.001)))
    client, transport = flaky(server, ["lose"])
    view = client.create_dataset(
        ds, poisson_config(N), release_budget=0.01, labels=LABELS, release_policy=policy
    )
    assert view.id == ds
    assert [s.split()[0] for s in transport.seen] == ["POST", "POST"]
    assert admin.get_policy(ds).policy == policy
    assert admin.get_budget(ds).rho_budget == 0.01
    # The same config with another budget is still a conflict after a retry.
    client, _ = flaky(server, ["refuse"])
    with pytest.raises(Conflict, match="already exists"):
        client.create_dataset(ds, poisson_config(N), release_budget=0.02)
    run_steps(admin, ds, 0, 4)
    # The release due after step 4 is computed behind that step's answer.
    assert [r.step for r in wait_for_releases(admin, ds, 2)] == [4, 2]

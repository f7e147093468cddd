"""Every endpoint family against the real server, authorisation failures and
problem details."""

from __future__ import annotations

import math

import pytest

from dpledger import (
    BadRequest,
    Client,
    Conflict,
    DatasetConfig,
    Forbidden,
    IndividualBudget,
    NotFound,
    ScheduleRequest,
    ShuffleSampling,
    Unauthorized,
    UnsupportedMediaType,
)

from conftest import poisson_config, rel


def test_operations_endpoints(server, admin: Client):
    anonymous = admin.with_token(None)
    assert anonymous.healthz().status == "ok"
    assert anonymous.readyz().status == "ok"
    doc = anonymous.openapi_json()
    assert "/v1/datasets/{dataset}/steps" in doc["paths"]
    # /metrics names datasets and groups: it needs an admin (or metrics) token.
    with pytest.raises(Unauthorized):
        anonymous.metrics_endpoint()
    text = admin.metrics_endpoint()
    assert isinstance(text, str)


def test_dataset_lifecycle(server, admin: Client, new_id):
    ds = new_id()
    config = poisson_config(100, q=0.05, sigma=1.1, individual_budget=IndividualBudget(epsilon=3.0, delta=1e-5))
    view = admin.create_dataset(ds, config)
    assert view.id == ds and not view.archived
    assert view.config == config
    assert view.status.examples == 100 and view.status.steps == 0
    assert view.status.filter is not None and view.status.filter.epsilon == 3.0
    # No steps: zero RDP; the conversion's own slack keeps epsilon just above 0.
    assert view.worst_case.steps == 0 and set(view.worst_case.rdp.rdp) == {0.0}
    assert 0.0 <= view.worst_case.epsilon < 0.01
    assert ds in admin.list_datasets().datasets
    assert admin.get_dataset(ds) == view
    with pytest.raises(Conflict, match="already exists"):
        admin.create_dataset(ds, config)
    admin.report_step(ds, 0, [1, 2], [0.5, 3.0])
    assert admin.get_dataset(ds).status.steps == 1
    archived = admin.archive_dataset(ds)
    assert archived.archived
    assert admin.archive_dataset(ds).archived  # repeating is harmless
    with pytest.raises(Conflict, match="archived"):
        admin.report_step(ds, 1, [], [])
    # Still readable.
    assert admin.worst_case(ds).steps == 1


def test_shuffle_dataset_round_trips(server, admin: Client, new_id):
    ds = new_id()
    config = DatasetConfig(
        examples=10, max_grad_norm=2.0, noise_multiplier=2.0,
        sampling=ShuffleSampling(batch_size=5), delta=1e-6, clipping="global",
    )
    view = admin.create_dataset(ds, config)
    assert view.config.sampling == ShuffleSampling(batch_size=5)
    assert view.config.clipping == "global" and not view.status.guarantee
    admin.report_step(ds, 0, [0, 1, 2, 3, 4], [1.0] * 5)
    with pytest.raises(Conflict, match="already processed in epoch 0"):
        admin.report_step(ds, 1, [4, 5], [1.0, 1.0])
    p = admin.example_privacy(ds, 0)
    assert p.example.ledger == "sampled" and p.example.ex_post is None
    assert p.example.estimate.kind == "estimate" and p.example.guarantee.kind == "worst_case"


def test_steps_thresholds_refresh_privacy(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(20, q=0.1, sigma=1.0))
    out = admin.report_step(ds, 0, [7, 3, 11], [0.31, 2.5, 0.004])
    assert out.step == 0 and out.complete and not out.duplicate
    assert out.thresholds == [0.31, 1.0, 0.01]  # bucketed upwards, capped at C
    th = admin.thresholds(ds)
    assert th.next_step == 1 and th.start == 0 and len(th.thresholds) == 20
    assert th.thresholds[7] == 0.31 and th.thresholds[3] == 1.0 and th.thresholds[0] == 1.0
    part = admin.thresholds(ds, start=5, end=8)
    assert part.start == 5 and part.thresholds == th.thresholds[5:8]
    ref = admin.refresh(ds, [0, 1], [0.05, 0.0])
    assert ref.effective_step == 1 and ref.thresholds == [0.05, 0.0] and ref.retired == []
    assert admin.thresholds(ds, start=0, end=2).thresholds == [0.05, 0.0]
    admin.report_step(ds, 1, [], [])  # an empty batch is still a step
    p = admin.example_privacy(ds, 7, delta=1e-5)
    assert p.delta == 1e-5 and p.example.id == 7 and p.example.steps == 2
    # The sampled protocol: the ledger's number is an estimate, the guarantee the worst case.
    assert p.example.ledger == "sampled" and not p.example.retired
    assert p.example.guarantee.kind == "worst_case" and p.example.epsilon == p.worst_case.epsilon
    assert len(p.example.rdp) == len(p.worst_case.rdp.rdp) == admin.get_dataset(ds).status.orders
    assert 0 < p.example.rdp_epsilon < p.worst_case.epsilon
    # Example 1 was refreshed to 0 before step 1: it is charged only step 0.
    assert admin.example_privacy(ds, 1).example.rdp_epsilon < p.worst_case.rdp.epsilon
    classic = admin.example_privacy(ds, 7, conversion="classic").example.rdp_epsilon
    assert classic > p.example.rdp_epsilon  # the improved conversion is tighter
    wc = admin.worst_case(ds, delta=1e-3)
    assert wc.steps == 2 and wc.epsilon < p.worst_case.epsilon
    # The PLD estimate: typed, labelled not a guarantee, beside the unchanged guarantee.
    assert p.pld_estimate is None
    est = admin.example_privacy(ds, 7, delta=1e-5, method="pld_estimate")
    assert est.example == p.example
    assert est.pld_estimate is not None and est.pld_estimate.guarantee is False
    assert [(lv.threshold, lv.steps) for lv in est.pld_estimate.levels] == [(0.31, 2)]
    assert 0 < est.pld_estimate.epsilon and est.pld_estimate.steps == 2
    with pytest.raises(BadRequest, match="method"):
        admin.example_privacy(ds, 7, method="pld")


def test_accountant_endpoints(server, admin: Client):
    rdp = admin.accountant_rdp(0.01, 1.1, orders=[2, 32, 1000])
    assert rdp.orders == [2.0, 32.0, 1000.0] and 0 < rdp.rdp[0] < rdp.rdp[1] < rdp.rdp[2]
    e = admin.accountant_epsilon(0.01, 1.1, 10_000, 1e-5, method="rdp")
    assert e.epsilon == pytest.approx(5.632, abs=1e-3) and e.delta == 1e-5 and e.order > 1
    assert e.method == "rdp"
    tight = admin.accountant_epsilon(0.01, 1.1, 10_000, 1e-5)  # the default: PLD
    assert tight.method == "pld" and tight.epsilon < e.epsilon
    classic = admin.accountant_epsilon(0.01, 1.1, 10_000, 1e-5, conversion="classic", method="rdp")
    assert classic.epsilon > e.epsilon
    sigma = admin.accountant_noise(e.epsilon, 1e-5, 0.01, 10_000, method="rdp").noise_multiplier
    assert sigma == pytest.approx(1.1, rel=1e-3) and sigma <= 1.1 * (1 + 1e-6)
    rows = admin.accountant_compare(0.01, 1.1, 1000, 1e-5).rows
    methods = {r.method: r for r in rows}
    assert "rdp" in methods and methods["rdp"].guarantee
    sched = admin.accountant_schedule(
        ScheduleRequest(kind="exponential", sigma0=2.0, decay=0.1, budget_epsilon=8.0, delta=1e-5,
                        sampling_rate=0.01, steps_per_epoch=100, max_epochs=50)
    )
    assert sched.kind == "exponential" and sched.batching == "poisson"
    assert len(sched.sigma_per_epoch) == len(sched.epochs) > 0
    assert sched.sigma_per_epoch[1] < sched.sigma_per_epoch[0]


def test_infinite_values_arrive_as_inf(server, admin: Client):
    # q = 1: RDP = alpha / (2 sigma^2), rounded up by 1e-12 relative.
    e = admin.accountant_rdp(1.0, 1.0, orders=[2.0])
    assert 1.0 <= e.rdp[0] <= 1.0 + 1e-11
    # sigma so small that the RDP overflows: the server sends null, we read inf.
    huge = admin.accountant_rdp(1.0, 1e-200, orders=[2.0])
    assert huge.rdp == [math.inf]
    eps = admin.accountant_epsilon(1.0, 1e-200, 1, 1e-5, orders=[2.0], method="rdp")
    assert eps.epsilon is None  # EpsilonResponse: None means infinite


def test_authorisation_failures(server, admin: Client, new_id):
    ds, other = new_id(), new_id()
    admin.create_dataset(ds, poisson_config(10))
    admin.create_dataset(other, poisson_config(10))
    admin.report_step(ds, 0, [1], [0.5])

    anonymous = admin.with_token(None)
    with pytest.raises(Unauthorized) as e:
        anonymous.get_dataset(ds)
    assert e.value.status == 401 and e.value.type == "urn:dpledger:problem:unauthorized"
    assert "Authorization" in e.value.detail
    with pytest.raises(Unauthorized):
        admin.with_token("not-a-jwt").list_datasets()

    trainer = admin.with_token(server.token("trainer", ds))
    assert trainer.report_step(ds, 1, [2], [0.1]).complete
    assert trainer.thresholds(ds).next_step == 2
    assert trainer.list_datasets().datasets == [ds]
    with pytest.raises(Forbidden) as e:
        trainer.report_step(other, 0, [1], [0.5])
    assert e.value.type == "urn:dpledger:problem:forbidden"
    assert "training access" in e.value.detail
    with pytest.raises(Forbidden):
        trainer.example_privacy(ds, 1)
    with pytest.raises(Forbidden):
        trainer.create_dataset(new_id(), poisson_config(5))
    with pytest.raises(Forbidden):
        trainer.archive_dataset(ds)
    # A token for another dataset learns nothing, not even existence.
    with pytest.raises(Forbidden):
        trainer.get_dataset("no-such-dataset")

    owner = admin.with_token(server.token("owner", ds, [1]))
    assert owner.example_privacy(ds, 1).example.id == 1
    with pytest.raises(Forbidden, match="access to this example"):
        owner.example_privacy(ds, 2)
    assert owner.worst_case(ds).steps == 2
    with pytest.raises(Forbidden):
        owner.thresholds(ds)

    viewer = admin.with_token(server.token("viewer", ds))
    assert viewer.worst_case(ds).steps == 2
    with pytest.raises(Forbidden):
        viewer.example_privacy(ds, 1)
    # Any valid token may use the accountant.
    assert viewer.accountant_epsilon(0.1, 1.0, 10, 1e-5).epsilon > 0

    curator = admin.with_token(server.token("curator", ds))
    assert curator.example_privacy(ds, 2).example.steps == 2
    assert curator.archive_dataset(ds).archived


def test_problem_details(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    with pytest.raises(BadRequest) as e:
        admin.report_step(ds, 0, [1], [-1.0], binary=False)
    p = e.value.problem
    assert p is not None and p.status == 400 and p.type == "urn:dpledger:problem:bad-request"
    assert p.field == "norms" and "norms[0] = -1" in p.detail
    assert "field norms" in str(e.value)
    with pytest.raises(BadRequest) as e:
        admin.report_step(ds, 0, [10], [0.5])
    assert e.value.field == "ids" and "out of range" in e.value.detail
    with pytest.raises(BadRequest, match="appears twice"):
        admin.report_step(ds, 0, [3, 3], [0.5, 0.5])
    with pytest.raises(Conflict) as e:
        admin.report_step(ds, 5, [1], [0.5])
    assert e.value.status == 409 and "expects step 0" in e.value.detail
    with pytest.raises(NotFound) as e:
        admin.get_dataset("missing-dataset")
    assert e.value.type == "urn:dpledger:problem:not-found"
    with pytest.raises(BadRequest) as e:
        admin.create_dataset(new_id(), poisson_config(10, q=1.5))
    assert e.value.field == "sampling.rate"
    with pytest.raises(BadRequest) as e:
        admin.create_dataset("bad id!", poisson_config(10))
    assert e.value.field == "id"
    with pytest.raises(BadRequest) as e:
        admin.example_privacy(ds, 1, delta=2.0)
    assert e.value.field == "delta"
    with pytest.raises(BadRequest):
        admin.thresholds(ds, start=5, end=2)
    # A body that is neither JSON nor the binary encoding.
    r = admin._http.post(
        f"/v1/datasets/{ds}/refresh",
        content=b"ids=1",
        headers={"Authorization": f"Bearer {admin.token}", "Content-Type": "text/plain"},
    )
    assert r.status_code == 415
    assert isinstance(Client._error(r, "refresh"), UnsupportedMediaType)
    # Nothing above changed the ledger.
    assert admin.thresholds(ds).next_step == 0


def test_worst_case_matches_the_stateless_accountant(server, admin: Client, new_id):
    ds, orders = new_id(), [1.5, 2.0, 3.0, 8.0, 32.0, 128.0]
    admin.create_dataset(ds, poisson_config(30, q=0.1, sigma=1.3, orders=orders))
    for t in range(25):
        admin.report_step(ds, t, [t], [0.2])
    want = admin.accountant_epsilon(0.1, 1.3, 25, 1e-5, orders=orders, method="rdp")
    got = admin.worst_case(ds)
    assert rel(got.rdp.epsilon, want.epsilon) <= 1e-12 and got.rdp.order == want.order and got.epsilon <= got.rdp.epsilon


def test_storage_report(server, admin: Client, new_id):
    """GET /v1/admin/storage as typed data: the new dataset's records, memory
    and examples; a curator of that very dataset may not read it (admin only)."""
    ds = new_id()
    admin.create_dataset(ds, poisson_config(50))
    admin.report_step(ds, 0, [1, 2], [0.5, 0.2])
    report = admin.storage()
    entry = next(d for d in report.datasets if d.id == ds)
    assert (entry.examples, entry.steps, entry.paged_out, entry.archived) == (50, 1, False, False)
    assert entry.log_records == 2 and entry.log_bytes > 0
    assert entry.memory_bytes > 0 and report.memory_bytes >= entry.memory_bytes
    assert report.log_records >= entry.log_records
    assert report.table_cache.bytes <= report.table_cache.bound_bytes
    with pytest.raises(Forbidden):
        admin.with_token(server.token("curator", ds)).storage()

"""Thudi et al.'s data-dependent analysis through the client, against the real
server: three runs with a refresh every two steps; the whole analysis for an
admin, one example for its owner, and the refusals the caller sees."""

from __future__ import annotations

import random

import pytest

from dpledger import Client
from dpledger.errors import BadRequest, Conflict, Forbidden

from conftest import poisson_config, rel

N = 10
STEPS = 6


def _train(admin: Client, dataset: str, seed: int, steps: int = STEPS) -> None:
    rng = random.Random(seed)
    admin.create_dataset(dataset, poisson_config(N, q=0.3))
    for t in range(steps):
        if t % 2 == 0:
            admin.refresh(dataset, list(range(N)), [(0.1 + 0.15 * i) * (0.5 + rng.random()) for i in range(N)])
        ids = [i for i in range(N) if rng.random() < 0.3]
        admin.report_step(dataset, t, ids, [rng.random() for _ in ids])


def test_analysis_for_curators_and_owners(server, admin: Client, new_id):
    runs = [new_id("dd") for _ in range(3)]
    for k, r in enumerate(runs):
        _train(admin, r, 40 + k)
    full = admin.data_dependent_analysis(runs, delta=1e-5)
    assert full.guarantee is False
    assert (full.runs, full.steps, len(full.examples)) == (3, STEPS, N)
    assert full.datasets == runs
    assert [(i.start_step, i.end_step) for i in full.intervals] == [(0, 2), (2, 4), (4, 6)]
    assert full.summary is not None and full.summary.epsilon.min <= full.summary.epsilon.max
    for x in full.examples:
        assert x.guarantee is False
        assert x.per_instance_epsilon is not None and len(x.per_instance_epsilon) == 3
        assert len(x.relative_contributions) == 3
    exact = admin.data_dependent_analysis(runs, delta=1e-5, order_ratio=1.0)
    assert exact.order_ratio == 1.0
    for e, f in zip(exact.examples, full.examples):
        assert e.epsilon <= f.epsilon * (1 + 1e-12)
    # A curator of every run reads it; of two of the three, nothing.
    with admin.with_token(server.token_for("curator", runs)) as c:
        assert c.data_dependent_analysis(runs, delta=1e-5).examples[2].epsilon == full.examples[2].epsilon
    with admin.with_token(server.token_for("curator", runs[:2])) as c, pytest.raises(Forbidden):
        c.data_dependent_analysis(runs, delta=1e-5)
    # The owner of example 4 in every run reads only it.
    with admin.with_token(server.token_for("owner", runs, [4])) as owner:
        mine = owner.data_dependent_example(4, runs, delta=1e-5)
        assert mine.example.id == 4 and mine.guarantee is False
        assert rel(mine.example.epsilon, full.examples[4].epsilon) < 1e-9
        assert mine.boundaries == [0, 2, 4, 6]
        with pytest.raises(Forbidden):
            owner.data_dependent_example(5, runs, delta=1e-5)
        with pytest.raises(Forbidden):
            owner.data_dependent_analysis(runs, delta=1e-5)
    with admin.with_token(server.token("viewer", runs[0])) as viewer, pytest.raises(Forbidden):
        viewer.data_dependent_analysis(runs, delta=1e-5)


def test_analysis_refusals(server, admin: Client, new_id):
    a, b, short = new_id("dd"), new_id("dd"), new_id("dd")
    _train(admin, a, 1)
    _train(admin, b, 2)
    _train(admin, short, 3, steps=STEPS - 2)
    with pytest.raises(BadRequest) as e:
        admin.data_dependent_analysis([a], delta=1e-5)
    assert e.value.field == "runs"
    with pytest.raises(BadRequest):
        admin.data_dependent_analysis([a, b], alpha=[0.5], delta=1e-5)
    with pytest.raises(Conflict) as e:
        admin.data_dependent_analysis([a, short], delta=1e-5)
    assert "steps" in e.value.detail

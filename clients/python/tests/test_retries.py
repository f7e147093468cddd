"""Retries and idempotency against the real server, with a transport that loses
answers, refuses connections or injects 503s in front of it."""

from __future__ import annotations

from typing import List, Optional

import httpx
import pytest

from dpledger import BadRequest, Client, Conflict, RetryPolicy, ServerError, TransportFailure

from conftest import poisson_config


class FlakyTransport(httpx.BaseTransport):
    """Forwards to the server, following a plan of one action per request:
    ``pass``; ``lose`` (forward, then drop the answer: the server applied it);
    ``refuse`` (connection refused: never sent); ``503`` (answer 503 without
    forwarding). After the plan runs out every request passes."""

    def __init__(self, plan: List[str]):
        self.plan = list(plan)
        self.inner = httpx.HTTPTransport()
        self.seen: List[str] = []  # "METHOD path action"
        self.keys: List[Optional[str]] = []  # the Idempotency-Key of each request

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/cluster":
            # The client's one-off read of the cluster map is not part of the plan.
            response = self.inner.handle_request(request)
            response.read()
            return response
        action = self.plan.pop(0) if self.plan else "pass"
        self.seen.append(f"{request.method} {request.url.path} {action}")
        self.keys.append(request.headers.get("idempotency-key"))
        if action == "refuse":
            raise httpx.ConnectError("connection refused (injected)", request=request)
        if action == "503":
            return httpx.Response(
                503,
                headers={"content-type": "application/problem+json"},
                json={"type": "urn:dpledger:problem:internal", "title": "Service Unavailable",
                      "status": 503, "detail": "injected"},
                request=request,
            )
        response = self.inner.handle_request(request)
        response.read()
        if action == "lose":
            raise httpx.ReadError("connection reset before the answer (injected)", request=request)
        return response


def flaky(server, plan, *, attempts=6, sleeps=None) -> "tuple[Client, FlakyTransport]":
    transport = FlakyTransport(plan)
    client = Client(
        server.url,
        server.admin_token,
        retry=RetryPolicy(attempts=attempts, backoff=0.01, max_backoff=0.02),
        transport=transport,
        sleep=(sleeps.append if sleeps is not None else (lambda s: None)),
    )
    return client, transport


@pytest.mark.parametrize("binary", [True, False])
def test_lost_step_answer_is_retried_and_answered_as_duplicate(server, admin: Client, new_id, binary):
    ds, control = new_id(), new_id("control")
    for d in (ds, control):
        admin.create_dataset(d, poisson_config(10, q=0.2))
    client, transport = flaky(server, ["lose", "lose"])
    out = client.report_step(ds, 0, [1, 4], [0.3, 7.0], binary=binary)
    assert out.duplicate and out.complete and out.thresholds == [0.3, 1.0]
    assert [s.split()[-1] for s in transport.seen] == ["lose", "lose", "pass"]
    # Applied exactly once: same ledger as a dataset that got the report once.
    once = admin.report_step(control, 0, [1, 4], [0.3, 7.0])
    assert not once.duplicate and once.thresholds == out.thresholds
    assert admin.get_dataset(ds).status.steps == 1
    for i in (0, 1, 4):
        assert admin.example_privacy(ds, i).example == admin.example_privacy(control, i).example
    assert client.report_step(ds, 1, [], []).step == 1


def test_refused_connections_and_503s_are_retried(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    sleeps: List[float] = []
    client, transport = flaky(server, ["refuse", "503", "refuse"], sleeps=sleeps)
    out = client.report_step(ds, 0, [2], [0.5])
    assert not out.duplicate and out.thresholds == [0.5]
    assert len(transport.seen) == 4 and len(sleeps) == 3
    # Reads retry the same way.
    client2, transport2 = flaky(server, ["503", "refuse"])
    assert client2.thresholds(ds).next_step == 1
    assert len(transport2.seen) == 3


def test_failure_after_every_attempt_raises(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    sleeps: List[float] = []
    client, transport = flaky(server, ["refuse"] * 4, attempts=4, sleeps=sleeps)
    with pytest.raises(TransportFailure) as e:
        client.report_step(ds, 0, [2], [0.5])
    assert e.value.attempts == 4 and isinstance(e.value.__cause__, httpx.ConnectError)
    assert len(transport.seen) == 4 and len(sleeps) == 3
    assert admin.thresholds(ds).next_step == 0  # never sent, never applied
    client, _ = flaky(server, ["503"] * 3, attempts=3)
    with pytest.raises(ServerError) as e:
        client.report_step(ds, 0, [2], [0.5])
    assert e.value.status == 503 and e.value.detail == "injected" and e.value.attempts == 3
    # Lost answers every time: applied, but the caller is told it is unconfirmed.
    client, _ = flaky(server, ["lose"] * 3, attempts=3)
    with pytest.raises(TransportFailure):
        client.report_step(ds, 0, [2], [0.5])
    assert admin.thresholds(ds).next_step == 1
    # ... and a later retry of the same report confirms it.
    assert admin.report_step(ds, 0, [2], [0.5]).duplicate


def test_refusals_are_not_retried(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    client, transport = flaky(server, [])
    with pytest.raises(BadRequest):
        client.report_step(ds, 0, [2], [-0.5])
    assert len(transport.seen) == 1
    client.report_step(ds, 0, [2], [0.5])
    # A different report for an applied step is a conflict, never a success.
    with pytest.raises(Conflict, match="different content"):
        client.report_step(ds, 0, [2], [0.6])
    with pytest.raises(Conflict, match="different content"):
        client.report_step(ds, 0, [3], [0.5])


def test_backoff_grows_exponentially_and_is_capped():
    policy = RetryPolicy(attempts=10, backoff=0.1, max_backoff=1.0)
    for retry, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        for _ in range(20):
            assert base * 0.5 <= policy.delay(retry) <= base


def test_create_with_lost_answer_is_answered_from_its_key(server, admin: Client, new_id):
    ds = new_id()
    client, transport = flaky(server, ["lose"])
    view = client.create_dataset(ds, poisson_config(10, q=0.3))
    assert view.id == ds and view.config == poisson_config(10, q=0.3)
    assert [s.split()[:2] for s in transport.seen] == [
        ["POST", "/v1/datasets"], ["POST", "/v1/datasets"]]
    # Both attempts carried the same key.
    assert transport.keys[0] is not None and transport.keys[0] == transport.keys[1]
    # Another creation under that id (another call, another key) is a conflict.
    client, _ = flaky(server, ["refuse"])
    with pytest.raises(Conflict, match="already exists"):
        client.create_dataset(ds, poisson_config(10, q=0.4))
    with pytest.raises(Conflict):
        admin.create_dataset(ds, poisson_config(10, q=0.3))


def test_refresh_is_retried_with_its_key(server, admin: Client, new_id):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    client, transport = flaky(server, ["refuse", "refuse"])
    assert client.refresh(ds, [1], [0.2]).thresholds == [0.2]
    assert len(transport.seen) == 3
    client, transport = flaky(server, ["lose"])
    assert client.refresh(ds, [1], [0.3]).thresholds == [0.3]
    assert len(transport.seen) == 2 and transport.keys[0] == transport.keys[1]
    client, transport = flaky(server, ["503"])
    assert client.refresh(ds, [1], [0.4]).thresholds == [0.4]
    assert len(transport.seen) == 2
    # Every call has its own key; steps and reads carry none.
    keys = [k for k in transport.keys]
    client2, transport2 = flaky(server, [])
    client2.refresh(ds, [1], [0.5])
    client2.thresholds(ds)
    client2.report_step(ds, 0, [1], [0.5])
    assert transport2.keys[0] not in keys and transport2.keys[0] is not None
    assert transport2.keys[1:] == [None, None]

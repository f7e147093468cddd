"""Cluster routing of the client (dpledger.cluster) against scripted nodes: an
httpx MockTransport plays two nodes, so every branch is exercised without a
cluster. The real cluster is exercised by the server's tests/cluster_*.rs."""

from __future__ import annotations

from typing import Callable, Dict, List

import httpx
import pytest

from dpledger import Client, RetryPolicy, ServerError
from dpledger.cluster import NOT_OWNER, Routes, dataset_of, retry_after_seconds

A = "http://node-a:8001"
B = "http://node-b:8002"

STEP_ANSWER = {"step": 0, "duplicate": False, "complete": True, "thresholds": [], "retired": []}


def cluster_view(owner_url: str) -> Dict:
    return {
        "mode": "cluster",
        "node_id": "a",
        "lease_ttl_ms": 10000,
        "nodes": [
            {"node_id": "a", "advertise": A, "alive": True},
            {"node_id": "b", "advertise": B, "alive": True},
        ],
        "datasets": [{"dataset": "d", "owner": "b", "advertise": owner_url, "epoch": 2}],
    }


def not_owner(owner: Dict = None) -> httpx.Response:
    body = {"type": NOT_OWNER, "title": "Service Unavailable", "status": 503,
            "detail": "this node does not own dataset d"}
    if owner is not None:
        body["owner"] = owner
    return httpx.Response(503, headers={"Retry-After": "1",
                                        "content-type": "application/problem+json"}, json=body)


class Nodes(httpx.BaseTransport):
    """Routes each request to a handler by host; records "host METHOD path"."""

    def __init__(self, handlers: Dict[str, Callable[[httpx.Request], httpx.Response]]):
        self.handlers = handlers
        self.seen: List[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.seen.append(f"{host} {request.method} {request.url.path}")
        response = self.handlers[host](request)
        response.request = request
        return response


def client(transport: Nodes, sleeps: List[float]) -> Client:
    return Client(A, "token", transport=transport,
                  retry=RetryPolicy(attempts=4, backoff=0.01, max_backoff=2.0),
                  sleep=sleeps.append)


def test_requests_go_to_the_owner_named_by_the_cluster_map():
    def a(req):
        if req.url.path == "/v1/cluster":
            return httpx.Response(200, json=cluster_view(B))
        raise AssertionError(f"node a got {req.url.path}")

    def b(req):
        assert req.headers["authorization"] == "Bearer token"
        return httpx.Response(200, json=STEP_ANSWER)

    nodes = Nodes({A: a, B: b})
    c = client(nodes, [])
    c.report_step("d", 0, [1], [0.5], binary=False)
    c.report_step("d", 1, [1], [0.5], binary=False)
    assert nodes.seen == [
        f"{A} GET /v1/cluster",
        f"{B} POST /v1/datasets/d/steps",
        f"{B} POST /v1/datasets/d/steps",
    ]


def test_a_not_owner_answer_is_resent_to_the_named_owner_even_for_a_release():
    # A release is never resent once it may have arrived, but a not-owner answer
    # promises nothing was applied: it goes to the owner the problem names.
    def a(req):
        if req.url.path == "/v1/cluster":
            return httpx.Response(404, json={})
        return not_owner({"node_id": "b", "advertise": B})

    def b(req):
        return httpx.Response(201, json={"error": "unused"})

    nodes = Nodes({A: a, B: b})
    sleeps: List[float] = []
    c = client(nodes, sleeps)
    c._send("create_release", path_params={"dataset": "d"}, body=b"{}",
            content_type="application/json")
    assert nodes.seen == [
        f"{A} GET /v1/cluster",
        f"{A} POST /v1/datasets/d/releases",
        f"{B} POST /v1/datasets/d/releases",
    ]
    assert sleeps == []  # a named owner is tried at once


def test_a_not_owner_answer_without_owner_waits_retry_after_and_rereads_the_map():
    answers = iter([not_owner(), httpx.Response(200, json=STEP_ANSWER)])

    def a(req):
        if req.url.path == "/v1/cluster":
            return httpx.Response(200, json={"mode": "cluster", "node_id": "a",
                                             "nodes": [], "datasets": []})
        return next(answers)

    nodes = Nodes({A: a})
    sleeps: List[float] = []
    client(nodes, sleeps).report_step("d", 0, [1], [0.5], binary=False)
    assert sleeps == [1.0]
    assert [s for s in nodes.seen if s.endswith("/v1/cluster")] == [
        f"{A} GET /v1/cluster", f"{A} GET /v1/cluster"]


def test_an_owner_that_refuses_connections_sends_requests_back_to_the_base_url():
    views = iter([cluster_view(B), cluster_view(A)])

    def a(req):
        if req.url.path == "/v1/cluster":
            return httpx.Response(200, json=next(views))
        return httpx.Response(200, json=STEP_ANSWER)

    def b(req):
        raise httpx.ConnectError("refused", request=req)

    nodes = Nodes({A: a, B: b})
    client(nodes, []).report_step("d", 0, [1], [0.5], binary=False)
    assert nodes.seen == [
        f"{A} GET /v1/cluster",
        f"{B} POST /v1/datasets/d/steps",
        f"{A} GET /v1/cluster",
        f"{A} POST /v1/datasets/d/steps",
    ]


def test_not_owner_answers_still_end_after_the_attempts():
    def a(req):
        if req.url.path == "/v1/cluster":
            return httpx.Response(404, json={})
        return not_owner()

    nodes = Nodes({A: a})
    with pytest.raises(ServerError) as e:
        client(nodes, []).report_step("d", 0, [1], [0.5], binary=False)
    assert e.value.status == 503 and e.value.attempts == 4


def test_helpers():
    assert dataset_of("/v1/datasets/run%2D1/steps") == "run-1"
    assert dataset_of("/v1/datasets") is None
    assert dataset_of("/v1/accountant/rdp") is None
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("3600") == 30.0
    assert retry_after_seconds("soon") is None
    r = Routes()
    assert r.needs_load()
    r.install(cluster_view(B + "/"))
    assert r.owner("d") == B and not r.needs_load()
    r.forget("d")
    assert r.owner("d") is None and r.needs_load()

"""Client-side splitting of a sharded dataset's steps, against a real
cluster: three ``dpledger serve --cluster`` processes on loopback over the
PostgreSQL of the server's tests (``DPLEDGER_TEST_POSTGRES_URL``, default
``postgres://postgres@127.0.0.1:55432/test``; a fresh schema made with
``psql``). An unsharded dataset and a 4-shard one are fed the same seeded
trace through the client: every answer is the unsharded one, no node forwards
anything while the client reports (each part went straight to its owner), and
a part or a whole report whose answer was lost is applied once.

The split itself (ranges, own ids, empty parts, refusals before sending) is
also checked without a server."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

from dpledger import BadRequest, Client, DatasetView, RetryPolicy
from dpledger.shards import PARTIALLY_APPLIED, ShardLayout, combine, split
from dpledger.errors import Conflict, ServerError
from dpledger.types import IndividualBudget, Problem, RefreshDue, StepOutcome, to_json

from conftest import binary, poisson_config

PG = os.environ.get("DPLEDGER_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:55432/test")
TTL_MS = 4000


def layout() -> ShardLayout:
    return ShardLayout(names=("d~0", "d~3", "d~6"), starts=(0, 3, 6), ends=(3, 6, 10))


def test_a_batch_splits_by_range_into_own_ids_with_empty_parts():
    cut = split(layout(), [9, 0, 4, 7], [0.5, 1.0, 2.0, 3.0])
    assert cut.ids == [[0], [1], [3, 1]]
    assert cut.norms[2] == [0.5, 3.0]
    assert cut.positions == [[1], [2], [0, 3]]
    assert split(layout(), [1], [0.1]).ids == [[1], [], []]
    for ids, norms, field in [([1, 9], [0.5, -1.0], "norms"), ([1, 9], [float("nan"), 0.5], "norms"),
                              ([1, 10], [0.5, 0.5], "ids"), ([1, 1], [0.5, 0.5], "ids"),
                              ([1], [], "norms")]:
        with pytest.raises(BadRequest) as e:
            split(layout(), ids, norms)
        assert e.value.field == field


def test_answers_merge_and_a_refusal_after_an_applied_part_is_partially_applied():
    cut = split(layout(), [9, 0, 4, 7], [0.5, 1.0, 2.0, 3.0])
    answer = lambda th, retired, dup: StepOutcome(step=4, duplicate=dup, complete=True,
                                                  thresholds=th, retired=retired)
    merged = combine(layout(), cut, 4, None, [answer([1.0], [], True), answer([2.0], [1], False),
                                              answer([9.0, 7.0], [0, 3], True)])
    assert merged.thresholds == [9.0, 1.0, 2.0, 7.0]
    assert merged.retired == [4, 6, 9]
    assert not merged.duplicate and merged.complete
    assert merged.refresh_due is None
    # The full passes due on the shards merge into the dataset's.
    due = lambda count, received: RefreshDue(before_step=5, full=True, first_id=0, count=count,
                                             received=received)
    answers = [answer([1.0], [], False), answer([2.0], [], False), answer([9.0, 7.0], [], False)]
    for a, d in zip(answers, [due(3, 0), due(3, 3), due(4, 1)]):
        a.refresh_due = d
    merged = combine(layout(), cut, 4, None, answers)
    assert merged.refresh_due == due(10, 4)
    assert merged.refresh_due.ids(10) == list(range(10))

    # A round-robin block wrapping past the last id (ids 8, 9, 0, 1, 2, 3):
    # shard d~0 is due 0..3, d~3 its id 0, d~6 its ids 2, 3.
    blocks = [RefreshDue(before_step=5, full=False, first_id=f, count=c, received=r)
              for f, c, r in [(0, 3, 1), (0, 1, 0), (2, 2, 2)]]
    for a, d in zip(answers, blocks):
        a.refresh_due = d
    merged = combine(layout(), cut, 4, None, answers)
    assert merged.refresh_due == RefreshDue(before_step=5, full=False, first_id=8, count=6,
                                            received=3)
    assert merged.refresh_due.ids(10) == [8, 9, 0, 1, 2, 3]
    answers[1].refresh_due = None  # a shard none of whose ids are due
    answers[0].refresh_due = RefreshDue(before_step=5, full=False, first_id=1, count=2,
                                        received=0)
    answers[2].refresh_due = None
    merged = combine(layout(), cut, 4, None, answers)
    assert (merged.refresh_due.first_id, merged.refresh_due.count) == (1, 2)

    def refusal(status):
        cls = ServerError if status >= 500 else Conflict
        return cls(status, Problem(type="urn:dpledger:problem:conflict", title="x",
                                   status=status, detail="id 1 (ids[0]) is pending"),
                   "", "report_step")

    ok = answer([1.0], [], False)
    with pytest.raises(Conflict) as e:
        combine(layout(), cut, 4, None, [ok, refusal(409), ok])
    assert e.value.type == PARTIALLY_APPLIED
    # The shard's own id 1 at its position 0: the dataset's id 4 at position 2.
    assert "'d~3' (the dataset's ids 3 to 5)" in e.value.detail
    assert "id 4 (ids[2]) is pending" in e.value.detail
    with pytest.raises(ServerError):
        combine(layout(), cut, 4, None, [ok, refusal(409), refusal(503)])


# --- against a real cluster --------------------------------------------------


def psql(sql: str) -> None:
    out = subprocess.run(["psql", PG, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"psql failed ({PG}): {out.stderr}"


class Cluster:
    """Three nodes on one fresh PostgreSQL schema and one data directory."""

    def __init__(self, data_dir: Path, nodes: int = 3):
        self.schema = f"py_shards_{os.getpid()}_{time.time_ns() % 10**9}"
        psql(f"CREATE SCHEMA {self.schema}")
        sep = "&" if "?" in PG else "?"
        store = f"{PG}{sep}options=-csearch_path%3D{self.schema}"
        self.dir = data_dir
        self.procs: List[subprocess.Popen] = []
        self.urls: List[str] = []
        for i in range(1, nodes + 1):
            proc = subprocess.Popen(
                [str(binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
                 "--store", store, "--cluster", "--node-id", f"n{i}",
                 "--lease-ttl-ms", str(TTL_MS)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "DPLEDGER_LOG": "warn"})
            self.procs.append(proc)
            line = proc.stdout.readline().decode().strip()  # type: ignore[union-attr]
            prefix = "dpledger listening on "
            assert line.startswith(prefix), f"node n{i} did not start: {line!r}"
            self.urls.append(line[len(prefix):])
        self.admin = (data_dir / "admin.token").read_text().strip()

    def token(self, role: str, dataset: str) -> str:
        out = subprocess.run([str(binary()), "token", "--role", role, "--dataset", dataset,
                              "--data-dir", str(self.dir)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def wait_active(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            view = httpx.get(f"{self.urls[0]}/v1/cluster",
                             headers={"Authorization": f"Bearer {self.admin}"}).json()
            if sum(1 for n in view["nodes"] if n["alive"]) >= len(self.urls):
                break
            assert time.monotonic() < deadline, view
            time.sleep(0.05)
        time.sleep(TTL_MS / 1000)

    def forwarded(self) -> float:
        """``dpledger_cluster_forwarded_total`` of every node, summed."""
        total = 0.0
        for url in self.urls:
            text = httpx.get(f"{url}/metrics",
                             headers={"Authorization": f"Bearer {self.admin}"}).text
            for line in text.splitlines():
                if line.startswith("dpledger_cluster_forwarded_total"):
                    total += float(line.split()[-1])
        return total

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        psql(f"DROP SCHEMA {self.schema} CASCADE")


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def trace(seed: int, n: int, q: float, steps: int):
    rng = random.Random(seed)
    for t in range(steps):
        ids = [i for i in range(n) if rng.random() < q]
        rng.shuffle(ids)
        yield t, ids, [rng.uniform(0.0, 3.0) for _ in ids]


def test_the_python_client_splits_sharded_steps_and_sends_each_part_to_its_owner(cluster):
    cluster.wait_active()
    n, q, steps = 60, 0.3, 20
    # An individual budget small enough that the filter retires examples.
    config = poisson_config(n, q, individual_budget=IndividualBudget(epsilon=6.0, delta=1e-5))
    retry = RetryPolicy(attempts=20, backoff=0.05, max_backoff=0.5)
    with Client(cluster.urls[0], cluster.admin, retry=retry) as admin:
        admin.create_dataset("plain", config)
        # Created through another client, so the reporting client learns the
        # layout from the dataset view when it first reports.
        body = {"id": "sharded", "config": to_json(config), "shards": 4}
        r = httpx.post(f"{cluster.urls[1]}/v1/datasets", json=body,
                       headers={"Authorization": f"Bearer {cluster.admin}"})
        assert r.status_code == 201, r.text
    trainer = cluster.token("trainer", "sharded")
    plain = Client(cluster.urls[0], cluster.token("trainer", "plain"), retry=retry)
    sharded = Client(cluster.urls[2], trainer, retry=retry)
    # The view, read by another client: the reporting client learns the layout
    # at its first step from the cluster map (which lists the shards) and one
    # read of the view (which fans out to the shards: the only hops of its run).
    with Client(cluster.urls[1], trainer, retry=retry) as viewer:
        view: DatasetView = viewer.get_dataset("sharded")
    lay = ShardLayout.of(view)
    assert lay is not None and len(lay.names) == 4
    assert len({s.owner for s in view.shards}) == 3, view.shards
    hops = 0.0
    for t, ids, norms in trace(3, n, q, steps):
        a = plain.report_step("plain", t, ids, norms)
        if t == 4:
            # The answer to shard 2's part was lost: the shard applied it, the
            # client resends the whole step; that part is a duplicate there.
            cut = split(lay, ids, norms)
            r = httpx.post(f"{cluster.urls[0]}/v1/datasets/{lay.names[2]}/steps",
                           json={"step": t, "ids": cut.ids[2], "norms": cut.norms[2]},
                           headers={"Authorization": f"Bearer {trainer}"})
            assert r.status_code == 200, r.text
        before = cluster.forwarded()
        b = sharded.report_step("sharded", t, ids, norms, binary=(t % 2 == 0))
        if t > 0:
            hops += cluster.forwarded() - before
        assert a == b, f"step {t}"
        if t % 3 == 1:
            # The answer to the whole report was lost: sent again, every part
            # is a duplicate with its original answer.
            again = sharded.report_step("sharded", t, ids, norms)
            assert again.duplicate and again.thresholds == b.thresholds
    assert hops == 0.0, "a node forwarded a part the client sent"
    assert plain.thresholds("plain") == sharded.thresholds("sharded")
    va, vb = plain.get_dataset("plain"), sharded.get_dataset("sharded")
    assert vb.status.steps == steps and all(s.steps == steps for s in vb.shards)
    assert va.worst_case == vb.worst_case
    assert va.status.retired == vb.status.retired > 0
    plain.close()
    sharded.close()

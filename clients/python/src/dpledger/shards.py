"""Client-side splitting of a sharded dataset's steps (the server's
``docs/sharding.md``, "Client-side splitting").

In a cluster a dataset created with ``"shards": k`` is ``k`` contiguous id
ranges, each an ordinary dataset ``{d}~{start}`` with its own owner. Any node
accepts a whole step report for ``d`` and splits it, at the cost of a hop per
step; the client splits instead. It reads the layout once (immutable: the shard
map of ``GET /v1/datasets/{d}``), cuts each report by range with the server's
rule (the Rust ``dpledger_client::shard_rule``: shard ``s`` gets the report's
ids of its range as its own ids ``id - start``, in the report's order, with
their norms, the same step, hyperparameters and ``part``, and an empty batch
when none is its own), sends the parts in parallel, each to its shard's owner
by the cluster map, and merges the answers into the unsharded answer's shape.

Exactly once per part: each part is a step report of its shard, resent with the
same bytes on a retry, and the shard answers a retry of an applied part as a
duplicate with its original answer, whichever path (this client, or a node's
split of a whole report) delivered it first.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from .errors import ApiError, BadRequest, Conflict
from .types import DatasetView, Part, Problem, RefreshDue, StepOutcome

__all__ = ["PARTIALLY_APPLIED", "ShardLayout", "SplitReport", "split", "merge", "combine",
           "dataset_detail"]

#: The problem type of a step applied by some shards and refused by another.
PARTIALLY_APPLIED = "urn:dpledger:problem:partially-applied"


@dataclass(frozen=True)
class ShardLayout:
    """A sharded dataset's shards, in id order: names and ``[start, end)``."""

    names: Tuple[str, ...]
    starts: Tuple[int, ...]
    ends: Tuple[int, ...]

    @staticmethod
    def of(view: DatasetView) -> Optional["ShardLayout"]:
        """The layout of a dataset view; ``None`` for an unsharded dataset."""
        if not view.shards:
            return None
        return ShardLayout(
            names=tuple(s.dataset for s in view.shards),
            starts=tuple(s.start for s in view.shards),
            ends=tuple(s.end for s in view.shards),
        )

    def shard_of(self, example: int) -> Optional[int]:
        s = bisect.bisect_right(self.ends, example)
        if s < len(self.ends) and self.starts[s] <= example < self.ends[s]:
            return s
        return None


@dataclass
class SplitReport:
    """One ``(ids, norms)`` per shard (own ids), and where each id came from."""

    ids: List[List[int]]
    norms: List[List[float]]
    positions: List[List[int]]


def _bad(field: str, detail: str) -> BadRequest:
    problem = Problem(type="urn:dpledger:problem:bad-request", title="Bad Request",
                      status=400, detail=detail, field=field)
    return BadRequest(400, problem, detail, "report_step")


def split(layout: ShardLayout, ids: Sequence[int], norms: Sequence[float]) -> SplitReport:
    """Cut a batch by range. Refuses (:class:`BadRequest`, before anything is
    sent, so that no shard applies a step another refuses) ids and norms of
    different lengths, a norm that is not finite or is negative, an id twice
    and an id outside the dataset, with the server's messages."""
    if len(ids) != len(norms):
        raise _bad("norms", f"has {len(norms)} entries but ids has {len(ids)}")
    for j, g in enumerate(norms):
        if not (math.isfinite(g) and g >= 0.0):
            raise _bad("norms", f"norms[{j}] = {g}: every norm must be a finite number >= 0")
    seen = {}
    for j, i in enumerate(ids):
        first = seen.setdefault(i, j)
        if first != j:
            raise _bad("ids", f"id {i} appears twice in one report (ids[{first}] and ids[{j}])")
    k = len(layout.names)
    out = SplitReport([[] for _ in range(k)], [[] for _ in range(k)], [[] for _ in range(k)])
    for j, (i, g) in enumerate(zip(ids, norms)):
        s = layout.shard_of(i)
        if s is None:
            raise _bad("ids", f"example id {i} is out of range "
                              f"(the dataset has {layout.ends[-1]} examples)")
        out.ids[s].append(i - layout.starts[s])
        out.norms[s].append(g)
        out.positions[s].append(j)
    return out


def merge(layout: ShardLayout, split_report: SplitReport, step: int, part: Optional[Part],
          answers: Sequence[StepOutcome]) -> StepOutcome:
    """The dataset's answer from the shards' (in shard order): thresholds back
    at their positions, retirements as the dataset's ids, complete only when
    every shard completed the step, duplicate only when every part was one."""
    batch = sum(len(p) for p in split_report.positions)
    thresholds = [0.0] * batch
    retired: List[int] = []
    for s, answer in enumerate(answers):
        if answer.step != step or len(answer.thresholds) != len(split_report.positions[s]):
            raise ValueError(f"shard {layout.names[s]} answered step {answer.step} with "
                             f"{len(answer.thresholds)} thresholds to a part of step {step} "
                             f"with {len(split_report.positions[s])} ids")
        for j, t in zip(split_report.positions[s], answer.thresholds):
            thresholds[j] = t
        retired.extend(r + layout.starts[s] for r in answer.retired)
    return StepOutcome(
        step=step,
        duplicate=all(a.duplicate for a in answers),
        complete=all(a.complete for a in answers),
        thresholds=thresholds,
        retired=retired,
        part=part,
        refresh_due=merge_due(layout, answers),
    )


def merge_due(layout: ShardLayout, answers: Sequence[StepOutcome]) -> Optional[RefreshDue]:
    """The refresh due on the shards (each in its own ids), as the dataset's:
    a full pass over all of them, or the dataset's round-robin block (each
    shard is due its part of it, one cyclic range of its own ids), with what
    has arrived summed; the server's and the Rust client's merge
    (``RefreshDue::merge``)."""
    total = layout.ends[-1] if layout.ends else 0
    pieces: List[Tuple[int, int]] = []
    parts = [(s, a.refresh_due) for s, a in enumerate(answers) if a.refresh_due is not None]
    if not parts:
        return None
    # The dataset's next step is its shards' earliest: a shard that already
    # applied it (it had no id due) tells of a later refresh.
    first_step = min(d.before_step for _, d in parts)
    dues = []
    for s, due in parts:
        if due.before_step != first_step:
            continue
        dues.append(due)
        start, n = layout.starts[s], layout.ends[s] - layout.starts[s]
        first, count = due.first_id % max(n, 1), min(due.count, n)
        if first + count <= n:
            pieces.append((start + first, start + first + count))
        else:
            pieces.append((start + first, start + n))
            pieces.append((start, start + first + count - n))
    joined: List[List[int]] = []
    for a, b in sorted(p for p in pieces if p[0] < p[1]):
        if joined and a <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], b)
        else:
            joined.append([a, b])
    full = all(d.full for d in dues)
    if full or not joined:
        first_id = 0
    elif len(joined) >= 2 and joined[0][0] == 0 and joined[-1][1] == total:
        first_id = joined[-1][0]  # a block that wraps past the last id
    else:
        first_id = joined[0][0]
    return RefreshDue(
        before_step=first_step,
        full=full,
        first_id=first_id,
        count=sum(b - a for a, b in joined),
        received=sum(d.received for d in dues),
    )


_OWN_ID = re.compile(r"(?<!\w)(?:ids\[(\d+)\]|id (\d+))")


def dataset_detail(start: int, positions: Sequence[int], detail: str) -> str:
    """A shard's refusal with its own ids and positions put back as the
    dataset's and the report's (``id N`` -> ``id N + start``, ``ids[j]`` ->
    ``ids[positions[j]]``), as the server's and the Rust client's rule
    (``dpledger_api::shard_rule::dataset_detail``) do."""
    def put_back(m: "re.Match[str]") -> str:
        if m.group(1) is not None:
            j = int(m.group(1))
            return f"ids[{positions[j]}]" if j < len(positions) else m.group(0)
        return f"id {int(m.group(2)) + start}"
    return _OWN_ID.sub(put_back, detail)


def combine(layout: ShardLayout, split_report: SplitReport, step: int, part: Optional[Part],
            results: Sequence[Any]) -> StepOutcome:
    """The answer for the whole report from each part's result (a
    :class:`StepOutcome` or the exception it raised): the merged outcome; else
    the first failure a retry of the whole may cure (no answer, 5xx: the parts
    applied answer a retry as duplicates); else, when some part was applied and
    another refused, a ``409`` of type :data:`PARTIALLY_APPLIED` naming them;
    else the first refusal."""
    failures = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    if not failures:
        return merge(layout, split_report, step, part, results)
    retryable = [i for i in failures
                 if not isinstance(results[i], ApiError) or results[i].status >= 500]
    first = (retryable or failures)[0]
    error = results[first]
    applied = [layout.names[i] for i, r in enumerate(results) if not isinstance(r, BaseException)]
    if isinstance(error, ApiError) and error.status < 500 and applied:
        start, end = layout.starts[first], layout.ends[first]
        own = dataset_detail(start, split_report.positions[first], error.detail or "")
        detail = (f"the step was applied in part: shard {layout.names[first]!r} (the dataset's "
                  f"ids {start} to {end - 1}) refused its part ({error.status}: {own}; ids and "
                  f"positions as the dataset's and the report's) while {', '.join(applied)} "
                  f"applied theirs; a retry of the same report is answered as a duplicate by "
                  f"those")
        problem = Problem(type=PARTIALLY_APPLIED, title="Conflict", status=409, detail=detail,
                          field=error.field)
        conflict = Conflict(409, problem, detail, "report_step")
        conflict.attempts = error.attempts
        raise conflict from error
    raise error

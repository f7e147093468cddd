"""Typed HTTP client of the dpledger service (httpx).

Every endpoint of ``openapi/openapi.json`` is one method whose name is the
endpoint's ``operationId``, and one row of :data:`OPERATIONS` (method, path,
response type, retry class) from which the request is built.
``tests/test_openapi.py`` fails when the OpenAPI document has an operation that
the table lacks, or the table disagrees with it. To cover a new endpoint: add a
dataclass for its schemas to ``types.py``, a row to :data:`OPERATIONS`, and a
method calling ``self._call("<operationId>", ...)``.

**Retries.** Only what is safe to repeat is repeated: reads, the stateless
accountant, and step reports, which the server applies exactly once (a retry
of an applied step with the same content is answered ``"duplicate": true``
with the original answer, and is a success). Every other change (creating or
archiving a dataset, a refresh, a DP release, the release budget, policy and
labels) is sent with an ``Idempotency-Key`` header: one random key per call,
the same on each of its attempts. The server stores the key with the change
and answers a retry from the change already made, never applying it twice (a
release retried is charged once); the same key with another request is a 422.
So these are retried too, including after the server's
``urn:dpledger:problem:outcome-unknown`` answer (503: its store did not
confirm the commit; the change may or may not have been applied). Transport
errors and 500/502/503/504 are retried with exponential backoff and jitter;
when the attempts are used up the last error is raised, so a report is never
silently dropped.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from . import encoding
from . import shards
from .cluster import NOT_OWNER, Routes, dataset_of, retry_after_seconds
from .errors import ApiError, NotFound, TransportFailure, error_class
from .types import (
    BudgetRequest,
    BudgetStatus,
    ClusterView,
    CompareRequest,
    CompareResponse,
    CreateDataset,
    DataDependentAnalysis,
    DataDependentExampleView,
    DatasetConfig,
    DatasetList,
    DatasetView,
    DrainAnswer,
    MintedToken,
    MintTokenRequest,
    RevokedToken,
    StorageReport,
    EpsilonRequest,
    EpsilonResponse,
    Health,
    HistogramRequest,
    LabelAssignment,
    LabelsView,
    MeanRequest,
    NoiseRequest,
    NoiseResponse,
    Part,
    PolicyUpdate,
    PolicyView,
    PrivacyView,
    Problem,
    QuantilesRequest,
    RdpRequest,
    RdpResponse,
    RefreshOutcome,
    RefreshRequest,
    Release,
    ReleaseList,
    ReleaseOutcome,
    ReleasePolicy,
    ReleaseRequest,
    ScheduleRequest,
    ScheduleResponse,
    StepOutcome,
    Thresholds,
    WorstCaseBounds,
    from_json,
    to_json,
)

__all__ = ["Client", "RetryPolicy", "Operation", "OPERATIONS"]

# Retry classes of an operation.
IDEMPOTENT = "idempotent"  # repeat on any transport error or retryable status
KEYED = "keyed"  # repeat like IDEMPOTENT, with one Idempotency-Key on every attempt
CONNECT_ONLY = "connect-only"  # repeat only when the request was never sent


@dataclass(frozen=True)
class Operation:
    """One endpoint: HTTP method, path template, the dataclass of its success
    body (``None``: plain text or free JSON) and its retry class."""

    method: str
    path: str
    response: Optional[type]
    retry: str


OPERATIONS: Dict[str, Operation] = {
    # datasets
    "create_dataset": Operation("POST", "/v1/datasets", DatasetView, KEYED),
    "list_datasets": Operation("GET", "/v1/datasets", DatasetList, IDEMPOTENT),
    "get_dataset": Operation("GET", "/v1/datasets/{dataset}", DatasetView, IDEMPOTENT),
    "archive_dataset": Operation("POST", "/v1/datasets/{dataset}/archive", DatasetView, KEYED),
    # training
    "report_step": Operation("POST", "/v1/datasets/{dataset}/steps", StepOutcome, IDEMPOTENT),
    "thresholds": Operation("GET", "/v1/datasets/{dataset}/thresholds", Thresholds, IDEMPOTENT),
    "refresh": Operation("POST", "/v1/datasets/{dataset}/refresh", RefreshOutcome, KEYED),
    # privacy
    "example_privacy": Operation(
        "GET", "/v1/datasets/{dataset}/examples/{example}/privacy", PrivacyView, IDEMPOTENT
    ),
    "worst_case": Operation("GET", "/v1/datasets/{dataset}/worst-case", WorstCaseBounds, IDEMPOTENT),
    # releases (a release spends budget: its retries carry its key, charged once)
    "create_release": Operation(
        "POST", "/v1/datasets/{dataset}/releases", ReleaseOutcome, KEYED
    ),
    "list_releases": Operation("GET", "/v1/datasets/{dataset}/releases", ReleaseList, IDEMPOTENT),
    "latest_release": Operation(
        "GET", "/v1/datasets/{dataset}/releases/latest", Release, IDEMPOTENT
    ),
    "get_budget": Operation(
        "GET", "/v1/datasets/{dataset}/release-budget", BudgetStatus, IDEMPOTENT
    ),
    "set_budget": Operation(
        "PUT", "/v1/datasets/{dataset}/release-budget", BudgetStatus, KEYED
    ),
    "get_policy": Operation("GET", "/v1/datasets/{dataset}/release-policy", PolicyView, IDEMPOTENT),
    "set_policy": Operation("PUT", "/v1/datasets/{dataset}/release-policy", PolicyView, KEYED),
    "set_labels": Operation("PUT", "/v1/datasets/{dataset}/labels", LabelsView, KEYED),
    # the stateless accountant
    "data_dependent_analysis": Operation(
        "GET", "/v1/analyses/data-dependent", DataDependentAnalysis, IDEMPOTENT
    ),
    "data_dependent_example": Operation(
        "GET", "/v1/analyses/data-dependent/examples/{example}", DataDependentExampleView, IDEMPOTENT
    ),
    "accountant_rdp": Operation("POST", "/v1/accountant/rdp", RdpResponse, IDEMPOTENT),
    "accountant_epsilon": Operation("POST", "/v1/accountant/epsilon", EpsilonResponse, IDEMPOTENT),
    "accountant_noise": Operation("POST", "/v1/accountant/noise", NoiseResponse, IDEMPOTENT),
    "accountant_compare": Operation("POST", "/v1/accountant/compare", CompareResponse, IDEMPOTENT),
    "accountant_schedule": Operation(
        "POST", "/v1/accountant/schedule", ScheduleResponse, IDEMPOTENT
    ),
    # operations
    "healthz": Operation("GET", "/healthz", Health, IDEMPOTENT),
    "readyz": Operation("GET", "/readyz", Health, IDEMPOTENT),
    "metrics_endpoint": Operation("GET", "/metrics", None, IDEMPOTENT),
    "storage": Operation("GET", "/v1/admin/storage", StorageReport, IDEMPOTENT),
    # the cluster (draining twice is draining once)
    "cluster_view": Operation("GET", "/v1/cluster", ClusterView, IDEMPOTENT),
    "drain": Operation("POST", "/v1/cluster/nodes/{node}/drain", DrainAnswer, IDEMPOTENT),
    "openapi_json": Operation("GET", "/openapi.json", None, IDEMPOTENT),
    # tokens (a mint is repeated only if never sent: a retry could mint two)
    "mint_token": Operation("POST", "/v1/admin/tokens", MintedToken, CONNECT_ONLY),
    "revoke_token": Operation("POST", "/v1/admin/tokens/{jti}/revoke", RevokedToken, IDEMPOTENT),
}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to repeat a request that may be repeated.

    ``attempts`` counts the first try. The wait before retry ``k`` (1-based) is
    ``min(max_backoff, backoff * 2**(k-1))`` scaled by a random factor in
    ``[0.5, 1]``."""

    attempts: int = 10
    backoff: float = 0.1
    max_backoff: float = 5.0
    statuses: Tuple[int, ...] = (429, 500, 502, 503, 504)

    def delay(self, retry: int) -> float:
        base = min(self.max_backoff, self.backoff * (2 ** (retry - 1)))
        return base * random.uniform(0.5, 1.0)


NO_RETRY = RetryPolicy(attempts=1)

_JSON = "application/json"


def _plain_list(values: Any, kind: Callable[[Any], Any]) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [kind(v) for v in values]


class Client:
    """A dpledger client bound to one base URL and one bearer token.

    >>> c = Client("http://127.0.0.1:8080", token)
    >>> c.create_dataset("run-1", DatasetConfig(examples=60000, max_grad_norm=1.0,
    ...     noise_multiplier=1.1, sampling=PoissonSampling(rate=0.004), delta=1e-5))
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: Optional[httpx.BaseTransport] = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retry = retry
        self._sleep = sleep
        self._timeout = timeout
        self._transport = transport
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)
        #: Who owns which dataset in a cluster (see :mod:`dpledger.cluster`).
        self._routes = Routes()
        #: Which datasets are sharded, and how (see :mod:`dpledger.shards`):
        #: dataset id -> layout, ``None`` for unsharded; read once each.
        self._layouts: Dict[str, Optional[shards.ShardLayout]] = {}
        self._layouts_lock = threading.Lock()
        #: Threads sending a sharded step's parts in parallel (made on first use).
        self._pool: Optional[ThreadPoolExecutor] = None

    # --- plumbing -----------------------------------------------------------

    def with_token(self, token: Optional[str]) -> "Client":
        """A client for the same server with another token (shares nothing mutable)."""
        return Client(
            self.base_url,
            token,
            timeout=self._timeout,
            retry=self.retry,
            transport=self._transport,
            sleep=self._sleep,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _headers(self, content_type: Optional[str], key: Optional[str] = None) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if content_type is not None:
            headers["Content-Type"] = content_type
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    @staticmethod
    def _error(response: httpx.Response, operation: str) -> ApiError:
        problem = None
        try:
            body = response.json()
            if isinstance(body, dict) and {"type", "title", "status", "detail"} <= body.keys():
                problem = from_json(Problem, body)
        except ValueError:
            pass
        return error_class(response.status_code)(
            response.status_code, problem, response.text, operation
        )

    def _send(
        self,
        operation: str,
        *,
        path_params: Optional[Dict[str, Any]] = None,
        params: Optional[Dict[str, Any]] = None,
        body: Optional[bytes] = None,
        content_type: Optional[str] = None,
    ) -> httpx.Response:
        """Send with the operation's retry class; return the successful response
        or raise ApiError / TransportFailure."""
        op = OPERATIONS[operation]
        path = op.path
        for name, value in (path_params or {}).items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        query = {k: v for k, v in (params or {}).items() if v is not None}
        attempts = max(1, self.retry.attempts)
        dataset = dataset_of(path)
        # One key per call, the same on every attempt: the server applies the
        # change once and answers the retries from it.
        key = uuid.uuid4().hex if op.retry == KEYED else None
        attempt = 0
        while True:
            attempt += 1
            if dataset is not None and self._routes.needs_load():
                self._load_routes()
            owner = self._routes.owner(dataset) if dataset is not None else None
            target = owner + path if owner else path
            try:
                response = self._http.request(
                    op.method,
                    target,
                    params=query or None,
                    content=body,
                    headers=self._headers(content_type, key),
                )
            except httpx.TransportError as e:
                never_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                if owner and never_sent:
                    # The owner we knew is gone: base URL, and read the map again.
                    self._routes.forget(dataset)
                may_retry = op.retry != CONNECT_ONLY or never_sent
                if may_retry and attempt < attempts:
                    self._sleep(self.retry.delay(attempt))
                    continue
                raise TransportFailure(operation, attempt, e) from e
            status = response.status_code
            if status < 400:
                return response
            if status == 503 and dataset is not None and attempt < attempts:
                hint = self._not_owner_hint(response)
                if hint is not None:
                    # Nothing was applied: resend whatever the retry class, to the
                    # owner the problem names (at once) or after Retry-After.
                    advertise = hint.get("advertise") if isinstance(hint, dict) else None
                    if isinstance(advertise, str) and advertise.rstrip("/") != owner:
                        self._routes.learn(dataset, advertise)
                        continue
                    self._routes.forget(dataset)
                    wait = retry_after_seconds(response.headers.get("Retry-After"))
                    self._sleep(min(self.retry.max_backoff, wait if wait is not None else self.retry.delay(attempt)))
                    continue
            retryable = status in self.retry.statuses and op.retry != CONNECT_ONLY
            if retryable and attempt < attempts:
                self._sleep(self.retry.delay(attempt))
                continue
            error = self._error(response, operation)
            error.attempts = attempt
            raise error

    @staticmethod
    def _not_owner_hint(response: httpx.Response) -> Optional[Any]:
        """For a ``not-owner`` problem: its ``owner`` member (``{}`` when absent);
        ``None`` for any other answer."""
        try:
            body = response.json()
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("type") != NOT_OWNER:
            return None
        return body.get("owner") or {}

    def _load_routes(self) -> None:
        """Read the cluster map once (one attempt): on any failure (a server
        without a cluster endpoint, a refusal) requests go to the base URL."""
        view = None
        try:
            response = self._http.get("/v1/cluster", headers=self._headers(None))
            if response.status_code == 200:
                view = response.json()
        except (httpx.HTTPError, ValueError):
            view = None
        self._routes.install(view if isinstance(view, dict) else None)

    def _call(self, operation: str, json_body: Any = None, **kwargs: Any) -> Any:
        if json_body is not None:
            kwargs["body"] = json.dumps(json_body, allow_nan=False).encode()
            kwargs["content_type"] = _JSON
        response = self._send(operation, **kwargs)
        op = OPERATIONS[operation]
        if op.response is None:
            return response
        return from_json(op.response, response.json())

    # --- datasets -----------------------------------------------------------

    def create_dataset(
        self,
        id: str,
        config: DatasetConfig,
        *,
        release_budget: Optional[Union[BudgetRequest, float]] = None,
        labels: Optional[Sequence[Optional[str]]] = None,
        release_policy: Optional[ReleasePolicy] = None,
    ) -> DatasetView:
        """Create a ledger (admin). ``release_budget`` (a :class:`BudgetRequest`,
        or a float: zCDP ``rho``), ``labels`` (one per example, ``None``:
        unlabelled) and ``release_policy`` set up DP releases from the start.

        Retried with an idempotency key: if an earlier attempt's answer was
        lost, the retry is answered with the dataset that attempt created."""
        if isinstance(release_budget, (int, float)):
            release_budget = BudgetRequest(rho=float(release_budget))
        request = to_json(
            CreateDataset(
                id=id,
                config=config,
                release_budget=release_budget,
                labels=None if labels is None else list(labels),
                release_policy=release_policy,
            )
        )
        view = self._call("create_dataset", request)
        self._note_layout(id, view)
        return view

    def list_datasets(self) -> DatasetList:
        """Dataset ids the token covers."""
        return self._call("list_datasets")

    def get_dataset(self, dataset: str) -> DatasetView:
        """A dataset's configuration, status and public worst case (with the
        shard map of a sharded dataset, which the client remembers: it splits
        that dataset's steps without reading the view again)."""
        view = self._call("get_dataset", path_params={"dataset": dataset})
        self._note_layout(dataset, view)
        return view

    def _note_layout(self, dataset: str, view: DatasetView) -> Optional[shards.ShardLayout]:
        layout = shards.ShardLayout.of(view)
        with self._layouts_lock:
            self._layouts[dataset] = layout
        return layout

    def _shard_layout(self, dataset: str) -> Optional[shards.ShardLayout]:
        """The layout of ``dataset`` if it is sharded: known, or read once. The
        cluster map (read anyway for routing) says which: it lists a sharded
        dataset's shards; only then is the view read (once). When the map does
        not say (a dataset it does not list) or the view cannot be read now,
        ``None`` without remembering it: the whole report goes to a node, which
        splits it if need be."""
        with self._layouts_lock:
            if dataset in self._layouts:
                return self._layouts[dataset]
        if self._routes.needs_load():
            self._load_routes()
        hint = self._routes.may_be_sharded(dataset)
        if hint is None:
            return None
        if not hint:
            with self._layouts_lock:
                self._layouts[dataset] = None
            return None
        try:
            return self._note_layout(dataset, self._call("get_dataset",
                                                         path_params={"dataset": dataset}))
        except (ApiError, TransportFailure):
            return None

    def archive_dataset(self, dataset: str) -> DatasetView:
        """Make a dataset read-only (admin, curator). Retried with an idempotency key."""
        return self._call("archive_dataset", path_params={"dataset": dataset})

    # --- training -----------------------------------------------------------

    def report_step(
        self,
        dataset: str,
        step: int,
        ids: Iterable[int],
        norms: Iterable[float],
        *,
        noise_multiplier: Optional[float] = None,
        sampling_rate: Optional[float] = None,
        part: Optional[Union[Part, Tuple[int, int]]] = None,
        binary: bool = True,
    ) -> StepOutcome:
        """Report step ``step``: the batch's example ids and their UNCLIPPED
        gradient norms. Sent in the binary ``DPLS`` encoding (``binary=False``:
        JSON). Retried until answered; a retry the server recognises as already
        applied (``duplicate``) is a success with the original answer."""
        ids = _plain_list(ids, int)
        norms = _plain_list(norms, float)
        if isinstance(part, tuple):
            part = Part(index=part[0], count=part[1])
        layout = self._shard_layout(dataset)
        if layout is None:
            return self._report_one("report_step", dataset, step, ids, norms,
                                    noise_multiplier, sampling_rate, part, binary)
        # A sharded dataset: split by range, each part straight to
        # its shard's owner, in parallel; the answers merged.
        cut = shards.split(layout, ids, norms)
        if self._pool is None:
            with self._layouts_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=16,
                                                    thread_name_prefix="dpledger-shard")
        futures = [
            self._pool.submit(self._report_one, "report_step", name, step, cut.ids[s],
                              cut.norms[s], noise_multiplier, sampling_rate, part, binary)
            for s, name in enumerate(layout.names)
        ]
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except (ApiError, TransportFailure) as e:
                results.append(e)
        return shards.combine(layout, cut, step, part, results)

    def _report_one(
        self,
        operation: str,
        dataset: str,
        step: int,
        ids: list,
        norms: list,
        noise_multiplier: Optional[float],
        sampling_rate: Optional[float],
        part: Optional[Part],
        binary: bool,
    ) -> StepOutcome:
        """``POST /v1/datasets/{d}/steps`` (``operation``) of one report (a
        dataset's or a shard's part), with the retries of :meth:`_send`."""
        if binary:
            body = encoding.encode_step(
                step,
                ids,
                norms,
                part=part,
                noise_multiplier=noise_multiplier,
                sampling_rate=sampling_rate,
            )
            response = self._send(
                operation,
                path_params={"dataset": dataset},
                body=body,
                content_type=encoding.CONTENT_TYPE,
            )
            return from_json(StepOutcome, response.json())
        request: Dict[str, Any] = {"step": step, "ids": ids, "norms": norms}
        if noise_multiplier is not None:
            request["noise_multiplier"] = noise_multiplier
        if sampling_rate is not None:
            request["sampling_rate"] = sampling_rate
        if part is not None:
            request["part"] = {"index": part.index, "count": part.count}
        return self._call(operation, request, path_params={"dataset": dataset})

    def thresholds(
        self, dataset: str, start: Optional[int] = None, end: Optional[int] = None
    ) -> Thresholds:
        """Current clipping thresholds of ids ``start..end`` (for the next step)."""
        return self._call(
            "thresholds", path_params={"dataset": dataset}, params={"start": start, "end": end}
        )

    def refresh(
        self, dataset: str, ids: Iterable[int], norms: Iterable[float]
    ) -> RefreshOutcome:
        """Full-batch norms: new thresholds from the next step on, no charge.
        Retried with an idempotency key: stored once whatever the retries."""
        request = to_json(RefreshRequest(ids=_plain_list(ids, int), norms=_plain_list(norms, float)))
        return self._call("refresh", request, path_params={"dataset": dataset})

    # --- privacy ------------------------------------------------------------

    def example_privacy(
        self,
        dataset: str,
        example: int,
        *,
        delta: Optional[float] = None,
        conversion: Optional[str] = None,
        method: Optional[str] = None,
    ) -> PrivacyView:
        """One example's epsilon next to the worst case (admin, curator, owner).

        ``method="pld_estimate"`` adds ``pld_estimate``: the example's PLD epsilon
        over its actual thresholds, an estimate (``guarantee`` False), never its
        guarantee (``example.epsilon``)."""
        return self._call(
            "example_privacy",
            path_params={"dataset": dataset, "example": int(example)},
            params={"delta": _query_float(delta), "conversion": conversion, "method": method},
        )

    def worst_case(
        self, dataset: str, *, delta: Optional[float] = None, conversion: Optional[str] = None
    ) -> WorstCaseBounds:
        """The public, data-independent accountant of a dataset."""
        return self._call(
            "worst_case",
            path_params={"dataset": dataset},
            params={"delta": _query_float(delta), "conversion": conversion},
        )

    # --- analyses -----------------------------------------------------------

    @staticmethod
    def _analysis_params(
        runs: Sequence[str],
        alpha: Optional[Sequence[float]],
        holder: Optional[float],
        delta: Optional[float],
        conversion: Optional[str],
        order_ratio: Optional[float],
        level_stride: Optional[int],
    ) -> Dict[str, Any]:
        return {
            "runs": ",".join(runs),
            "alpha": None if alpha is None else ",".join(repr(float(a)) for a in alpha),
            "holder": _query_float(holder),
            "delta": _query_float(delta),
            "conversion": conversion,
            "order_ratio": _query_float(order_ratio),
            "level_stride": level_stride,
        }

    def data_dependent_analysis(
        self,
        runs: Sequence[str],
        *,
        alpha: Optional[Sequence[float]] = None,
        holder: Optional[float] = None,
        delta: Optional[float] = None,
        conversion: Optional[str] = None,
        order_ratio: Optional[float] = None,
        level_stride: Optional[int] = None,
    ) -> DataDependentAnalysis:
        """Seed 001's data-dependent estimate of every example over ``runs``
        (dataset ids of runs of one configuration with refreshes), beside the
        data-independent and seed-000 epsilons; ``guarantee`` is false. Admin
        or curator of every run. ``order_ratio=1`` is the exact evaluation."""
        return self._call(
            "data_dependent_analysis",
            params=self._analysis_params(runs, alpha, holder, delta, conversion, order_ratio, level_stride),
        )

    def data_dependent_example(
        self,
        example: int,
        runs: Sequence[str],
        *,
        alpha: Optional[Sequence[float]] = None,
        holder: Optional[float] = None,
        delta: Optional[float] = None,
        conversion: Optional[str] = None,
        order_ratio: Optional[float] = None,
        level_stride: Optional[int] = None,
    ) -> DataDependentExampleView:
        """One example's data-dependent estimate (its owner in every run, or a
        curator of every run)."""
        return self._call(
            "data_dependent_example",
            path_params={"example": int(example)},
            params=self._analysis_params(runs, alpha, holder, delta, conversion, order_ratio, level_stride),
        )

    # --- releases -----------------------------------------------------------

    def create_release(
        self,
        dataset: str,
        request: Optional[ReleaseRequest] = None,
        *,
        mean: Optional[Union[float, MeanRequest]] = None,
        quantiles: Optional[QuantilesRequest] = None,
        histogram: Optional[HistogramRequest] = None,
        by_group: bool = False,
        delta: Optional[float] = None,
    ) -> ReleaseOutcome:
        """Publish DP statistics of the per-example epsilons (curator): give a
        :class:`ReleaseRequest`, or its parts (``mean`` may be a float: its
        ``rho``). Its cost (the sum of the statistics' ``rho``) is charged to
        the release budget, to every example's RDP (``alpha * rho`` at each
        order) and to the worst case.

        Retried with one idempotency key per call: a retry after a lost answer
        (or the server's ``outcome-unknown`` 503) is answered with the release
        the first attempt published, charged once. Over budget (or with none
        set): :class:`Conflict` whose ``budget`` says the spend and the
        request."""
        if request is None:
            if isinstance(mean, (int, float)):
                mean = MeanRequest(rho=float(mean))
            request = ReleaseRequest(
                mean=mean, quantiles=quantiles, histogram=histogram, by_group=by_group, delta=delta
            )
        elif any(x is not None for x in (mean, quantiles, histogram, delta)) or by_group:
            raise TypeError("give either a ReleaseRequest or its parts, not both")
        return self._call("create_release", to_json(request), path_params={"dataset": dataset})

    def list_releases(self, dataset: str, limit: Optional[int] = None) -> ReleaseList:
        """Releases, newest first (at most ``limit``: server default 20, at most
        1000), with the budget and the policy (viewers too; no cost)."""
        return self._call(
            "list_releases", path_params={"dataset": dataset}, params={"limit": limit}
        )

    def latest_release(self, dataset: str, *, missing_ok: bool = False) -> Optional[Release]:
        """The latest release, as a dashboard polls it (viewers too; reading
        costs no privacy). Nothing released yet: :class:`NotFound`, or ``None``
        with ``missing_ok=True`` (a missing dataset still raises NotFound)."""
        try:
            return self._call("latest_release", path_params={"dataset": dataset})
        except NotFound:
            if not missing_ok:
                raise
            # Tell "no release yet" from "no such dataset" (which raises here).
            releases = self.list_releases(dataset, limit=1).releases
            return releases[0] if releases else None

    def get_budget(self, dataset: str) -> BudgetStatus:
        """The release budget and what releases spent of it."""
        return self._call("get_budget", path_params={"dataset": dataset})

    def set_budget(
        self,
        dataset: str,
        rho: Optional[Union[float, BudgetRequest]] = None,
        *,
        epsilon: Optional[float] = None,
        delta: Optional[float] = None,
    ) -> BudgetStatus:
        """Set the total release budget (curator): zCDP ``rho``, or
        ``epsilon`` with ``delta`` (converted by the server, rounded down), or a
        :class:`BudgetRequest`. An absolute value, so repeating it is harmless;
        below what is already spent it is a :class:`Conflict`."""
        if isinstance(rho, BudgetRequest):
            request = rho
        else:
            request = BudgetRequest(rho=rho, epsilon=epsilon, delta=delta)
        return self._call("set_budget", to_json(request), path_params={"dataset": dataset})

    def get_policy(self, dataset: str) -> PolicyView:
        """The automatic release policy (``policy`` ``None``: none) and why its
        latest release was refused, if it was."""
        return self._call("get_policy", path_params={"dataset": dataset})

    def set_policy(self, dataset: str, policy: Optional[ReleasePolicy]) -> PolicyView:
        """Release ``policy.request`` after every ``policy.every_steps`` steps
        (curator); ``None`` removes the policy."""
        body = {"policy": to_json(PolicyUpdate(policy=policy)).get("policy")}
        return self._call("set_policy", body, path_params={"dataset": dataset})

    def set_labels(
        self,
        dataset: str,
        ids: Union[Iterable[int], Dict[int, Optional[str]]],
        labels: Optional[Iterable[Optional[str]]] = None,
    ) -> LabelsView:
        """Label examples for per-group releases (curator): ``labels[j]`` for
        ``ids[j]``, or a mapping ``{id: label}``; ``None`` removes a label.
        Returns every group label in use or used before."""
        if isinstance(ids, dict):
            if labels is not None:
                raise TypeError("give a mapping or ids and labels, not both")
            labels = list(ids.values())
            ids = list(ids.keys())
        if labels is None:
            raise TypeError("labels are missing")
        request = LabelAssignment(ids=_plain_list(ids, int), labels=list(labels))
        body = {"ids": request.ids, "labels": request.labels}  # null labels stay null
        return self._call("set_labels", body, path_params={"dataset": dataset})

    # --- accountant ---------------------------------------------------------

    def accountant_rdp(
        self, sampling_rate: float, noise_multiplier: float, *, orders: Optional[Sequence[float]] = None
    ) -> RdpResponse:
        """RDP of one sampled-Gaussian step at each order."""
        req = RdpRequest(sampling_rate, noise_multiplier, list(orders) if orders else None)
        return self._call("accountant_rdp", to_json(req))

    def accountant_epsilon(
        self,
        sampling_rate: float,
        noise_multiplier: float,
        steps: int,
        delta: float,
        *,
        orders: Optional[Sequence[float]] = None,
        conversion: Optional[str] = None,
        method: Optional[str] = None,
    ) -> EpsilonResponse:
        """Worst-case epsilon of ``steps`` steps (``None`` epsilon: infinite).

        ``method``: ``"pld"`` (the server's default, the tightest) or ``"rdp"``;
        ``orders`` and ``conversion`` apply to ``"rdp"`` only."""
        req = EpsilonRequest(
            sampling_rate, noise_multiplier, steps, delta, list(orders) if orders else None, conversion, method  # type: ignore[arg-type]
        )
        return self._call("accountant_epsilon", to_json(req))

    def accountant_noise(
        self,
        target_epsilon: float,
        delta: float,
        sampling_rate: float,
        steps: int,
        *,
        orders: Optional[Sequence[float]] = None,
        method: Optional[str] = None,
    ) -> NoiseResponse:
        """The smallest noise multiplier reaching ``target_epsilon`` (``method``
        as in :meth:`accountant_epsilon`)."""
        req = NoiseRequest(
            target_epsilon, delta, sampling_rate, steps, list(orders) if orders else None, method  # type: ignore[arg-type]
        )
        return self._call("accountant_noise", to_json(req))

    def accountant_compare(
        self, sampling_rate: float, noise_multiplier: float, steps: int, delta: float
    ) -> CompareResponse:
        """The same run under several accountants."""
        req = CompareRequest(sampling_rate, noise_multiplier, steps, delta)
        return self._call("accountant_compare", to_json(req))

    def accountant_schedule(self, request: ScheduleRequest) -> ScheduleResponse:
        """A noise schedule per epoch and where its budget runs out."""
        return self._call("accountant_schedule", to_json(request))

    # --- operations ---------------------------------------------------------

    def healthz(self) -> Health:
        return self._call("healthz")

    def readyz(self) -> Health:
        return self._call("readyz")

    def metrics_endpoint(self) -> str:
        """Prometheus text exposition."""
        return self._call("metrics_endpoint").text

    def storage(self) -> StorageReport:
        """What the service keeps where: log, snapshot and archive bytes, each
        dataset's memory and newest snapshot (admin token; loads nothing)."""
        return self._call("storage")

    def cluster_view(self) -> ClusterView:
        """The cluster map: nodes, their liveness, and who owns which dataset
        (those this token holds a role on). Also refreshes this client's routing,
        so later requests go to the owners directly."""
        response = self._send("cluster_view")
        body = response.json()
        self._routes.install(body)
        return from_json(ClusterView, body)

    def drain(self, node: str) -> DrainAnswer:
        """Ask cluster node ``node`` to hand its datasets over one by one and exit
        (admin token): a rolling upgrade without failed requests."""
        return self._call("drain", path_params={"node": node})

    def mint_token(
        self,
        role: str,
        dataset: Optional[str] = None,
        *,
        datasets: Optional[Sequence[str]] = None,
        examples: Optional[Iterable[int]] = None,
        ttl: Optional[str] = None,
        subject: Optional[str] = None,
    ) -> MintedToken:
        """Mint a token with the server secret (admin token): ``ttl`` such as
        ``"30d"``, ``"1h"`` (at least ``"1s"``). Keep the answer's ``jti`` to
        revoke it."""
        request = to_json(
            MintTokenRequest(
                role=role,
                dataset=dataset,
                datasets=None if datasets is None else list(datasets),
                examples=None if examples is None else [int(e) for e in examples],
                ttl=ttl,
                subject=subject,
            )
        )
        return self._call("mint_token", request)

    def revoke_token(self, jti: str) -> RevokedToken:
        """Revoke a token by its id (admin token): refused at once by this
        server, by every other one on the store within the answer's
        ``others_within_seconds``."""
        return self._call("revoke_token", path_params={"jti": jti})

    def openapi_json(self) -> Dict[str, Any]:
        """The server's OpenAPI document."""
        return self._call("openapi_json").json()


def _query_float(x: Optional[float]) -> Optional[str]:
    return None if x is None else repr(float(x))

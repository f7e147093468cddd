"""Typed request and response bodies of the dpledger HTTP API.

Every class that mirrors a schema of ``openapi/openapi.json`` names it in
``__schema__``; ``tests/test_openapi.py`` checks that its fields are exactly the
schema's properties and that a field has no default exactly when the schema
requires it. Infinite values travel as JSON ``null``; a ``float`` field receives
them as ``math.inf``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Optional, Union

__all__ = [
    "Clipping",
    "PoissonSampling",
    "ShuffleSampling",
    "Sampling",
    "IndividualBudget",
    "ThresholdMode",
    "RefreshSchedule",
    "ShardSpan",
    "ExPostOrders",
    "DatasetConfig",
    "CreateDataset",
    "FilterStatus",
    "LabelBudgetStatus",
    "PendingStatus",
    "LedgerStatus",
    "WorstCase",
    "WorstCaseBounds",
    "WorstCaseMethod",
    "PldWorstCase",
    "Bound",
    "DatasetView",
    "ShardView",
    "DatasetList",
    "Part",
    "StepReport",
    "StepOutcome",
    "Thresholds",
    "RefreshRequest",
    "RefreshOutcome",
    "ExamplePrivacy",
    "PrivacyPart",
    "PrivacyKind",
    "LedgerKind",
    "RefreshDue",
    "PrivacyView",
    "LevelSteps",
    "PldEstimate",
    "RdpRequest",
    "RdpResponse",
    "EpsilonRequest",
    "EpsilonResponse",
    "NoiseRequest",
    "NoiseResponse",
    "CompareRequest",
    "CompareRow",
    "CompareResponse",
    "ScheduleRequest",
    "ScheduleEpoch",
    "ScheduleResponse",
    "BudgetRequest",
    "BudgetStatus",
    "BudgetRefusal",
    "MeanRequest",
    "QuantilesRequest",
    "HistogramRequest",
    "ReleaseRequest",
    "ReleasePolicy",
    "MeanValue",
    "QuantileValue",
    "HistogramValue",
    "Statistics",
    "GroupStatistics",
    "ReleaseValues",
    "Release",
    "ReleaseOutcome",
    "ReleaseList",
    "LabelAssignment",
    "LabelsView",
    "PolicyUpdate",
    "PolicyView",
    "DataIndependentEpsilon",
    "DataDependentQuantiles",
    "DataDependentInterval",
    "DataDependentSummary",
    "DataDependentExample",
    "DataDependentAnalysis",
    "DataDependentExampleView",
    "Health",
    "StorageReport",
    "DatasetStorageReport",
    "SnapshotReport",
    "TableCacheReport",
    "EstimateCacheReport",
    "Problem",
    "OwnerRef",
    "ClusterNodeView",
    "ClusterDatasetView",
    "ClusterView",
    "DrainAnswer",
    "MintTokenRequest",
    "MintedToken",
    "RevokedToken",
    "from_json",
    "to_json",
    "SCHEMA_TYPES",
]

Clipping = Literal["per_example", "global"]
Conversion = Literal["improved", "classic"]
ScheduleKind = Literal["constant", "time", "exponential", "step", "polynomial"]
BatchingKind = Literal["poisson", "shuffle"]
QuantileMethod = Literal["kss", "gradient_descent"]
ReleaseTrigger = Literal["request", "policy"]


# --- datasets ---------------------------------------------------------------


@dataclass
class PoissonSampling:
    """Each example joins each step independently with probability ``rate``."""

    rate: float
    kind: Literal["poisson"] = "poisson"


@dataclass
class ShuffleSampling:
    """Fixed-size batches of a shuffled dataset (one charge per epoch)."""

    batch_size: int
    kind: Literal["shuffle"] = "shuffle"
    #: The dataset's epoch length in steps, which a shard of a sharded dataset
    #: carries (set by the server; refused in a creation).
    epoch_steps: Optional[int] = None


Sampling = Union[PoissonSampling, ShuffleSampling]


@dataclass
class IndividualBudget:
    __schema__: ClassVar[str] = "IndividualBudget"
    epsilon: float
    delta: float


#: Predictable thresholds (the server's default: guarantees through the filter
#: and ex-post bounds) or the old sampled protocol (estimates only).
ThresholdMode = Literal["predictable", "sampled"]


@dataclass
class ShardSpan:
    """A shard's place in its sharded dataset's ids (set by the cluster)."""

    __schema__: ClassVar[str] = "ShardSpan"
    #: The dataset id of the shard's id 0.
    start: int
    #: The dataset's number of examples.
    dataset_examples: int


@dataclass
class RefreshSchedule:
    """The predictable mode's public refresh schedule."""

    __schema__: ClassVar[str] = "RefreshSchedule"
    #: A full pass before steps 0, E, 2E, ...
    full_every: Optional[int] = None
    #: A round-robin block of m ids ``(t*m + j) mod n`` before every step t.
    block: Optional[int] = None
    #: Set by the cluster on a sharded dataset's shards (never by a user).
    shard: Optional[ShardSpan] = None


@dataclass
class ExPostOrders:
    """The ex-post bound's orders and weights, fixed at creation."""

    __schema__: ClassVar[str] = "ExPostOrders"
    orders: List[float]
    weights: List[float]


@dataclass
class DatasetConfig:
    """A ledger's configuration (fixed when the dataset is created)."""

    __schema__: ClassVar[str] = "DatasetConfig"
    examples: int
    max_grad_norm: float
    noise_multiplier: float
    sampling: Sampling
    delta: float
    rounding: Optional[float] = None
    orders: Optional[List[float]] = None
    clipping: Clipping = "per_example"
    individual_budget: Optional[IndividualBudget] = None
    #: Budgets of their own for the examples of some labels (given with the
    #: labels at creation); every other example has ``individual_budget``.
    label_budgets: Optional[Dict[str, IndividualBudget]] = None
    #: ``None``: the server's default (predictable).
    thresholds: Optional[ThresholdMode] = None
    refresh: Optional[RefreshSchedule] = None
    planned_steps: Optional[int] = None
    ex_post: Optional[ExPostOrders] = None

    @property
    def effective_rounding(self) -> float:
        """The rounding precision in force (``C / 100`` when not set)."""
        return self.rounding if self.rounding is not None else self.max_grad_norm / 100.0


@dataclass
class CreateDataset:
    """A dataset to create; the release fields are optional."""

    __schema__: ClassVar[str] = "CreateDataset"
    id: str
    config: DatasetConfig
    #: Budget for DP releases (none: no release until a curator sets one).
    release_budget: Optional["BudgetRequest"] = None
    #: Group labels of examples ``0, 1, ...`` (``None``: unlabelled).
    labels: Optional[List[Optional[str]]] = None
    #: Release automatically every N steps.
    release_policy: Optional["ReleasePolicy"] = None
    #: Cluster mode: split into this many contiguous id ranges, each its own
    #: ledger and lease.
    shards: Optional[int] = None


@dataclass
class LabelBudgetStatus:
    __schema__: ClassVar[str] = "LabelBudgetStatus"
    label: str
    epsilon: float
    delta: float
    order: float
    rdp_budget: float


@dataclass
class FilterStatus:
    __schema__: ClassVar[str] = "FilterStatus"
    epsilon: float
    delta: float
    order: float
    rdp_budget: float
    #: Labels with a budget of their own (fixed at creation).
    label_budgets: List[LabelBudgetStatus] = field(default_factory=list)


@dataclass
class PendingStatus:
    __schema__: ClassVar[str] = "PendingStatus"
    step: int
    received: int
    count: int


@dataclass
class LedgerStatus:
    __schema__: ClassVar[str] = "LedgerStatus"
    examples: int
    orders: int
    steps: int
    guarantee: bool
    retired: int
    over_budget: int
    releases: int
    segments: int
    memory_bytes: int
    filter: Optional[FilterStatus] = None
    pending: Optional[PendingStatus] = None


@dataclass
class WorstCase:
    __schema__: ClassVar[str] = "WorstCase"
    epsilon: float
    order: float
    rdp: List[float]
    steps: int


WorstCaseMethod = Literal["pld", "rdp"]
AccountantMethod = Literal["pld", "rdp"]
Bound = Literal["worst_case_pld", "worst_case_rdp", "individual_filter"]
PrivacyKind = Literal["worst_case", "individual_filter", "ex_post", "estimate"]
LedgerKind = Literal["threshold", "sampled"]


@dataclass
class PldWorstCase:
    """The PLD worst case: a proven upper bound for every example."""

    __schema__: ClassVar[str] = "PldWorstCase"
    epsilon: float
    value_discretization: float
    guarantee: bool


@dataclass
class WorstCaseBounds:
    """The data-independent worst case by both accountants; ``epsilon`` is the
    tighter (``method`` says which), ``rdp`` the RDP accountant's detail."""

    __schema__: ClassVar[str] = "WorstCaseBounds"
    epsilon: float
    method: WorstCaseMethod
    steps: int
    rdp: WorstCase
    pld: Optional[PldWorstCase] = None
    pld_error: Optional[str] = None


@dataclass
class DatasetView:
    __schema__: ClassVar[str] = "DatasetView"
    id: str
    archived: bool
    config: DatasetConfig
    status: LedgerStatus
    worst_case: WorstCaseBounds
    #: A sharded dataset's shards, in id order (``None``: unsharded).
    shards: Optional[List["ShardView"]] = None


@dataclass
class ShardView:
    """One shard of a sharded dataset: ids ``start`` to ``end - 1``, served by
    ``owner`` under its own lease."""

    __schema__: ClassVar[str] = "ShardView"
    dataset: str
    start: int
    end: int
    epoch: int
    steps: int
    #: The node holding its live lease (``None``: it is moving).
    owner: Optional[str] = None


@dataclass
class DatasetList:
    __schema__: ClassVar[str] = "DatasetList"
    datasets: List[str]


# --- training ---------------------------------------------------------------


@dataclass
class Part:
    __schema__: ClassVar[str] = "Part"
    index: int
    count: int


@dataclass
class StepReport:
    """One step (or part of one): the batch's ids and their UNCLIPPED norms."""

    __schema__: ClassVar[str] = "StepReport"
    step: int
    ids: List[int] = field(default_factory=list)
    norms: List[float] = field(default_factory=list)
    noise_multiplier: Optional[float] = None
    sampling_rate: Optional[float] = None
    part: Optional[Part] = None


@dataclass
class RefreshDue:
    """The refresh the schedule calls for before a step (predictable mode):
    ids ``(first_id + j) % examples`` for ``j < count``."""

    __schema__: ClassVar[str] = "RefreshDue"
    before_step: int
    full: bool
    first_id: int
    count: int
    received: int

    def ids(self, examples: int) -> List[int]:
        """The ids due, given the dataset's number of examples."""
        return [(self.first_id + j) % max(examples, 1) for j in range(self.count)]


@dataclass
class StepOutcome:
    __schema__: ClassVar[str] = "StepOutcome"
    step: int
    duplicate: bool
    complete: bool
    thresholds: List[float]
    retired: List[int]
    part: Optional[Part] = None
    refresh_due: Optional[RefreshDue] = None


@dataclass
class Thresholds:
    __schema__: ClassVar[str] = "Thresholds"
    start: int
    next_step: int
    thresholds: List[float]
    retired: List[int]
    refresh_due: Optional[RefreshDue] = None


@dataclass
class RefreshRequest:
    __schema__: ClassVar[str] = "RefreshRequest"
    ids: List[int]
    norms: List[float]


@dataclass
class RefreshOutcome:
    __schema__: ClassVar[str] = "RefreshOutcome"
    effective_step: int
    thresholds: List[float]
    retired: List[int]
    refresh_due: Optional[RefreshDue] = None


# --- privacy ----------------------------------------------------------------


@dataclass
class PrivacyPart:
    """One labelled number of an example's privacy: ``kind`` says what it means."""

    __schema__: ClassVar[str] = "PrivacyPart"
    kind: PrivacyKind
    epsilon: float
    delta: float


@dataclass
class ExamplePrivacy:
    """An example's privacy: ``epsilon`` is the guarantee; ``ex_post`` (only
    with predictable thresholds) and ``estimate`` say different things."""

    __schema__: ClassVar[str] = "ExamplePrivacy"
    id: int
    epsilon: float
    delta: float
    bound: Bound
    guarantee: PrivacyPart
    estimate: PrivacyPart
    ledger: LedgerKind
    rdp_epsilon: float
    order: float
    rdp: List[float]
    steps: int
    retired: bool
    over_budget: bool
    threshold: float
    ex_post: Optional[PrivacyPart] = None
    worst_case_pld_epsilon: Optional[float] = None


@dataclass
class LevelSteps:
    """Steps of one example at one (hyperparameter segment, grid level)."""

    __schema__: ClassVar[str] = "LevelSteps"
    sampling_rate: float
    noise_multiplier: float
    threshold: float
    effective_noise_multiplier: float
    steps: int


@dataclass
class PldEstimate:
    """An example's PLD epsilon over its actual thresholds: an estimate
    (``guarantee`` is always False), never the example's guarantee."""

    __schema__: ClassVar[str] = "PldEstimate"
    epsilon: float
    guarantee: bool
    value_discretization: float
    steps: int
    releases: int
    levels: List[LevelSteps]


@dataclass
class PrivacyView:
    __schema__: ClassVar[str] = "PrivacyView"
    delta: float
    example: ExamplePrivacy
    worst_case: WorstCaseBounds
    pld_estimate: Optional[PldEstimate] = None


# --- accountant -------------------------------------------------------------


@dataclass
class RdpRequest:
    __schema__: ClassVar[str] = "RdpRequest"
    sampling_rate: float
    noise_multiplier: float
    orders: Optional[List[float]] = None


@dataclass
class RdpResponse:
    __schema__: ClassVar[str] = "RdpResponse"
    orders: List[float]
    rdp: List[float]


@dataclass
class EpsilonRequest:
    __schema__: ClassVar[str] = "EpsilonRequest"
    sampling_rate: float
    noise_multiplier: float
    steps: int
    delta: float
    orders: Optional[List[float]] = None
    conversion: Optional[Conversion] = None
    method: Optional[AccountantMethod] = None
    value_discretization: Optional[float] = None


@dataclass
class EpsilonResponse:
    __schema__: ClassVar[str] = "EpsilonResponse"
    delta: float
    method: AccountantMethod
    epsilon: Optional[float] = None
    order: Optional[float] = None


@dataclass
class NoiseRequest:
    __schema__: ClassVar[str] = "NoiseRequest"
    target_epsilon: float
    delta: float
    sampling_rate: float
    steps: int
    orders: Optional[List[float]] = None
    method: Optional[AccountantMethod] = None
    value_discretization: Optional[float] = None


@dataclass
class NoiseResponse:
    __schema__: ClassVar[str] = "NoiseResponse"
    noise_multiplier: float
    method: AccountantMethod
    rdp_noise_multiplier: Optional[float] = None
    noise_saving: Optional[float] = None


@dataclass
class CompareRequest:
    __schema__: ClassVar[str] = "CompareRequest"
    sampling_rate: float
    noise_multiplier: float
    steps: int
    delta: float


@dataclass
class CompareRow:
    __schema__: ClassVar[str] = "CompareRow"
    method: str
    guarantee: bool
    description: str
    epsilon: Optional[float] = None


@dataclass
class CompareResponse:
    __schema__: ClassVar[str] = "CompareResponse"
    rows: List[CompareRow]


@dataclass
class ScheduleRequest:
    __schema__: ClassVar[str] = "ScheduleRequest"
    kind: ScheduleKind
    sigma0: float
    decay: Optional[float] = None
    period: Optional[int] = None
    sigma_end: Optional[float] = None
    batching: Optional[BatchingKind] = None
    sampling_rate: Optional[float] = None
    steps_per_epoch: Optional[int] = None
    budget_epsilon: Optional[float] = None
    delta: Optional[float] = None
    budget_rho: Optional[float] = None
    max_epochs: Optional[int] = None


@dataclass
class ScheduleEpoch:
    __schema__: ClassVar[str] = "ScheduleEpoch"
    epoch: int
    sigma: float
    within_budget: bool
    spent: Optional[float] = None


@dataclass
class ScheduleResponse:
    __schema__: ClassVar[str] = "ScheduleResponse"
    kind: ScheduleKind
    batching: BatchingKind
    unit: str
    sigma_per_epoch: List[float]
    epochs: List[ScheduleEpoch]
    stop_epoch: Optional[int] = None


# --- releases --------------------------------------------------------


@dataclass
class BudgetRequest:
    """A release budget: zCDP ``rho``, or ``epsilon`` together with ``delta``
    (converted by the server, rounded down)."""

    __schema__: ClassVar[str] = "BudgetRequest"
    rho: Optional[float] = None
    epsilon: Optional[float] = None
    delta: Optional[float] = None


@dataclass
class BudgetStatus:
    """A dataset's release budget and what releases spent of it."""

    __schema__: ClassVar[str] = "BudgetStatus"
    rho_spent: float
    releases: int
    #: ``None`` until a curator sets one (no release is possible before).
    rho_budget: Optional[float] = None

    @property
    def rho_left(self) -> Optional[float]:
        """What releases may still spend (``None``: no budget set)."""
        return None if self.rho_budget is None else max(0.0, self.rho_budget - self.rho_spent)


@dataclass
class BudgetRefusal:
    """Why a release was refused by its budget (``Conflict.budget``)."""

    __schema__: ClassVar[str] = "BudgetRefusal"
    rho_spent: float
    rho_requested: float
    rho_budget: Optional[float] = None


@dataclass
class MeanRequest:
    """The DP mean of the per-example epsilons, at zCDP cost ``rho``."""

    __schema__: ClassVar[str] = "MeanRequest"
    rho: float


@dataclass
class QuantilesRequest:
    """DP quantiles of the per-example epsilons at ``levels`` in (0, 1); ``rho``
    is the cost of all levels together."""

    __schema__: ClassVar[str] = "QuantilesRequest"
    rho: float
    levels: List[float]
    method: QuantileMethod = "kss"
    steps: Optional[int] = None


@dataclass
class HistogramRequest:
    """A DP histogram of the per-example epsilons over ``bins`` equal bins of ``[0, B]``."""

    __schema__: ClassVar[str] = "HistogramRequest"
    rho: float
    bins: int


@dataclass
class ReleaseRequest:
    """What to release; its cost is the sum of the statistics' ``rho`` (the same
    per group when ``by_group``: the groups are disjoint)."""

    __schema__: ClassVar[str] = "ReleaseRequest"
    mean: Optional[MeanRequest] = None
    quantiles: Optional[QuantilesRequest] = None
    histogram: Optional[HistogramRequest] = None
    by_group: bool = False
    delta: Optional[float] = None

    @property
    def rho(self) -> float:
        """The zCDP cost of this request."""
        return sum(s.rho for s in (self.mean, self.quantiles, self.histogram) if s is not None)


@dataclass
class ReleasePolicy:
    """Release ``request`` automatically after every ``every_steps`` steps.

    Steps never wait for a release: one that falls due while the previous is
    still being computed is deferred (it then describes a later step), and
    later ones coalesce into it."""

    __schema__: ClassVar[str] = "ReleasePolicy"
    every_steps: int
    request: ReleaseRequest


@dataclass
class MeanValue:
    __schema__: ClassVar[str] = "MeanValue"
    mean: float
    count: float


@dataclass
class QuantileValue:
    __schema__: ClassVar[str] = "QuantileValue"
    level: float
    value: float


@dataclass
class HistogramValue:
    __schema__: ClassVar[str] = "HistogramValue"
    edges: List[float]
    counts: List[float]


@dataclass
class Statistics:
    """The statistics released for one population (everyone, or one group)."""

    __schema__: ClassVar[str] = "Statistics"
    mean: Optional[MeanValue] = None
    quantiles: Optional[List[QuantileValue]] = None
    histogram: Optional[HistogramValue] = None

    def quantile(self, level: float) -> Optional[float]:
        """The released value at ``level`` (``None``: not released)."""
        for q in self.quantiles or []:
            if q.level == level:
                return q.value
        return None


@dataclass
class GroupStatistics(Statistics):
    """One label group's statistics (``label`` ``None``: the unlabelled examples)."""

    __schema__: ClassVar[str] = "GroupStatistics"
    label: Optional[str] = None


@dataclass
class ReleaseValues:
    """The population's statistics, or (``by_group``) every group's."""

    __schema__: ClassVar[str] = "ReleaseValues"
    population: Optional[Statistics] = None
    groups: Optional[List[GroupStatistics]] = None


@dataclass
class Release:
    """A release as stored and served to viewers (reading it costs nothing)."""

    __schema__: ClassVar[str] = "Release"
    id: int
    step: int
    released_at: int
    trigger: ReleaseTrigger
    request: ReleaseRequest
    delta: float
    #: The bound ``B``: worst-case epsilon at ``delta`` before this release.
    bound: float
    #: zCDP cost charged to every example and to the worst case.
    rho: float
    values: ReleaseValues

    @property
    def population(self) -> Optional[Statistics]:
        return self.values.population

    @property
    def groups(self) -> Dict[Optional[str], GroupStatistics]:
        """Per-group statistics by label (``None``: unlabelled); empty unless ``by_group``."""
        return {g.label: g for g in self.values.groups or []}


@dataclass
class ReleaseOutcome:
    __schema__: ClassVar[str] = "ReleaseOutcome"
    release: Release
    budget: BudgetStatus


@dataclass
class ReleaseList:
    """Releases of a dataset, newest first, with the budget and the policy."""

    __schema__: ClassVar[str] = "ReleaseList"
    budget: BudgetStatus
    releases: List[Release]
    policy: Optional[ReleasePolicy] = None
    policy_error: Optional[str] = None


@dataclass
class LabelAssignment:
    """``labels[j]`` for ``ids[j]`` (``None`` removes a label)."""

    __schema__: ClassVar[str] = "LabelAssignment"
    ids: List[int]
    labels: List[Optional[str]]


@dataclass
class LabelsView:
    __schema__: ClassVar[str] = "LabelsView"
    groups: List[str]


@dataclass
class PolicyUpdate:
    """Set (or, with ``None``, remove) the automatic release policy."""

    __schema__: ClassVar[str] = "PolicyUpdate"
    policy: Optional[ReleasePolicy] = None


@dataclass
class PolicyView:
    __schema__: ClassVar[str] = "PolicyView"
    policy: Optional[ReleasePolicy] = None
    policy_error: Optional[str] = None


# --- operations -------------------------------------------------------------


@dataclass
class Health:
    __schema__: ClassVar[str] = "Health"
    status: str


@dataclass
class SnapshotReport:
    """A dataset's newest complete snapshot."""

    __schema__: ClassVar[str] = "SnapshotReport"
    id: int
    seq: int
    bytes: int
    created: int
    age_seconds: int
    pinned: bool


@dataclass
class DatasetStorageReport:
    """One dataset's part of the storage report: store bytes, memory, paging."""

    __schema__: ClassVar[str] = "DatasetStorageReport"
    id: str
    archived: bool
    paged_out: bool
    examples: int
    steps: int
    memory_bytes: int
    memory_bytes_per_example: float
    snapshot_bytes_per_example: float
    idle_seconds: float
    last_seq: int
    log_records: int
    log_bytes: int
    snapshot_bytes: int
    archive_bytes: int
    records_since_snapshot: int
    newest_snapshot: Optional[SnapshotReport] = None


@dataclass
class TableCacheReport:
    __schema__: ClassVar[str] = "TableCacheReport"
    tables: int
    bytes: int
    bound_bytes: int
    evictions: int


@dataclass
class EstimateCacheReport:
    """The PLD estimates' cache of level spectra and answers against its bound."""

    __schema__: ClassVar[str] = "EstimateCacheReport"
    spectra: int
    mgfs: int
    answers: int
    bytes: int
    bound_bytes: int
    evictions: int
    hits: int
    misses: int


@dataclass
class StorageReport:
    """What the service keeps where (``GET /v1/admin/storage``, admin only)."""

    __schema__: ClassVar[str] = "StorageReport"
    store: str
    log_records: int
    log_bytes: int
    snapshot_bytes: int
    archive_bytes: int
    memory_bytes: int
    datasets_in_memory: int
    datasets_paged_out: int
    table_cache: TableCacheReport
    estimate_cache: EstimateCacheReport
    datasets: List[DatasetStorageReport]


@dataclass
class OwnerRef:
    """A cluster node as named in a ``not-owner`` problem: send there."""

    __schema__: ClassVar[str] = "OwnerRef"
    node_id: str
    advertise: str


@dataclass
class ClusterNodeView:
    """One node of the cluster map."""

    __schema__: ClassVar[str] = "ClusterNodeView"
    node_id: str
    alive: bool
    draining: bool
    heartbeat_age_ms: int
    datasets_owned: int
    advertise: Optional[str] = None
    memory_free_bytes: Optional[int] = None
    ledger_memory_bytes: Optional[int] = None


@dataclass
class ClusterDatasetView:
    """One dataset of the cluster map: its owner and the lease's epoch."""

    __schema__: ClassVar[str] = "ClusterDatasetView"
    dataset: str
    epoch: int
    lease_expires_in_ms: int
    owner: Optional[str] = None
    advertise: Optional[str] = None


@dataclass
class ClusterView:
    """``GET /v1/cluster``: the nodes and who owns which dataset."""

    __schema__: ClassVar[str] = "ClusterView"
    mode: str
    node_id: str
    nodes: List[ClusterNodeView]
    datasets: List[ClusterDatasetView]
    lease_ttl_ms: Optional[int] = None


@dataclass
class DrainAnswer:
    """What a drain request started."""

    __schema__: ClassVar[str] = "DrainAnswer"
    node_id: str
    draining: bool


@dataclass
class MintTokenRequest:
    """A token to mint (admin): what ``dpledger token`` takes."""

    __schema__: ClassVar[str] = "MintTokenRequest"
    role: str
    dataset: Optional[str] = None
    datasets: Optional[List[str]] = None
    examples: Optional[List[int]] = None
    ttl: Optional[str] = None
    subject: Optional[str] = None


@dataclass
class MintedToken:
    """A minted token (shown once) and its id, for revoking it."""

    __schema__: ClassVar[str] = "MintedToken"
    token: str
    jti: str
    role: str
    exp: int
    iat: int


@dataclass
class RevokedToken:
    """A revocation: refused at once by the server asked, by every other
    process on the store within ``others_within_seconds``."""

    __schema__: ClassVar[str] = "RevokedToken"
    jti: str
    revoked: bool
    others_within_seconds: int


@dataclass
class Problem:
    """An RFC 9457 problem document (every error the server answers)."""

    __schema__: ClassVar[str] = "Problem"
    type: str
    title: str
    status: int
    detail: str
    field: Optional[str] = None
    #: On a release refused by its budget: the spend and the request.
    budget: Optional[BudgetRefusal] = None
    #: On a ``not-owner`` answer of a cluster node: the owner, when known.
    owner: Optional[OwnerRef] = None


# --- data-dependent analysis (seed 001) ----------------------------------------


@dataclass
class DataIndependentEpsilon:
    __schema__: ClassVar[str] = "DataIndependentEpsilon"
    epsilon: float
    order: float


@dataclass
class DataDependentQuantiles:
    __schema__: ClassVar[str] = "DataDependentQuantiles"
    min: float
    p10: float
    p25: float
    median: float
    p75: float
    p90: float
    p99: float
    max: float


@dataclass
class DataDependentInterval:
    """One checkpoint interval: the seed's Figure 1 quantity over examples."""

    __schema__: ClassVar[str] = "DataDependentInterval"
    start_step: int
    end_step: int
    relative_contribution: DataDependentQuantiles


@dataclass
class DataDependentSummary:
    """The distribution over examples: the seed's Figure 2."""

    __schema__: ClassVar[str] = "DataDependentSummary"
    epsilon: DataDependentQuantiles
    ratio_to_data_independent: DataDependentQuantiles
    below_data_independent: int


@dataclass
class DataDependentExample:
    """One example's estimate (``guarantee`` is always false)."""

    __schema__: ClassVar[str] = "DataDependentExample"
    id: int
    rdp: float
    epsilon: float
    order: float
    guarantee: bool
    data_independent_epsilon: float
    relative_contributions: List[Optional[float]]
    per_instance_epsilon: Optional[List[float]] = None


@dataclass
class DataDependentAnalysis:
    """Seed 001's analysis of several runs: an estimate, never a guarantee."""

    __schema__: ClassVar[str] = "DataDependentAnalysis"
    guarantee: bool
    runs: int
    steps: int
    holder: float
    delta: float
    orders: List[float]
    conversion: str
    order_ratio: float
    level_stride: int
    datasets: List[str]
    data_independent: DataIndependentEpsilon
    intervals: List[DataDependentInterval]
    examples: List[DataDependentExample]
    summary: Optional[DataDependentSummary] = None


@dataclass
class DataDependentExampleView:
    """One example's estimate with its context (what its owner reads)."""

    __schema__: ClassVar[str] = "DataDependentExampleView"
    guarantee: bool
    datasets: List[str]
    runs: int
    steps: int
    holder: float
    delta: float
    conversion: str
    order_ratio: float
    level_stride: int
    data_independent: DataIndependentEpsilon
    boundaries: List[int]
    example: DataDependentExample


SCHEMA_TYPES: Dict[str, type] = {
    cls.__schema__: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and "__schema__" in cls.__dict__
}


# --- JSON conversion ----------------------------------------------------------

_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType)


def _convert(tp: Any, value: Any) -> Any:
    if tp is float:
        # The server writes infinite values as null.
        return math.inf if value is None else float(value)
    if tp is int or tp is str or tp is bool or tp is Any:
        return value
    if _is_union(tp):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        variants = [a for a in args if a is not type(None)]
        if len(variants) == 1:
            return _convert(variants[0], value)
        # Tagged unions (Sampling): pick by the "kind" tag.
        if isinstance(value, dict) and "kind" in value:
            for v in variants:
                kind = getattr(v, "kind", None)
                if kind == value["kind"]:
                    return _convert(v, value)
        raise ValueError(f"cannot decode {value!r} as {tp}")
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value
    if origin in (list, List):
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v) for v in value]
    if origin in (dict, Dict):
        args = typing.get_args(tp)
        item = args[1] if len(args) == 2 else Any
        return {k: _convert(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object for {tp.__name__}, got {value!r}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _convert(hints[f.name], value[f.name])
        # Fields the server added after this client was written are ignored.
        return tp(**kwargs)
    return value


def from_json(cls: Any, data: Any) -> Any:
    """Build ``cls`` (a dataclass above, or a typing form such as ``List[int]``)
    from decoded JSON."""
    return _convert(cls, data)


def _plain(value: Any) -> Any:
    """Turn numpy / torch scalars and arrays into plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple, dict, str)):
        return value.tolist()
    return value


def to_json(obj: Any) -> Any:
    """Serialise a dataclass (recursively) as the server expects it: optional
    fields that are ``None`` are left out; numpy/torch arrays become lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if v is None:
                continue
            out[f.name] = to_json(v)
        return out
    obj = _plain(obj)
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items() if v is not None}
    return obj

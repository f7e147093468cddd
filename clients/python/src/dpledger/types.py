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
    "DatasetConfig",
    "CreateDataset",
    "FilterStatus",
    "PendingStatus",
    "LedgerStatus",
    "WorstCase",
    "DatasetView",
    "DatasetList",
    "Part",
    "StepReport",
    "StepOutcome",
    "Thresholds",
    "RefreshRequest",
    "RefreshOutcome",
    "ExamplePrivacy",
    "PrivacyView",
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
    "Health",
    "Problem",
    "from_json",
    "to_json",
    "SCHEMA_TYPES",
]

Clipping = Literal["per_example", "global"]
Conversion = Literal["improved", "classic"]
ScheduleKind = Literal["constant", "time", "exponential", "step", "polynomial"]
BatchingKind = Literal["poisson", "shuffle"]


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


Sampling = Union[PoissonSampling, ShuffleSampling]


@dataclass
class IndividualBudget:
    __schema__: ClassVar[str] = "IndividualBudget"
    epsilon: float
    delta: float


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

    @property
    def effective_rounding(self) -> float:
        """The rounding precision in force (``C / 100`` when not set)."""
        return self.rounding if self.rounding is not None else self.max_grad_norm / 100.0


@dataclass
class CreateDataset:
    __schema__: ClassVar[str] = "CreateDataset"
    id: str
    config: DatasetConfig


@dataclass
class FilterStatus:
    __schema__: ClassVar[str] = "FilterStatus"
    epsilon: float
    delta: float
    order: float
    rdp_budget: float


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


@dataclass
class DatasetView:
    __schema__: ClassVar[str] = "DatasetView"
    id: str
    archived: bool
    config: DatasetConfig
    status: LedgerStatus
    worst_case: WorstCase


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
class StepOutcome:
    __schema__: ClassVar[str] = "StepOutcome"
    step: int
    duplicate: bool
    complete: bool
    thresholds: List[float]
    retired: List[int]
    part: Optional[Part] = None


@dataclass
class Thresholds:
    __schema__: ClassVar[str] = "Thresholds"
    start: int
    next_step: int
    thresholds: List[float]


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


# --- privacy ----------------------------------------------------------------


@dataclass
class ExamplePrivacy:
    __schema__: ClassVar[str] = "ExamplePrivacy"
    id: int
    epsilon: float
    order: float
    rdp: List[float]
    steps: int
    retired: bool
    over_budget: bool
    threshold: float
    guarantee: bool


@dataclass
class PrivacyView:
    __schema__: ClassVar[str] = "PrivacyView"
    delta: float
    example: ExamplePrivacy
    worst_case: WorstCase


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


@dataclass
class EpsilonResponse:
    __schema__: ClassVar[str] = "EpsilonResponse"
    delta: float
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


@dataclass
class NoiseResponse:
    __schema__: ClassVar[str] = "NoiseResponse"
    noise_multiplier: float


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


# --- operations -------------------------------------------------------------


@dataclass
class Health:
    __schema__: ClassVar[str] = "Health"
    status: str


@dataclass
class Problem:
    """An RFC 9457 problem document (every error the server answers)."""

    __schema__: ClassVar[str] = "Problem"
    type: str
    title: str
    status: int
    detail: str
    field: Optional[str] = None


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
        return dict(value)
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

"""Train with Opacus while dpledger keeps every example's privacy ledger.

:func:`make_private` is the dpledger counterpart of
``PrivacyEngine.make_private``. It returns a model, optimizer (and, for ghost
clipping, criterion) and data loader that

* draw Poisson batches (rate ``q`` of the dataset) of **known example ids**: the
  dataset is wrapped to return each item's index, retired examples are left out,
  and the batch of step ``t`` is drawn only after step ``t - 1`` was answered;
* read each step's per-example gradient norms (from ``grad_sample``, in float64,
  or from ghost clipping's per-sample norms) and report them, unclipped, in the
  binary encoding, once per step, through :class:`LedgerRun` (every report is
  retried until the server answers; a failure raises before the parameters are
  updated, so nothing is released that the ledger has not charged);
* clip example ``i`` at its dpledger threshold ``c_i <= C`` (factor
  ``min(1, c_i (1 - m) / ||g_i||)``, ``m`` a small safety margin against float
  rounding; ``0`` for a retired example) instead of at ``C``, so that the epsilons
  the server reports are guarantees (spec §3);
* add Gaussian noise of standard deviation ``noise_multiplier * C``, ``C`` the
  dataset's ``max_grad_norm``, to the sum of clipped gradients (spec §1).

In the predictable mode (the server's default) thresholds change only at the
refreshes of the dataset's public schedule (a full pass every ``E`` steps and/or
a round-robin block of ``m`` ids before every step, declared at creation): the
sampler, before it draws each batch, asks :class:`LedgerRun` which ids are due,
computes their UNCLIPPED per-sample gradient norms at the current model (one
model state: the one the step starts from; :func:`per_sample_norms`, in chunks,
with ``torch.func`` on a hook-free copy of the module's structure that uses the
live parameters) and sends the refresh before the step. A step report never
moves a threshold there. In the sampled mode (the old protocol) nothing is
refreshed unless the caller does.

The engine's own accountant is attached with the dataset's sampling rate, so
``privacy_engine.get_epsilon(delta)`` is Opacus' worst case for the same run.

Typical use::

    run = LedgerRun(client, "digits-1", trace="trace.jsonl")
    model, optimizer, loader = make_private(PrivacyEngine(accountant="rdp"), run,
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(dataset, batch_size=64))
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()          # clips, noises, reports the step
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, IO, List, Optional, Sequence, Tuple, Union

import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import (
    GradSampleModuleFastGradientClipping,
)
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.optimizers.optimizer_fast_gradient_clipping import DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

from .client import Client
from .errors import ApiError, ServerError
from .types import DatasetConfig, PoissonSampling, RefreshDue, StepOutcome, to_json

__all__ = [
    "LedgerRun",
    "IndexedDataset",
    "LedgerPoissonSampler",
    "LedgerDataLoader",
    "LedgerDPOptimizer",
    "LedgerGhostModule",
    "LedgerGhostOptimizer",
    "ClipRecord",
    "RefreshDueError",
    "clip_factors",
    "per_sample_norms",
    "make_private",
    "CLIP_MARGIN",
    "GHOST_MARGIN",
]

#: Relative margin below the threshold at which per-sample gradients whose norms
#: were computed in float64 are clipped: the float32 product ``factor * g`` then
#: never exceeds the threshold.
CLIP_MARGIN = 1e-6
#: Margin for ghost clipping, whose per-sample norms come from float32 sums of
#: products: they are clipped ``1e-4`` below the threshold and reported ``1e-4``
#: above the computed norm, so an underestimate of the norm by less than that
#: cannot make the ledger charge less than the true clipped norm.
GHOST_MARGIN = 1e-4

_THRESHOLD_PAGE = 1 << 20


def clip_factors(norms: torch.Tensor, thresholds: torch.Tensor, margin: float = CLIP_MARGIN) -> torch.Tensor:
    """``min(1, c_i (1 - margin) / g_i)`` per example, 0 where ``c_i <= 0``
    (retired): the clipped norm ``factor_i * g_i`` is at most ``c_i (1 - margin)``."""
    norms = norms.to(torch.float64)
    thresholds = thresholds.to(device=norms.device, dtype=torch.float64)
    limit = thresholds * (1.0 - margin)
    over = norms > limit
    factors = torch.ones_like(norms)
    factors[over] = limit[over] / norms[over]
    factors[thresholds <= 0] = 0.0
    return factors


class RefreshDueError(RuntimeError):
    """A step was about to be reported while the refresh the public schedule
    calls for before it had not been sent: the server would refuse it (409), so
    the run refuses it first. Send :meth:`LedgerRun.due_ids`' norms with
    :meth:`LedgerRun.refresh` (or :meth:`LedgerRun.follow_schedule`) first."""


def per_sample_norms(
    module: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    params: Optional[Dict[str, torch.Tensor]] = None,
    chunk: int = 256,
) -> torch.Tensor:
    """The UNCLIPPED gradient norm of each example's loss (float64, on the CPU),
    all at the module's current parameters: ``torch.func.vmap`` of
    ``torch.func.grad`` over chunks of ``chunk`` examples. ``loss_fn(output,
    target)`` is the loss of ONE example (a batch of one). ``params`` (names as
    ``module.named_parameters()``) replace the module's own, so a hook-free copy
    of a module can compute the norms of the live one without touching its
    ``.grad`` or Opacus' hooks. Only parameters that require a gradient count,
    as in training."""
    from torch.func import functional_call, grad, vmap

    if params is None:
        params = dict(module.named_parameters())
    trainable = {k: v.detach() for k, v in params.items() if v.requires_grad}
    frozen = {k: v.detach() for k, v in params.items() if not v.requires_grad}
    buffers = {k: v.detach() for k, v in module.named_buffers()}
    device = next(iter(trainable.values())).device if trainable else inputs.device

    def loss_one(p: Dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(module, ({**p, **frozen}, buffers), (x.unsqueeze(0),))
        return loss_fn(out, y.unsqueeze(0))

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))
    norms = []
    for start in range(0, len(inputs), chunk):
        x = inputs[start : start + chunk].to(device)
        y = targets[start : start + chunk].to(device)
        grads = per_example(trainable, x, y)
        squares = [g.reshape(len(x), -1).to(torch.float64).pow(2).sum(1) for g in grads.values()]
        norms.append(torch.stack(squares, 1).sum(1).sqrt().cpu())
    if not norms:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat(norms)


class LedgerRun:
    """The trainer's side of one dataset's ledger: the thresholds to clip at
    (mirrored from the server's answers), the retired examples, the next step
    number, and an optional replay trace of everything reported.

    On construction it reads the dataset and its current thresholds, so a run
    can resume after a crash. ``trace`` (a path or a text file) receives the
    JSON-lines format of ``dpledger replay``: the dataset line (written when the
    ledger is at step 0), then one line per step and per refresh.
    """

    def __init__(
        self,
        client: Client,
        dataset: str,
        *,
        trace: Union[str, os.PathLike, IO[str], None] = None,
        binary: bool = True,
        keep_history: bool = False,
    ):
        self.client = client
        self.dataset = dataset
        self.binary = binary
        view = client.get_dataset(dataset)
        self.config: DatasetConfig = view.config
        if not isinstance(self.config.sampling, PoissonSampling):
            raise ValueError(
                f"dataset {dataset!r} uses {self.config.sampling.kind} sampling; "
                "the Opacus integration draws Poisson batches"
            )
        self.examples = int(self.config.examples)
        self.max_grad_norm = float(self.config.max_grad_norm)
        self.noise_multiplier = float(self.config.noise_multiplier)
        self.sample_rate = float(self.config.sampling.rate)
        self.thresholds = torch.empty(self.examples, dtype=torch.float64)
        next_step = None
        first_due: Optional[RefreshDue] = None
        resumed_retired: List[int] = []
        for start in range(0, self.examples, _THRESHOLD_PAGE):
            end = min(self.examples, start + _THRESHOLD_PAGE)
            page = client.thresholds(dataset, start=start, end=end)
            if next_step is not None and page.next_step != next_step:
                raise RuntimeError("the ledger advanced while its thresholds were read")
            next_step = page.next_step
            self.thresholds[start:end] = torch.tensor(page.thresholds, dtype=torch.float64)
            resumed_retired.extend(page.retired)
            first_due = first_due or page.refresh_due
        self.next_step: int = int(next_step or 0)
        #: Whether thresholds are predictable (a public refresh schedule moves
        #: them, never a step report): the default of new datasets.
        self.predictable = self.config.thresholds == "predictable" and self.config.clipping == "per_example"
        #: The refresh the server last announced as due before the next step.
        self.refresh_due: Optional[RefreshDue] = first_due
        self._sent: set = set()
        #: ``ids -> norms`` at the current model; :meth:`follow_schedule` calls
        #: it (:func:`make_private` sets it to :func:`per_sample_norms`).
        self.norms_fn: Optional[Callable[[List[int]], Sequence[float]]] = None
        #: Time spent in scheduled refreshes (norms and request), and examples sent.
        self.refresh_seconds = 0.0
        self.refreshed_examples = 0
        #: Examples the server announced as retired (threshold 0; never sampled).
        self.retired = torch.zeros(self.examples, dtype=torch.bool)
        if resumed_retired:
            self.retired[torch.tensor(resumed_retired, dtype=torch.long)] = True
        #: id -> the first step from which it is retired (announced by this run).
        self.retired_at: dict = {}
        self.duplicates = 0
        #: A report sent without a confirmed answer: (step, ids, norms).
        self.pending: Optional[Tuple[int, List[int], List[float]]] = None
        self.history: Optional[List[Tuple[int, List[int]]]] = [] if keep_history else None
        self._trace: Optional[IO[str]] = None
        self._owns_trace = False
        if trace is not None:
            self._open_trace(trace)

    # --- the trace ------------------------------------------------------------

    def _open_trace(self, trace: Union[str, os.PathLike, IO[str]]) -> None:
        if isinstance(trace, (str, os.PathLike)):
            fresh = not os.path.exists(trace) or os.path.getsize(trace) == 0
            self._trace = open(trace, "a", encoding="utf-8")
            self._owns_trace = True
        else:
            self._trace = trace
            fresh = self.next_step == 0
        if fresh and self.next_step != 0:
            raise ValueError(
                f"the ledger is at step {self.next_step}: a trace must start at step 0 "
                "(append to the trace of the earlier steps instead)"
            )
        if fresh:
            header = {
                "examples": self.examples,
                "max_grad_norm": self.max_grad_norm,
                "rounding": self.config.effective_rounding,
                "noise_multiplier": self.noise_multiplier,
                "sampling_rate": self.sample_rate,
            }
            if self.config.orders is not None:
                header["orders"] = list(self.config.orders)
            # The protocol as the server recorded it, so that the replay runs
            # the same one (a trace without it replays as the sampled protocol).
            for name in ("thresholds", "refresh", "planned_steps", "ex_post"):
                value = getattr(self.config, name)
                if value is not None:
                    header[name] = to_json(value)
            self._write({"dataset": header})

    def _write(self, line: dict) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps(line, allow_nan=False) + "\n")
            self._trace.flush()

    def close(self) -> None:
        if self._trace is not None and self._owns_trace:
            self._trace.close()
        self._trace = None
        for w in self.__dict__.pop("_tb_writers", {}).values():
            w.close()

    # --- the protocol -----------------------------------------------------------

    def clip_thresholds(self, ids: torch.Tensor) -> torch.Tensor:
        """The thresholds (float64) at which ``ids`` must be clipped this step."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        th = self.thresholds[ids].clone()
        th[self.retired[ids]] = 0.0
        return th

    def sample(self, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """A Poisson batch (each active example independently with rate ``q``),
        sorted ids; retired examples are left out."""
        mask = torch.rand(self.examples, generator=generator) < self.sample_rate
        mask &= ~self.retired
        return mask.nonzero().flatten()

    def due_ids(self) -> Optional[List[int]]:
        """The ids whose unclipped norms, at the current model, must be sent
        with :meth:`refresh` before the next step (predictable mode): the due
        refresh's ids less retired ones (the server excuses them) and less
        those this run already sent. ``None`` when nothing is due."""
        due = self.refresh_due
        if due is None or due.before_step != self.next_step or due.received >= due.count:
            return None
        ids = [i for i in due.ids(self.examples) if not self.retired[i] and i not in self._sent]
        return ids or None

    def follow_schedule(self, norms_fn: Optional[Callable[[List[int]], Sequence[float]]] = None) -> int:
        """Send the refresh due before the next step, if any: ``norms_fn(ids)``
        (default :attr:`norms_fn`) must return their UNCLIPPED norms at the
        current model. Returns how many examples were sent (0: nothing due)."""
        ids = self.due_ids()
        if ids is None:
            return 0
        fn = norms_fn or self.norms_fn
        if fn is None:
            raise RefreshDueError(
                f"a refresh of {len(ids)} ids is due before step {self.next_step} and no norms_fn "
                "computes their norms"
            )
        started = time.perf_counter()
        norms = fn(ids)
        self.refresh(ids, norms)
        self.refresh_seconds += time.perf_counter() - started
        self.refreshed_examples += len(ids)
        return len(ids)

    def _note_due(self, due: Optional[RefreshDue]) -> None:
        if self.refresh_due is None or due is None or due.before_step != self.refresh_due.before_step:
            self._sent = set()
        self.refresh_due = due

    def report(self, ids: Sequence[int], norms: Sequence[float]) -> StepOutcome:
        """Report the next step (ids and UNCLIPPED norms) and apply the answer:
        new thresholds for the reported ids, retirements. Raises when the server
        refuses it or cannot be reached after every retry; in the latter case the
        report stays :attr:`pending` (the server may have applied it) and must be
        confirmed with :meth:`confirm_pending` before the next step."""
        if self.pending is not None:
            raise RuntimeError(
                f"step {self.pending[0]} was sent but never confirmed: call confirm_pending() "
                "(the server answers it as a duplicate if it was applied)"
            )
        due = self.due_ids()
        if due is not None:
            kind = "full pass" if self.refresh_due and self.refresh_due.full else "round-robin block"
            raise RefreshDueError(
                f"step {self.next_step} needs the scheduled refresh first: {len(due)} ids of the "
                f"{kind} due before it not sent yet (first {due[0]}); send their norms at the "
                "current model with refresh() (or follow_schedule()) first"
            )
        ids_list = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        norms_list = [float(g) for g in (norms.tolist() if hasattr(norms, "tolist") else norms)]
        self.pending = (self.next_step, ids_list, norms_list)
        return self.confirm_pending()

    def confirm_pending(self) -> StepOutcome:
        """(Re)send the pending report and apply its answer."""
        if self.pending is None:
            raise RuntimeError("no report is pending")
        step, ids_list, norms_list = self.pending
        try:
            outcome = self.client.report_step(
                self.dataset, step, ids_list, norms_list, binary=self.binary
            )
        except ApiError as e:
            # A refusal (400, 403, 409...) means nothing was applied; after a 5xx
            # the outcome is unknown, so the report stays pending.
            if not isinstance(e, ServerError):
                self.pending = None
            raise
        self.pending = None
        if outcome.step != step or not outcome.complete:
            raise RuntimeError(
                f"step {step}: unexpected answer (step {outcome.step}, complete {outcome.complete})"
            )
        if len(outcome.thresholds) != len(ids_list):
            raise RuntimeError(f"step {step}: the answer has {len(outcome.thresholds)} thresholds "
                               f"for {len(ids_list)} ids")
        if outcome.duplicate:
            self.duplicates += 1
        self._apply(ids_list, outcome.thresholds, outcome.retired, step + 1)
        self._write({"step": step, "ids": ids_list, "norms": norms_list})
        if self.history is not None:
            self.history.append((step, ids_list))
        self.next_step = step + 1
        self._note_due(outcome.refresh_due)
        return outcome

    def refresh(self, ids: Sequence[int], norms: Sequence[float]):
        """Unclipped norms of ``ids``, all at one model state (the one the next
        step starts from), set their thresholds from the next step on, charging
        nothing. In the predictable mode only the ids of :meth:`due_ids` are
        taken (in one or several calls); in the sampled mode any, at any time."""
        ids_list = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        norms_list = [float(g) for g in (norms.tolist() if hasattr(norms, "tolist") else norms)]
        outcome = self.client.refresh(self.dataset, ids_list, norms_list)
        self._apply(ids_list, outcome.thresholds, outcome.retired, outcome.effective_step)
        self._write({"refresh": {"ids": ids_list, "norms": norms_list}})
        self._note_due(outcome.refresh_due)
        if outcome.refresh_due is not None and outcome.refresh_due.before_step == self.next_step:
            self._sent.update(ids_list)
        return outcome

    def log_tensorboard(self, writer: Any, step: Optional[int] = None) -> Dict[str, float]:
        """Write the run's privacy scalars to TensorBoard: the worst-case epsilon,
        the latest DP mean and quantiles, and the share of examples retired.
        ``writer`` is a log directory (a SummaryWriter is opened on it, see
        ``dpledger.tensorboard.open_writer``) or anything with ``add_scalar``;
        ``step`` defaults to the number of steps applied. Returns the scalars."""
        from . import tensorboard

        if isinstance(writer, (str, os.PathLike)):
            writer = self._tensorboard_writer(os.fspath(writer))
        return tensorboard.log_privacy(
            self.client,
            self.dataset,
            writer,
            self.next_step if step is None else step,
            retired=int(self.retired.sum().item()),
            examples=self.examples,
        )

    def _tensorboard_writer(self, logdir: str) -> Any:
        from . import tensorboard

        writers = self.__dict__.setdefault("_tb_writers", {})
        if logdir not in writers:
            writers[logdir] = tensorboard.open_writer(logdir)
        return writers[logdir]

    def _apply(self, ids: List[int], thresholds: List[float], retired: List[int], effective: int) -> None:
        if ids:
            self.thresholds[torch.tensor(ids, dtype=torch.long)] = torch.tensor(
                thresholds, dtype=torch.float64
            )
        if retired:
            r = torch.tensor(retired, dtype=torch.long)
            self.retired[r] = True
            self.thresholds[r] = 0.0
            for i in retired:
                self.retired_at.setdefault(int(i), int(effective))


class IndexedDataset(Dataset):
    """``dataset[i]`` as ``(i, *dataset[i])``: every item carries its example id."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        item = self.dataset[index]
        if isinstance(item, (tuple, list)):
            return (int(index), *item)
        return (int(index), item)


class LedgerPoissonSampler:
    """Batch sampler: ``steps`` Poisson batches per epoch (Bernoulli masks, as
    Opacus' ``UniformWithReplacementSampler``) of the run's active examples.
    Each batch is drawn when the loader asks for it, i.e. after the previous
    step's answer announced its retirements."""

    def __init__(self, run: LedgerRun, steps: int, generator: Optional[torch.Generator] = None):
        self.run = run
        self.steps = steps
        self.generator = generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            # The scheduled refresh first: it may retire examples, and its norms
            # must be computed at the model this step starts from.
            if self.run.norms_fn is not None:
                self.run.follow_schedule()
            yield self.run.sample(self.generator).tolist()


class _BatchContext:
    """What the loader, the model and the optimizer share about the current batch."""

    def __init__(self) -> None:
        self.ids: Optional[torch.Tensor] = None
        # Ghost clipping: (ids, reported norms) computed during backward.
        self.pending: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def take_ids(self, n: int) -> torch.Tensor:
        if self.ids is None:
            raise RuntimeError(
                "the ids of this batch are unknown: draw batches from the loader "
                "that dpledger.opacus.make_private returned, one batch per optimizer step"
            )
        if len(self.ids) != n:
            raise RuntimeError(
                f"the per-sample gradients cover {n} examples but the batch had {len(self.ids)}: "
                "one optimizer step must follow exactly one batch"
            )
        ids, self.ids = self.ids, None
        return ids


class LedgerDataLoader:
    """Iterates Poisson batches of a dataset for a :class:`LedgerRun`, yielding
    what the original items hold (the example ids are passed to the optimizer,
    not to the training loop)."""

    def __init__(
        self,
        dataset: Dataset,
        run: LedgerRun,
        *,
        steps_per_epoch: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        collate_fn: Optional[Callable] = None,
        num_workers: int = 0,
        _context: Optional[_BatchContext] = None,
        **kwargs: Any,
    ):
        self.run = run
        self.dataset = dataset
        self.indexed = IndexedDataset(dataset)
        steps = steps_per_epoch or max(1, int(round(1.0 / run.sample_rate)))
        self.batch_sampler = LedgerPoissonSampler(run, steps, generator)
        sample = self.indexed[0]
        collate = wrap_collate_with_empty(
            collate_fn=collate_fn or default_collate,
            sample_empty_shapes=[(0, *shape_safe(x)) for x in sample],
            dtypes=[dtype_safe(x) for x in sample],
        )
        self.context = _context or _BatchContext()
        self._loader = DataLoader(
            self.indexed,
            batch_sampler=self.batch_sampler,
            collate_fn=collate,
            num_workers=num_workers,
            **kwargs,
        )

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        for batch in self._loader:
            ids, rest = batch[0], list(batch[1:])
            self.context.ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
            yield rest[0] if len(rest) == 1 else rest


@dataclass
class ClipRecord:
    """What the last clipping did (for inspection and tests)."""

    ids: torch.Tensor
    norms: torch.Tensor  # the reported (unclipped) norms, float64
    thresholds: torch.Tensor  # the thresholds clipped at, float64
    factors: torch.Tensor  # the clip factors applied, float64


def _no_virtual_steps(optimizer: DPOptimizer) -> None:
    if optimizer._check_skip_next_step():
        raise RuntimeError(
            "virtual steps (signal_skip_step / BatchMemoryManager) are not supported: "
            "every optimizer step is one ledger step of one Poisson batch"
        )


class LedgerDPOptimizer(DPOptimizer):
    """Opacus' ``DPOptimizer`` with per-example thresholds: ``clip_and_accumulate``
    clips example ``i`` at ``c_i`` (not at ``max_grad_norm``), noise has std
    ``noise_multiplier * max_grad_norm`` (``C``), and every step is reported to
    dpledger before the parameters change."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, run: LedgerRun, context: _BatchContext, **kwargs: Any):
        super().__init__(optimizer, **kwargs)
        self.run = run
        self.context = context
        self.last_clip: Optional[ClipRecord] = None
        self._pending: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def clip_and_accumulate(self) -> None:
        grad_samples = self.grad_samples
        n = len(grad_samples[0])
        ids = self.context.take_ids(n)
        if n == 0:
            norms = torch.zeros(0, dtype=torch.float64)
        else:
            per_param = [g.reshape(n, -1).to(torch.float64).norm(2, dim=-1) for g in grad_samples]
            device = per_param[0].device
            norms = torch.stack([x.to(device) for x in per_param], dim=1).norm(2, dim=1)
        thresholds = self.run.clip_thresholds(ids).to(norms.device)
        factors = clip_factors(norms, thresholds, CLIP_MARGIN)
        for p in self.params:
            _check_processed_flag(p.grad_sample)
            grad_sample = self._get_flat_grad_sample(p).to(p.dtype)
            f = factors.to(device=grad_sample.device, dtype=p.dtype)
            grad = torch.einsum("i,i...", f, grad_sample)
            if p.summed_grad is not None:
                p.summed_grad += grad
            else:
                p.summed_grad = grad
            _mark_as_processed(p.grad_sample)
        self._pending = (ids, norms.cpu())
        self.last_clip = ClipRecord(ids, norms.cpu(), thresholds.cpu(), factors.cpu())

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> Optional[bool]:
        if self.grad_samples is None or len(self.grad_samples) == 0:
            raise RuntimeError("no trainable parameters have per-sample gradients")
        self.clip_and_accumulate()
        _no_virtual_steps(self)
        self.add_noise()
        self.scale_grad()
        ids, norms = self._pending  # type: ignore[misc]
        self._pending = None
        self.run.report(ids, norms)
        if self.step_hook:
            self.step_hook(self)
        self._is_last_step_skipped = False
        return True


class LedgerGhostModule(GradSampleModuleFastGradientClipping):
    """Ghost clipping with per-example thresholds: the clipping coefficients of
    the second backward pass are ``min(1, c_i (1 - m) / ||g_i||)`` from the
    ghost per-sample norms."""

    def __init__(self, m: torch.nn.Module, *, run: LedgerRun, context: _BatchContext, **kwargs: Any):
        super().__init__(m, **kwargs)
        self.run = run
        self.context = context
        self.last_clip: Optional[ClipRecord] = None

    def get_clipping_coef(self) -> torch.Tensor:
        norm_sample = self.get_norm_sample()
        n = len(norm_sample)
        ids = self.context.take_ids(n)
        reported = norm_sample.detach().to(torch.float64).cpu() * (1.0 + GHOST_MARGIN)
        thresholds = self.run.clip_thresholds(ids)
        factors = clip_factors(norm_sample.detach().to(torch.float64).cpu(), thresholds, GHOST_MARGIN)
        self.context.pending = (ids, reported)
        self.last_clip = ClipRecord(ids, reported, thresholds, factors)
        return factors.to(device=norm_sample.device, dtype=norm_sample.dtype)


class LedgerGhostOptimizer(DPOptimizerFastGradientClipping):
    """The ghost-clipping optimizer: the gradients arrive clipped (by
    :class:`LedgerGhostModule`); it adds noise ``noise_multiplier * C`` and
    reports the step before the parameters change."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, run: LedgerRun, context: _BatchContext, **kwargs: Any):
        super().__init__(optimizer, **kwargs)
        self.run = run
        self.context = context

    def pre_step(self, closure: Optional[Callable[[], float]] = None) -> Optional[bool]:
        pending = self.context.pending
        if pending is None:
            raise RuntimeError(
                "no clipped batch to step on: call loss.backward() on the criterion "
                "that make_private returned before optimizer.step()"
            )
        self.context.pending = None
        self.accumulate()
        _no_virtual_steps(self)
        self.add_noise()
        self.scale_grad()
        self.run.report(*pending)
        if self.step_hook:
            self.step_hook(self)
        self._is_last_step_skipped = False
        return True


def make_private(
    privacy_engine: Any,
    run: LedgerRun,
    *,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: Union[DataLoader, Dataset],
    criterion: Optional[torch.nn.Module] = None,
    grad_sample_mode: str = "hooks",
    loss_reduction: str = "mean",
    batch_first: bool = True,
    steps_per_epoch: Optional[int] = None,
    noise_generator: Optional[torch.Generator] = None,
    sampling_generator: Optional[torch.Generator] = None,
    refresh_loss: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    refresh_norms: Optional[Callable[[List[int]], Sequence[float]]] = None,
    refresh_chunk: int = 256,
):
    """Like ``PrivacyEngine.make_private``, with dpledger's per-example
    thresholds. The noise multiplier, ``C`` and the sampling rate are the
    dataset's. Returns ``(module, optimizer, data_loader)``, or with
    ``grad_sample_mode="ghost"`` ``(module, optimizer, criterion, data_loader)``;
    iterate the returned loader (it yields the original items without ids), one
    ``optimizer.step()`` per batch.

    In the predictable mode the loader sends the scheduled refresh before each
    step: the due examples' norms at the current model, by default
    :func:`per_sample_norms` of ``refresh_loss`` (default ``criterion``, else
    cross-entropy) on items ``(input, target)`` of the dataset, in chunks of
    ``refresh_chunk`` (it keeps a hook-free copy of the module's structure for
    that). ``refresh_norms(ids) -> norms`` replaces it for other items or
    losses."""
    if grad_sample_mode not in ("hooks", "ghost"):
        raise ValueError(f"grad_sample_mode must be 'hooks' or 'ghost', got {grad_sample_mode!r}")
    model_parameters = set(module.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p not in model_parameters:
                raise ValueError("the optimizer's parameters are not the module's")
    privacy_engine.validate(module=module, optimizer=None, data_loader=None)
    secure = bool(getattr(privacy_engine, "secure_mode", False))
    if secure:
        if noise_generator is not None or sampling_generator is not None:
            raise ValueError("generators cannot be chosen in secure mode")
        noise_generator = sampling_generator = privacy_engine.secure_rng
    if isinstance(data_loader, DataLoader):
        dataset = data_loader.dataset
        collate_fn = data_loader.collate_fn
        num_workers = data_loader.num_workers
    else:
        dataset, collate_fn, num_workers = data_loader, None, 0
    if len(dataset) != run.examples:  # type: ignore[arg-type]
        raise ValueError(
            f"the dataset has {len(dataset)} examples but the ledger {run.dataset!r} has {run.examples}"  # type: ignore[arg-type]
        )
    if run.predictable and refresh_norms is None:
        # Before Opacus registers its hooks on the module's layers: a copy
        # without them, evaluated at the live parameters.
        structure = copy.deepcopy(module)
        loss = refresh_loss or criterion or torch.nn.CrossEntropyLoss()
        collate = collate_fn or default_collate

        def scheduled_norms(ids: List[int]) -> torch.Tensor:
            items = collate([dataset[i] for i in ids])  # type: ignore[index]
            return per_sample_norms(
                structure, loss, items[0], items[1],
                params=dict(module.named_parameters()), chunk=refresh_chunk,
            )

        refresh_norms = scheduled_norms
    run.norms_fn = refresh_norms
    context = _BatchContext()
    C = run.max_grad_norm
    common = dict(
        noise_multiplier=run.noise_multiplier,
        max_grad_norm=C,
        expected_batch_size=max(1, int(round(run.examples * run.sample_rate))),
        loss_reduction=loss_reduction,
        generator=noise_generator,
        secure_mode=secure,
    )
    if grad_sample_mode == "hooks":
        gsm = GradSampleModule(module, batch_first=batch_first, loss_reduction=loss_reduction)
        dp_optimizer: DPOptimizer = LedgerDPOptimizer(optimizer, run=run, context=context, **common)
    else:
        gsm = LedgerGhostModule(
            module,
            run=run,
            context=context,
            batch_first=batch_first,
            loss_reduction=loss_reduction,
            max_grad_norm=C,
            use_ghost_clipping=True,
        )
        dp_optimizer = LedgerGhostOptimizer(optimizer, run=run, context=context, **common)
    gsm.forbid_grad_accumulation()
    dp_optimizer.attach_step_hook(
        privacy_engine.accountant.get_optimizer_hook_fn(sample_rate=run.sample_rate)
    )
    loader = LedgerDataLoader(
        dataset,
        run,
        steps_per_epoch=steps_per_epoch,
        generator=sampling_generator,
        collate_fn=collate_fn,
        num_workers=num_workers,
        _context=context,
    )
    if grad_sample_mode == "ghost":
        if criterion is None:
            criterion = torch.nn.CrossEntropyLoss()
        dp_criterion = DPLossFastGradientClipping(gsm, dp_optimizer, criterion, loss_reduction)
        return gsm, dp_optimizer, dp_criterion, loader
    return gsm, dp_optimizer, loader

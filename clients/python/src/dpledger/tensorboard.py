"""TensorBoard scalars of a training run's privacy.

``privacy_scalars`` reads what a trainer's token may read (the worst case and the
latest DP release) and ``write_scalars`` writes them with any writer that has
``add_scalar(tag, value, step)``; ``open_writer`` opens one on a log directory with
``tensorboardX`` (``pip install 'dpledger[tensorboard]'``) or, failing that,
``torch.utils.tensorboard``.
"""

from typing import Any, Dict, Optional

from .client import Client

#: Tag prefix of every scalar.
PREFIX = "privacy"


def open_writer(logdir: str) -> Any:
    """A SummaryWriter on ``logdir`` (tensorboardX, else torch.utils.tensorboard)."""
    try:
        from tensorboardX import SummaryWriter  # type: ignore[import-not-found]
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter  # type: ignore[no-redef]
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "TensorBoard scalars need tensorboardX (pip install 'dpledger[tensorboard]') "
                "or torch with the tensorboard package"
            ) from e
    return SummaryWriter(logdir)


def privacy_scalars(client: Client, dataset: str, *, retired: int, examples: int) -> Dict[str, float]:
    """Scalars at the ledger's current step: the worst-case epsilon, the latest DP
    mean and quantiles of the population (when released), and the share of
    examples retired (``retired`` of ``examples``, as the trainer knows them)."""
    out: Dict[str, float] = {}
    worst = client.worst_case(dataset)
    out[f"{PREFIX}/worst_case_epsilon"] = float(worst.epsilon)
    latest = client.latest_release(dataset, missing_ok=True)
    population = latest.values.population if latest is not None else None
    if population is not None:
        if population.mean is not None:
            out[f"{PREFIX}/dp_mean_epsilon"] = float(population.mean.mean)
        for q in population.quantiles or []:
            out[f"{PREFIX}/dp_quantile/q{q.level * 100:g}"] = float(q.value)
    out[f"{PREFIX}/retired_share"] = retired / examples if examples else 0.0
    return out


def write_scalars(writer: Any, scalars: Dict[str, float], step: int, *, flush: bool = True) -> None:
    """``writer.add_scalar`` for each scalar at ``step``."""
    for tag, value in sorted(scalars.items()):
        writer.add_scalar(tag, value, step)
    if flush and hasattr(writer, "flush"):
        writer.flush()


def log_privacy(
    client: Client,
    dataset: str,
    writer: Any,
    step: int,
    *,
    retired: int,
    examples: int,
) -> Dict[str, float]:
    """``privacy_scalars`` then ``write_scalars``; returns what was written."""
    scalars = privacy_scalars(client, dataset, retired=retired, examples=examples)
    write_scalars(writer, scalars, step)
    return scalars


__all__ = ["PREFIX", "open_writer", "privacy_scalars", "write_scalars", "log_privacy"]

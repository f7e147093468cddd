#!/usr/bin/env python3
"""Thudi et al.'s data-dependent analysis on scikit-learn's digits: train the same
configuration three times (each run is one dataset of dpledger, with a
full-batch refresh of every example's gradient norm at the start of every
epoch), then ask dpledger for the expected-composition estimate over the runs
and print it next to the data-independent epsilon and seed 000's per-instance
epsilons.

    dpledger serve &
    python examples/digits_data_dependent.py --url http://127.0.0.1:8080 --token-file data/admin.token

The token must be an admin token (the script creates the datasets). CPU only;
about a minute per run on a small machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import TensorDataset

from dpledger import Client, DatasetConfig, PoissonSampling
from dpledger.opacus import LedgerRun, make_private


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def per_example_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list:
    """Every example's (unclipped) gradient norm at the current weights: what
    a full-batch refresh reports. Computed on a hook-free copy of the model."""
    plain = net()
    plain.load_state_dict(model.state_dict())
    params = {k: v.detach() for k, v in plain.named_parameters()}
    loss = nn.CrossEntropyLoss()

    def one(p, xi, yi):
        return loss(functional_call(plain, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    grads = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    sq = sum(g.flatten(1).pow(2).sum(1) for g in grads.values())
    return sq.sqrt().tolist()


def train_run(client: Client, dataset: str, args, x, y, x_test, y_test, seed: int) -> float:
    torch.manual_seed(seed)
    n = len(x)
    client.create_dataset(
        dataset,
        DatasetConfig(
            examples=n,
            max_grad_norm=args.max_grad_norm,
            noise_multiplier=args.noise_multiplier,
            sampling=PoissonSampling(rate=args.batch_size / n),
            delta=args.delta,
            # The integration moves thresholds with its step reports (the
            # sampled protocol): per-example numbers are estimates.
            thresholds="sampled",
        ),
    )
    run = LedgerRun(client, dataset)
    model = net()
    model, optimizer, loader = make_private(
        PrivacyEngine(accountant="rdp"),
        run,
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr),
        data_loader=TensorDataset(x, y),
        sampling_generator=torch.Generator().manual_seed(seed + 1),
    )
    criterion = nn.CrossEntropyLoss()
    for _ in range(args.epochs):
        # The checkpoint of this epoch: every example's norm, before its first step.
        run.refresh(list(range(n)), per_example_norms(model._module, x, y))
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb), yb).backward()
            optimizer.step()
    run.close()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


def main() -> int:
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("DPLEDGER_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--token", default=os.environ.get("DPLEDGER_TOKEN"))
    ap.add_argument("--token-file")
    ap.add_argument("--prefix", default=f"digits-dd-{int(time.time())}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--noise-multiplier", type=float, default=1.0)
    ap.add_argument("--max-grad-norm", type=float, default=5.0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--exact", action="store_true", help="no rounding of step orders")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    if not token:
        ap.error("an admin token is needed: --token, --token-file or DPLEDGER_TOKEN")

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    n = len(x_train)
    client = Client(args.url, token, timeout=600.0)
    runs = [f"{args.prefix}-{r}" for r in range(args.runs)]
    started = time.time()
    for r, dataset in enumerate(runs):
        acc = train_run(client, dataset, args, x_train, y_train, x_test, y_test, args.seed + 100 * r)
        print(f"run {dataset}: {args.epochs} epochs, a refresh every epoch, test accuracy {acc:.3f}")
    trained = time.time() - started

    started = time.time()
    a = client.data_dependent_analysis(runs, delta=args.delta, order_ratio=1.0 if args.exact else None)
    analysed = time.time() - started
    di = a.data_independent.epsilon
    eps = sorted(x.epsilon for x in a.examples)
    below = sum(1 for e in eps if e < di)
    # Seed 000: each run's per-instance epsilons (min(RDP_i, PLD worst), as served).
    per_run = list(zip(*[x.per_instance_epsilon for x in a.examples]))
    worst = [client.worst_case(d, delta=args.delta).epsilon for d in runs]

    def med(v):
        v = sorted(v)
        return v[len(v) // 2]

    print()
    print(f"{n} examples, {a.steps} steps per run, {a.runs} runs; trained in {trained:.0f} s, "
          f"analysed in {analysed:.1f} s (order_ratio {a.order_ratio})")
    print(f"data-independent epsilon: {di:.3f} at delta = {args.delta:g} (RDP, same steps)")
    print(f"seed 001 (data-dependent ESTIMATE, guarantee: {str(a.guarantee).lower()}): "
          f"median {a.summary.epsilon.median:.3f}, p10 {a.summary.epsilon.p10:.3f}, "
          f"p90 {a.summary.epsilon.p90:.3f}; below the data-independent epsilon: "
          f"{below} of {n} ({100 * below / n:.1f}%)")
    for d, e, w in zip(runs, per_run, worst):
        share = sum(1 for v in e if v < w * (1 - 1e-9)) / n
        print(f"seed 000 per-instance (guarantee) in {d}: median {med(e):.3f}, "
              f"below its worst case {w:.3f}: {100 * share:.1f}%")
    print("Figure 1 (median contribution / data-independent, per epoch):",
          " ".join(f"{i.relative_contribution.median:.2f}" for i in a.intervals))
    return 0


if __name__ == "__main__":
    sys.exit(main())

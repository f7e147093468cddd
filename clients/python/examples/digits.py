#!/usr/bin/env python3
"""Train a small classifier on scikit-learn's bundled digits dataset with Opacus,
against a running dpledger, and compare the worst-case epsilon with every
training example's own epsilon.

    dpledger serve &                       # prints: dpledger listening on http://127.0.0.1:8080
    python examples/digits.py --url http://127.0.0.1:8080 --token "$(cat data/admin.token)"

The dataset has the server's default, predictable thresholds with a public
refresh schedule: a round-robin block of ``--block M`` ids before every step
(default: the expected batch size; 0 for none) and, with ``--full-every E``, a
full pass every E steps. Before each step the integration computes the due
examples' per-sample norms at the current model and sends them; the summary
says how long that took next to the steps. ``--sampled`` uses the old protocol
instead (per-example numbers are estimates).

The token (``--token`` or ``DPLEDGER_TOKEN``; ``--token-file``) must be an admin
token: the script creates the dataset. CPU only; well under a minute.
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
from torch.utils.data import TensorDataset

from dpledger import Client, DatasetConfig, PoissonSampling, RefreshSchedule
from dpledger.opacus import LedgerRun, make_private


def quantile(sorted_values, p):
    """Linear-interpolation quantile of an already sorted list."""
    k = (len(sorted_values) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def main() -> int:
    # Opacus' hooks make torch warn on every backward pass; the RNG warning is
    # about secure_mode (PrivacyEngine(secure_mode=True) for production).
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("DPLEDGER_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--token", default=os.environ.get("DPLEDGER_TOKEN"))
    ap.add_argument("--token-file", help="read the token from this file (e.g. data/admin.token)")
    ap.add_argument("--dataset", default=f"digits-{int(time.time())}")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch size")
    ap.add_argument("--noise-multiplier", type=float, default=1.0)
    ap.add_argument("--max-grad-norm", type=float, default=5.0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--block", type=int, help="round-robin refresh block per step (default: the batch size; 0: none)")
    ap.add_argument("--full-every", type=int, help="a full refresh pass every this many steps")
    ap.add_argument("--sampled", action="store_true", help="the old sampled protocol (estimates only)")
    ap.add_argument("--trace", help="also write the replay trace (dpledger replay --trace FILE)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    if not token:
        ap.error("an admin token is needed: --token, --token-file or DPLEDGER_TOKEN")

    torch.manual_seed(args.seed)
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=args.seed, stratify=y
    )
    train = TensorDataset(x_train, y_train)
    n = len(train)
    q = args.batch_size / n

    client = Client(args.url, token)
    steps_per_epoch = max(1, round(1 / q))
    if args.sampled:
        # Step reports move thresholds: per-example numbers are estimates.
        mode = dict(thresholds="sampled")
    else:
        block = args.batch_size if args.block is None else args.block
        mode = dict(
            refresh=RefreshSchedule(full_every=args.full_every, block=block or None),
            planned_steps=args.epochs * steps_per_epoch,
        )
        print(f"predictable thresholds, refresh schedule: block {block}"
              + (f", full pass every {args.full_every} steps" if args.full_every else ""))
    client.create_dataset(
        args.dataset,
        DatasetConfig(
            examples=n,
            max_grad_norm=args.max_grad_norm,
            noise_multiplier=args.noise_multiplier,
            sampling=PoissonSampling(rate=q),
            delta=args.delta,
            **mode,
        ),
    )
    run = LedgerRun(client, args.dataset, trace=args.trace)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = make_private(
        engine,
        run,
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr),
        data_loader=train,
        sampling_generator=torch.Generator().manual_seed(args.seed + 1),
    )
    criterion = nn.CrossEntropyLoss()
    started = time.time()
    training = 0.0
    print(f"dataset {args.dataset}: {n} training examples, q = {q:.4f}, "
          f"sigma = {args.noise_multiplier}, C = {args.max_grad_norm}, {args.epochs} epochs")
    for epoch in range(args.epochs):
        epoch_started = time.perf_counter()
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb), yb).backward()
            optimizer.step()  # clips at the dpledger thresholds, adds noise, reports the step
        training += time.perf_counter() - epoch_started
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"  epoch {epoch + 1:2d}: {run.next_step} steps reported, test accuracy {acc:.3f}")
    run.close()
    seconds = time.time() - started

    # The per-example number: the ex-post bound (predictable thresholds) or the
    # ledger's estimate (sampled protocol); each example's guarantee is the
    # worst case here (no individual budget).
    eps = []
    label = "estimate"
    for i in range(n):
        ex = client.example_privacy(args.dataset, i, delta=args.delta).example
        part = ex.ex_post or ex.estimate
        label = "ex-post bound" if ex.ex_post is not None else "estimate"
        eps.append(part.epsilon)
    worst = client.worst_case(args.dataset, delta=args.delta).epsilon
    eps.sort()
    at_worst = sum(1 for e in eps if e >= worst * (1 - 1e-9)) / n
    th = sorted(run.thresholds.tolist())
    steps = max(run.next_step, 1)
    # The loader's time includes the scheduled refreshes (sent before each batch).
    step_ms = 1e3 * (training - run.refresh_seconds) / steps
    refresh_ms = 1e3 * run.refresh_seconds / steps
    print()
    print(f"trained {run.next_step} steps in {seconds:.1f} s; test accuracy {acc:.3f}")
    print(f"time per step: {step_ms:.2f} ms in steps, {refresh_ms:.2f} ms in refreshes "
          f"({run.refreshed_examples / steps:.1f} examples' norms per step): refreshes add "
          f"{100 * refresh_ms / max(step_ms, 1e-9):.1f}%")
    print(f"worst-case epsilon (every example, data-independent): {worst:.3f} at delta = {args.delta:g}")
    print(f"  (Opacus' own RDP accountant for the same run: {engine.get_epsilon(args.delta):.3f})")
    print(f"per-example epsilon ({label}): min {eps[0]:.3f}, q25 {quantile(eps, 0.25):.3f}, "
          f"median {quantile(eps, 0.5):.3f}, q75 {quantile(eps, 0.75):.3f}, max {eps[-1]:.3f}")
    print(f"share of examples at the worst case: {100 * at_worst:.1f}%")
    print(f"clipping thresholds now: min {th[0]:.2f}, median {quantile(th, 0.5):.2f}, "
          f"max {th[-1]:.2f} (C = {args.max_grad_norm})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

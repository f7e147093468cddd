"""Fixtures: the real ``dpledger`` binary serving a temporary data dir.

The binary is ``$DPLEDGER_BIN``, by default ``<repo>/target/release/dpledger``
(``scripts/test-python`` builds it). A missing binary is a failure, not a skip.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from dpledger import Client, DatasetConfig, PoissonSampling, RetryPolicy

REPO = Path(__file__).resolve().parents[3]
OPENAPI = REPO / "openapi" / "openapi.json"

# Tests retry quickly.
FAST_RETRY = RetryPolicy(attempts=6, backoff=0.01, max_backoff=0.05)


def binary() -> Path:
    path = Path(os.environ.get("DPLEDGER_BIN", REPO / "target" / "release" / "dpledger"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"the dpledger server binary is missing: {path} (build it with "
            "`cargo build --release --bin dpledger`, or set DPLEDGER_BIN)",
            pytrace=False,
        )
    return path


class Server:
    """A running ``dpledger serve`` on a free loopback port."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.bin = binary()
        self.stderr = open(data_dir / "server.stderr", "wb")
        self.proc = subprocess.Popen(
            [str(self.bin), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env={**os.environ, "DPLEDGER_LOG": "warn"},
        )
        lines: "queue.Queue[bytes]" = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(
            target=lambda: lines.put(self.proc.stdout.readline()), daemon=True  # type: ignore[union-attr]
        ).start()
        try:
            line = lines.get(timeout=60).decode().strip()
        except queue.Empty:
            self.stop()
            pytest.fail("dpledger serve printed nothing within 60 s", pytrace=False)
        prefix = "dpledger listening on "
        if not line.startswith(prefix):
            self.stop()
            err = (data_dir / "server.stderr").read_text(errors="replace")
            pytest.fail(f"dpledger serve did not start: {line!r} {err}", pytrace=False)
        self.url = line[len(prefix) :]
        self.admin_token = (data_dir / "admin.token").read_text().strip()

    def token(self, role: str, dataset: Optional[str] = None, examples: Optional[List[int]] = None) -> str:
        cmd = [str(self.bin), "token", "--role", role, "--data-dir", str(self.data_dir)]
        if dataset is not None:
            cmd += ["--dataset", dataset]
        if examples is not None:
            cmd += ["--examples", ",".join(str(e) for e in examples)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def token_for(self, role: str, datasets: List[str], examples: Optional[List[int]] = None) -> str:
        """A token covering several datasets with one role."""
        cmd = [str(self.bin), "token", "--role", role, "--data-dir", str(self.data_dir)]
        for d in datasets:
            cmd += ["--dataset", d]
        if examples is not None:
            cmd += ["--examples", ",".join(str(e) for e in examples)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def replay(self, trace: Path, delta: float) -> Dict:
        out = subprocess.run(
            [str(self.bin), "replay", "--trace", str(trace), "--delta", repr(delta), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, f"replay failed: {out.stderr}"
        return json.loads(out.stdout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("dpledger-data"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def admin(server: Server) -> Iterator[Client]:
    with Client(server.url, server.admin_token, retry=FAST_RETRY) as c:
        yield c


_ids = itertools.count()


@pytest.fixture
def new_id(request) -> "callable":
    """A fresh dataset id per call."""

    def make(prefix: str = "") -> str:
        name = (prefix or request.node.name)[:40]
        clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
        return f"{clean}-{next(_ids)}"

    return make


def poisson_config(n: int, q: float = 0.1, sigma: float = 1.0, **kw) -> DatasetConfig:
    """A Poisson configuration of the sampled protocol (a step report moves a
    sampled example's threshold), which these tests of the client exercise;
    pass ``thresholds="predictable"`` for the default mode."""
    kw.setdefault("thresholds", "sampled")
    return DatasetConfig(
        examples=n,
        max_grad_norm=kw.pop("max_grad_norm", 1.0),
        noise_multiplier=sigma,
        sampling=PoissonSampling(rate=q),
        delta=kw.pop("delta", 1e-5),
        rounding=kw.pop("rounding", 0.01),
        **kw,
    )


def rel(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / abs(b)

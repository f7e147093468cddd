"""TensorBoard scalars: written with tensorboardX, read back with the
tensorboard package's own event reader, equal to what the API answers."""

from __future__ import annotations

import pytest
import tensorboardX  # noqa: F401  (the writer's backend; a missing one fails the test)
from dpledger import QuantilesRequest
from dpledger.tensorboard import log_privacy, open_writer

from conftest import poisson_config

from tensorboard.backend.event_processing import event_accumulator


def read_scalars(logdir) -> dict:
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_round_trip(admin, new_id, tmp_path):
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10, q=0.5))
    admin.set_budget(ds, 1.0)
    writer = open_writer(str(tmp_path))
    written = []
    for t in range(3):
        admin.report_step(ds, t, [0, 1, 2], [0.1, 0.5, 3.0])
        if t >= 1:
            admin.create_release(ds, mean=1e-4, quantiles=QuantilesRequest(rho=1e-4, levels=[0.1, 0.5, 0.9]))
        written.append(log_privacy(admin, ds, writer, t + 1, retired=t, examples=10))
    writer.close()
    # Before any release only the worst case and the retired share exist.
    assert set(written[0]) == {"privacy/worst_case_epsilon", "privacy/retired_share"}
    assert set(written[2]) == {
        "privacy/worst_case_epsilon", "privacy/retired_share", "privacy/dp_mean_epsilon",
        "privacy/dp_quantile/q10", "privacy/dp_quantile/q50", "privacy/dp_quantile/q90",
    }
    latest = admin.latest_release(ds)
    assert written[2]["privacy/dp_quantile/q50"] == latest.values.population.quantile(0.5)
    assert written[2]["privacy/worst_case_epsilon"] == admin.worst_case(ds).epsilon
    got = read_scalars(tmp_path)
    assert [s for s, _ in got["privacy/worst_case_epsilon"]] == [1, 2, 3]
    for tag in written[2]:
        step, value = got[tag][-1]
        assert step == 3 and value == pytest.approx(written[2][tag], rel=1e-6)  # float32 on disk
    assert [v for _, v in got["privacy/retired_share"]] == pytest.approx([0.0, 0.1, 0.2])
    # The worst case grows with every step.
    ws = [v for _, v in got["privacy/worst_case_epsilon"]]
    assert ws == sorted(ws) and ws[0] < ws[-1]


def test_ledger_run_writes_to_a_log_directory(admin, new_id, tmp_path):
    from dpledger.opacus import LedgerRun  # needs torch: scripts/test-python's venv has it

    ds = new_id()
    admin.create_dataset(ds, poisson_config(10, q=0.5))
    run = LedgerRun(admin, ds)
    run.report([0, 1], [0.2, 0.4])
    scalars = run.log_tensorboard(str(tmp_path))
    run.close()
    got = read_scalars(tmp_path)
    assert got["privacy/worst_case_epsilon"] == [(1, pytest.approx(scalars["privacy/worst_case_epsilon"], rel=1e-6))]
    assert got["privacy/retired_share"] == [(1, 0.0)]

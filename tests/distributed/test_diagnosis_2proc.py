"""Profiling and the NaN-origin report in 2 processes (``scripts/diagnosis.py``)."""

from __future__ import annotations

import pytest
from launcher import Launch, launch


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    out_dir = tmp_path_factory.mktemp("diagnosis")
    outcome = launch("diagnosis.py", out_dir=out_dir)
    assert outcome.returncode == 0, outcome.output[-4000:]
    return outcome


def test_each_process_writes_its_own_trace_of_the_active_steps(result: Launch) -> None:
    for rank, report in enumerate(result.ranks):
        assert report["profile"] == {"files": [f"rank{rank}.1.pt.trace.json"], "steps": [[2, 3]]}


def test_the_process_whose_batch_went_bad_reports_where(result: Launch) -> None:
    first, second = (report["nan"] for report in result.ranks)
    expected = (
        "the loss was nan in epoch 1 after 2 updates, on process 1: first non-finite output: "
        "gate (Log), 1 of 4 values NaN; the batch is finite"
    )
    assert second["origin"] == expected
    assert second["warnings"] == [f"TerminateOnNaNCallback: {expected}"]
    # rank 0's next loss is NaN too, from the weights the shared update spoilt: it says so
    assert first["origin"].startswith(
        "the loss was nan in epoch 1 after 3 updates, on process 0: the weights were already "
        "non-finite before this step"
    )
    for report in (first, second):
        assert report["stopped_by"].startswith("Stopping training: train_loss_epoch is nan")

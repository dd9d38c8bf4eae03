"""Three train() calls continuing one run, in 2 processes (scripts/staged_runs.py)."""

from __future__ import annotations

import csv
from pathlib import Path

from helpers import succeeded
from launcher import launch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def test_three_stages_are_one_step_series_and_end_with_the_last_stage_model(
    tmp_path: Path,
) -> None:
    result = launch("staged_runs.py", out_dir=tmp_path)
    assert succeeded(result.returncode, result.output, "AFTER-TRAINING"), result.output[-4000:]
    assert len(result.ranks) == 2
    for rank in result.ranks:
        assert rank["counts"] == [[8, 8], [8, 16], [8, 24]]  # per call; the run's
        assert rank["best_epoch"] == 1
        assert rank["final_weights"] == rank["last_epoch_weights"]  # stage 3's, not epoch 1's
    with open(tmp_path / "run" / "metrics_steps.csv", newline="") as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle)]
    assert steps == [3, 6, 8, 9, 12, 15, 16, 18, 21, 24]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train_loss_step")] == steps
    assert len(list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))) == 1

"""RunRecordCallback in 2 processes: every file present and parseable, written once."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import succeeded
from launcher import Launch, launch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pytorch_accel.callbacks.run_record import RUN_RECORD_FILES


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Path]:
    out = tmp_path_factory.mktemp("run_record")
    result = launch("run_record.py", out_dir=out)
    assert succeeded(result.returncode, result.output, "AFTER-TRAINING"), result.output[-4000:]
    assert len(result.ranks) == 2
    return result, out / "run"


def test_the_record_is_complete_and_parseable(run: tuple[Launch, Path]) -> None:
    _, record = run
    for name in RUN_RECORD_FILES.values():
        assert (record / name).is_file(), name
    for name in ("config.json", "hyperparameters.json", "environment.json", "model_summary.json"):
        json.loads((record / name).read_text())
    environment = json.loads((record / "environment.json").read_text())
    assert environment["devices"]["num_processes"] == 2
    config = json.loads((record / "config.json").read_text())
    assert config["run_config"]["num_processes"] == 2
    assert json.loads((record / "hyperparameters.json").read_text()) == {"lr": 0.05, "seed": 0}
    assert not list(record.glob(".*"))  # no temporary file left behind


def test_written_once_by_the_main_process(run: tuple[Launch, Path]) -> None:
    result, record = run
    assert [rank["trackers"] for rank in result.ranks] == [1, 0]  # the main process's only
    assert [rank["trackers_after_finish"] for rank in result.ranks] == [0, 0]
    log = (record / "train.log").read_text().splitlines()
    assert [line.split(" INFO ", 1)[1].split("  ")[0] for line in log] == [
        f"run record: {record}",
        "training: 2 epochs, 8 updates, 8 samples per update (2 processes, float32)",
        "epoch 1/2",
        "epoch 2/2",
        "run completed at update 8",  # the outcome, last (outcome.json says the same)
    ]
    assert len(list((record / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert len(list(record.rglob("hparams.yml"))) == 1
    # the console: one line per epoch, from rank 0 only
    assert result.output.count("epoch 1/2  train_loss") == 1
    assert result.output.count("epoch 2/2  train_loss") == 1


def test_step_losses_are_over_both_processes(run: tuple[Launch, Path]) -> None:
    result, record = run
    epoch_losses = result.ranks[0]["train_loss_epoch"]
    with open(record / "metrics_steps.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == [4, 8]  # an interval is one epoch here
    assert [float(row["train_loss_step"]) for row in rows] == pytest.approx(epoch_losses)
    events = EventAccumulator(str(record / "tensorboard"))
    events.Reload()
    steps = [(event.step, event.value) for event in events.Scalars("train_loss_step")]
    assert steps == [(4, pytest.approx(epoch_losses[0])), (8, pytest.approx(epoch_losses[1]))]
    with open(record / "metrics.csv", newline="") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["1", "2"]

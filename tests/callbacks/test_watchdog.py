"""WatchdogCallback in one process: step times recorded, files placed, arguments checked.

The hang scenarios (a stopped process, one sleeping in a step, a blocked data-loader worker,
one process alone) end their job with ``os._exit``: they run in real processes, in
``tests/distributed/test_watchdog_2proc.py``.
"""

from __future__ import annotations

import csv
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, RunRecordCallback, WatchdogCallback


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pytorch_accel-watchdog")]


def test_a_healthy_run_records_step_times_and_leaves_no_thread(tmp_path: Path) -> None:
    watchdog = WatchdogCallback(timeout_s=60, directory=tmp_path / "watchdog")
    trainer = make_trainer(callbacks=(watchdog,))
    trainer.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    history = trainer.run_history
    assert history.get_metric_values("train_slowest_process") == [0, 0]
    assert history.get_metric_values("train_step_skew") == [1.0, 1.0]
    seconds = history.get_metric_values("train_step_seconds")
    assert len(seconds) == 2
    assert all(0 < value < 5 for value in seconds)
    assert watchdog_threads() == []
    assert list((tmp_path / "watchdog").iterdir()) == []  # its heartbeat is removed at the end
    trainer.train(make_regression_dataset(64), num_epochs=1, per_device_batch_size=4)
    assert watchdog_threads() == []
    trainer.evaluate(make_regression_dataset(16), per_device_batch_size=4)  # watched too
    assert watchdog_threads() == []


def test_it_changes_no_weight() -> None:
    watched = make_trainer(callbacks=(WatchdogCallback(timeout_s=60, step_times=False),))
    watched.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4, seed=1)
    plain = make_trainer()
    plain.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4, seed=1)
    assert "train_step_seconds" not in watched.run_history.get_metric_names()
    for a, b in zip(clone_params(watched.model), clone_params(plain.model), strict=True):
        assert torch.equal(a, b)


def test_heartbeats_go_under_the_run_directory_and_step_times_into_the_record(
    tmp_path: Path,
) -> None:
    seen: list[Path] = []

    class Look(WatchdogCallback):
        def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
            seen.extend(sorted(self.directory.iterdir()))
            super().on_train_epoch_end(trainer, **kwargs)

    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, Look(timeout_s=60), RunRecordCallback(log_with=())),
        output_dir=tmp_path,
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert trainer.run_dir is not None
    assert seen == [trainer.run_dir / "watchdog" / "heartbeat-rank0.json"]
    rows = list(csv.DictReader((trainer.run_dir / "metrics.csv").open()))
    assert float(rows[-1]["train_step_skew"]) == 1.0
    assert float(rows[-1]["train_slowest_process"]) == 0
    log = (trainer.run_dir / "train.log").read_text()
    assert "step times, epoch 1: slowest process 0 (" in log


def test_an_exception_stops_the_monitor() -> None:
    class Fails(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            raise ValueError("bad batch")

    model = make_model()
    trainer = Fails(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, WatchdogCallback(timeout_s=60)),
    )
    with pytest.raises(ValueError, match="bad batch"):
        trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert watchdog_threads() == []


def test_the_defaults() -> None:
    watchdog = WatchdogCallback()
    assert (watchdog.timeout_s, watchdog.heartbeat_s) == (600.0, 10.0)
    assert WatchdogCallback(timeout_s=3).heartbeat_s == 0.5
    assert watchdog.exit_code == WatchdogCallback.EXIT_CODE == 75


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"timeout_s": 0}, ValueError, r"timeout_s must be a finite number > 0, got 0 \(int\)"),
        ({"timeout_s": -5.0}, ValueError, r"timeout_s must be a finite number > 0, got -5.0"),
        ({"timeout_s": float("inf")}, ValueError, "timeout_s must be a finite number > 0"),
        ({"timeout_s": float("nan")}, ValueError, "timeout_s must be a finite number > 0"),
        ({"timeout_s": "60"}, TypeError, r"timeout_s must be .*got '60' \(str\)"),
        ({"timeout_s": True}, TypeError, r"timeout_s must be .*got True \(bool\)"),
        ({"timeout_s": 5, "heartbeat_s": 5}, ValueError, r"heartbeat_s must be a number below"),
        ({"heartbeat_s": 0}, ValueError, r"heartbeat_s must be a number > 0 or None, got 0"),
        ({"exit_code": 0}, ValueError, r"exit_code must be an int >= 1, got 0"),
        ({"exit_code": 256}, ValueError, r"exit_code must be an int in 1..255, got 256"),
        ({"exit_code": 1.5}, TypeError, r"exit_code must be an int >= 1, got 1.5"),
        ({"step_times": "yes"}, TypeError, r"step_times must be a bool, got 'yes'"),
        ({"directory": 3}, TypeError, r"directory must be a directory path, got 3"),
    ],
)
def test_bad_arguments_are_refused_clearly(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=rf"WatchdogCallback: {match}"):
        WatchdogCallback(**kwargs)

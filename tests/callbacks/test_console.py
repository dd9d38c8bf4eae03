"""The console: the run's position and time to go, the setup announced, numbers to 4 digits."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import EarlyStoppingCallback, PrintProgressCallback, TrainerCallback
from pytorch_accel.default_callbacks import format_duration


def console_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "pytorch_accel"]


class SlowEpochs(TrainerCallback):
    """Each training epoch takes at least ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def test_epoch_lines_say_how_long_the_run_has_to_go(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(PrintProgressCallback, SlowEpochs(0.2)),
    )
    trainer.train(make_regression_dataset(8), num_epochs=3, per_device_batch_size=4)
    epochs = [line for line in console_lines(caplog) if line.startswith("epoch")]
    times = [line.rsplit("  (", 1)[1] for line in epochs]
    first_to_go = float(times[0].split(", ")[1].split(" s to go")[0])
    assert 0.4 <= first_to_go < 2.0  # two more epochs of about 0.2 s each
    assert times[1].endswith(" s to go)")
    assert "to go" not in times[2]  # the last epoch


def test_the_start_names_processes_and_the_precision_in_effect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(PrintProgressCallback,),
        accelerator_kwargs={"mixed_precision": "bf16"},  # set past train()'s own arguments
    )
    trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
    assert console_lines(caplog)[0] == (
        "training: 1 epoch, 2 updates, 4 samples per update "
        "(1 process, bf16 mixed precision, float32 weights)"
    )


def test_durations_read_as_minutes_and_hours() -> None:
    assert format_duration(9.64) == "9.6 s"
    assert format_duration(125.2) == "2 min 05 s"
    assert format_duration(3725) == "1 h 02 min 05 s"


class RecordsFloat32(TrainerCallback):
    """Records a float32 metric that is not exactly representable (1/3 as a float32)."""

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.run_history.update_metric("score", torch.tensor(1 / 3).item())


def test_early_stopping_prints_4_significant_digits(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(
            RecordsFloat32(),
            EarlyStoppingCallback(
                watch_metric="score", early_stopping_patience=1, greater_is_better=False
            ),
        ),
    )
    trainer.train(make_regression_dataset(8), num_epochs=3, per_device_batch_size=4)
    assert "score = 0.3333 is no improvement on 0.3333 (epoch 1)" in caplog.text
    assert "0.33333" not in caplog.text

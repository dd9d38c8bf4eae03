"""The default callbacks, each in real training runs."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from helpers import RecordingCallback, make_model, make_regression_dataset, make_trainer
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
    get_default_callbacks,
)


def test_default_callbacks_are_the_documented_classes() -> None:
    assert (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        LogMetricsCallback,
    ) == DEFAULT_CALLBACKS
    assert ProgressBarCallback not in get_default_callbacks(progress_bar=False)
    first, second = (
        make_trainer(callbacks=DEFAULT_CALLBACKS),
        make_trainer(callbacks=DEFAULT_CALLBACKS),
    )
    assert not set(map(id, first.callback_handler)) & set(map(id, second.callback_handler))


def test_default_callbacks_survive_two_train_calls_and_evaluate(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05))
    trainer.train(
        make_regression_dataset(16), num_epochs=2, eval_dataset=make_regression_dataset(8)
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, reset_run_history=False)
    trainer.evaluate(make_regression_dataset(8))
    lines = [record.getMessage() for record in caplog.records if record.name == "pytorch_accel"]
    history = trainer.run_history
    train_losses = history.get_metric_values("train_loss_epoch")
    eval_losses = history.get_metric_values("eval_loss_epoch")
    assert [line.rsplit("  (", 1)[0] for line in lines] == [
        "training: 2 epochs, 4 updates, 8 samples per update (1 process, float32)",
        f"epoch 1/2  train_loss {train_losses[0]:.4g}  eval_loss {eval_losses[0]:.4g}",
        f"epoch 2/2  train_loss {train_losses[1]:.4g}  eval_loss {eval_losses[1]:.4g}",
        # epochs continue the history:
        "training: 1 epoch, 2 updates, 8 samples per update (1 process, float32)",
        f"epoch 3/3  train_loss {train_losses[2]:.4g}",
        f"evaluation  evaluation_loss {history.get_latest_metric('evaluation_loss'):.4g}",
    ]
    ends = (" s)", " s to go)")
    assert all(line.endswith(ends) for line in lines if line.startswith(("epoch", "eval")))
    assert capsys.readouterr().err == ""  # no progress bar where stderr is not a terminal


class DeviceRecordingLoss(nn.Module):
    """A loss with a buffer that notes which device it was moved to."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(1))
        self.moved_to: list[torch.device] = []

    def _apply(self, fn: Any, recurse: bool = True) -> DeviceRecordingLoss:
        result = super()._apply(fn, recurse)
        self.moved_to.append(self.weight.device)
        return result

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (self.weight * (predictions - targets) ** 2).mean()


def test_move_modules_to_device_moves_public_modules_but_not_the_model() -> None:
    model = make_model()
    loss = DeviceRecordingLoss()
    trainer = Trainer(
        model,
        loss,
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(MoveModulesToDeviceCallback,),
    )
    trainer.train(make_regression_dataset(8), num_epochs=1)
    trainer.evaluate(make_regression_dataset(8))
    assert loss.moved_to == [trainer.device, trainer.device]


class NaNAfter(nn.Module):
    """MSE, but NaN from the given call on."""

    def __init__(self, first_nan_call: int) -> None:
        super().__init__()
        self.calls, self.first_nan_call = 0, first_nan_call

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.mse_loss(predictions, targets)
        return loss * math.nan if self.calls >= self.first_nan_call else loss


def test_terminate_on_nan_stops_at_the_end_of_the_bad_epoch() -> None:
    recorder = RecordingCallback()
    model = make_model()
    trainer = Trainer(
        model,
        NaNAfter(first_nan_call=6),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(TerminateOnNaNCallback(), recorder),
    )
    trainer.train(make_regression_dataset(16), num_epochs=5, per_device_batch_size=4)
    assert recorder.events.count("on_train_epoch_start") == 2  # batch 6 is in epoch 2
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]
    assert math.isnan(trainer.run_history.get_latest_metric("train_loss_epoch"))


def test_terminate_on_nan_every_n_steps_stops_within_n_steps() -> None:
    recorder = RecordingCallback()
    model = make_model()
    trainer = Trainer(
        model,
        NaNAfter(first_nan_call=3),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(TerminateOnNaNCallback(check_every_n_steps=2), recorder),
    )
    trainer.train(make_regression_dataset(40), num_epochs=1, per_device_batch_size=4)
    assert recorder.events.count("on_train_step_start") == 4  # NaN at step 3, seen at step 4
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]


def test_terminate_on_nan_rejects_a_bad_interval() -> None:
    with pytest.raises(
        ValueError, match=r"check_every_n_steps must be a positive int or None, got 0"
    ):
        TerminateOnNaNCallback(check_every_n_steps=0)


def test_progress_bar_counts_steps_on_the_main_process(capsys: pytest.CaptureFixture[str]) -> None:
    bar = ProgressBarCallback(show=True)
    trainer = make_trainer(callbacks=(bar,))
    trainer.train(
        make_regression_dataset(24), num_epochs=1, eval_dataset=make_regression_dataset(8)
    )
    assert (bar.pbar.n, bar.pbar.total, bar.eval_pbar.n, bar.eval_pbar.total) == (3, 3, 1, 1)
    err = capsys.readouterr().err
    assert "train 1/1:" in err  # the run's epoch, of its epochs
    assert "eval:" in err
    assert err.endswith("\r")  # the bars are cleared when their epoch ends (leave=False)


def test_progress_bar_rejects_a_bad_show() -> None:
    with pytest.raises(TypeError, match=r"show must be None, True or False, got 'yes'"):
        ProgressBarCallback(show="yes")  # type: ignore[arg-type]


def test_log_metrics_logs_each_metric_once_at_the_end_of_its_phase() -> None:
    logged: list[tuple[str, list[str]]] = []

    class Capture(LogMetricsCallback):
        def __init__(self) -> None:
            super().__init__()
            self.phase = ""

        def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.phase = "train"
            super().on_train_epoch_end(trainer, **kwargs)

        def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.phase = "eval"
            super().on_eval_epoch_end(trainer, **kwargs)

        def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.phase = "run_epoch"
            super().on_training_run_epoch_end(trainer, **kwargs)

        def log_metrics(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
            logged.append((self.phase, sorted(metrics)))

    class Accuracy(TrainerCallback):
        def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.run_history.update_metric("accuracy", 0.5)

        def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.run_history.update_metric("best_accuracy", 0.5)

    trainer = make_trainer(callbacks=(Capture(), Accuracy()))
    trainer.train(make_regression_dataset(8), num_epochs=2, eval_dataset=make_regression_dataset(8))
    epoch = [
        ("train", ["train_loss_epoch"]),
        ("eval", ["accuracy", "eval_loss_epoch"]),
        ("run_epoch", ["best_accuracy"]),
    ]
    assert logged == epoch * 2


def test_callbacks_that_print_nothing_are_pointed_out_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytorch_accel import default_callbacks as defaults
    from pytorch_accel.callbacks import EarlyStoppingCallback

    monkeypatch.setattr(defaults, "_said_silent", False)
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        make_trainer(callbacks=())  # deliberate silence: nothing said
        assert "replace DEFAULT_CALLBACKS" not in caplog.text
        make_trainer(callbacks=(*DEFAULT_CALLBACKS, EarlyStoppingCallback()))
        assert "replace DEFAULT_CALLBACKS" not in caplog.text
        make_trainer(callbacks=(EarlyStoppingCallback(),))
        make_trainer(callbacks=(EarlyStoppingCallback,))
    said = [r.message for r in caplog.records if "replace DEFAULT_CALLBACKS" in r.message]
    assert said == [
        "Trainer: the callbacks given replace DEFAULT_CALLBACKS, so nothing prints the run's "
        "progress or metrics. To keep them, pass callbacks=(*DEFAULT_CALLBACKS, "
        "EarlyStoppingCallback(...)). (Said once.)"
    ]

"""EarlyStoppingCallback in real training runs: threshold semantics, patience, errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
from helpers import RecordingCallback, make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
from pytorch_accel.tracking import MetricNotFoundError

TRAIN, EVAL = make_regression_dataset(16), make_regression_dataset(8, seed=1)


class ScriptedMetric(TrainerCallback):
    """Records the next scripted value of ``score`` at each epoch end (None: records nothing)."""

    may_stop_training = False

    def __init__(self, values: list[float | None], name: str = "score") -> None:
        self.values, self.name = list(values), name

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        value = self.values.pop(0)
        if value is not None:
            trainer.run_history.update_metric(self.name, value)


def epochs_run(values: list[float | None], **options: Any) -> tuple[int, EarlyStoppingCallback]:
    """Train with a scripted ``score`` for up to len(values) epochs; return epochs completed."""
    stopper = EarlyStoppingCallback(watch_metric="score", **options)
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(ScriptedMetric(values), stopper, recorder))
    trainer.train(TRAIN, num_epochs=len(values), per_device_batch_size=8)
    return recorder.events.count("on_training_run_epoch_end"), stopper


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"early_stopping_patience": 0}, ValueError, r"early_stopping_patience must be a positive"),
        (
            {"early_stopping_patience": 1.5},
            TypeError,
            r"early_stopping_patience must be a positive",
        ),
        (
            {"early_stopping_threshold": -0.1},
            ValueError,
            r"early_stopping_threshold must be a finite number >= 0",
        ),
        (
            {"early_stopping_threshold": math.nan},
            ValueError,
            r"early_stopping_threshold must be a finite number",
        ),
        (
            {"early_stopping_threshold": "0.1"},
            TypeError,
            r"early_stopping_threshold must be a finite number",
        ),
        ({"watch_metric": ""}, ValueError, r"watch_metric must be a non-empty metric name"),
        ({"watch_metric": 3}, TypeError, r"watch_metric must be a non-empty metric name"),
        ({"greater_is_better": "yes"}, TypeError, r"greater_is_better must be a bool"),
        ({"reset_on_train": None}, TypeError, r"reset_on_train must be a bool"),
    ],
)
def test_constructor_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=r"^EarlyStoppingCallback: " + match):
        EarlyStoppingCallback(**kwargs)


def test_threshold_is_absolute_and_strict_against_the_last_improvement() -> None:
    # best 1.0 -> 0.5 (improvement); 0.495 is not < 0.49; 0.4899 is (small steps add up).
    completed, stopper = epochs_run(
        [1.0, 0.5, 0.495, 0.4899, 0.48, 0.4805, 0.1], early_stopping_patience=2
    )
    assert completed == 6  # 0.48 and 0.4805 are not below 0.4899 - 0.01: stop after 2 epochs
    assert stopper.best_metric == 0.4899
    assert stopper.best_metric_epoch == 4
    assert stopper.early_stopping_patience_counter == 2


def test_stops_after_patience_epochs_without_improvement() -> None:
    completed, stopper = epochs_run([1.0, 0.9, 0.995, 0.95, 0.5, 0.1], early_stopping_patience=2)
    assert completed == 4
    assert (stopper.best_metric, stopper.early_stopping_patience_counter) == (0.9, 2)


def test_greater_is_better_and_zero_threshold() -> None:
    completed, stopper = epochs_run(
        [0.5, 0.6, 0.6, 0.61, 0.6], greater_is_better=True, early_stopping_threshold=0
    )
    assert completed == 3  # the tie at epoch 3 is no improvement; patience 1
    assert stopper.best_metric == 0.6


def test_nan_is_never_an_improvement() -> None:
    completed, _ = epochs_run([math.nan, 1.0, math.nan, 0.5], early_stopping_patience=1)
    assert completed == 1


def test_a_metric_not_recorded_again_is_not_compared(caplog: pytest.LogCaptureFixture) -> None:
    completed, stopper = epochs_run([1.0, None, 0.5, None, 0.495], early_stopping_patience=1)
    assert completed == 5
    assert (stopper.best_metric, stopper.early_stopping_patience_counter) == (0.5, 1)
    assert caplog.text.count("score has no new value in epoch") == 2


def test_stops_a_real_run_whose_eval_loss_does_not_improve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(lr=0.0, callbacks=(EarlyStoppingCallback(), recorder))
    trainer.train(TRAIN, num_epochs=5, eval_dataset=EVAL, per_device_batch_size=8)
    assert recorder.events.count("on_training_run_epoch_end") == 2
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]
    out = caplog.text
    assert "1/1 epochs without improvement" in out
    assert "Stopping training early: eval_loss_epoch has not improved by more than 0.01" in out


def test_an_improving_run_is_not_stopped() -> None:
    recorder = RecordingCallback()
    stopper = EarlyStoppingCallback(early_stopping_threshold=0.0)
    trainer = make_trainer(lr=0.02, callbacks=(stopper, recorder))
    trainer.train(make_regression_dataset(64), num_epochs=3, eval_dataset=EVAL)
    assert recorder.events.count("on_training_run_epoch_end") == 3
    assert stopper.best_metric == trainer.run_history.get_latest_metric("eval_loss_epoch")


def test_runs_after_the_logger_so_the_last_epoch_is_seen_by_everyone() -> None:
    seen: list[int] = []

    class Late(TrainerCallback):
        order = 100

        def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            seen.append(trainer.run_history.current_epoch)

    trainer = make_trainer(lr=0.0, callbacks=(EarlyStoppingCallback(), Late()))
    trainer.train(TRAIN, num_epochs=5, eval_dataset=EVAL, per_device_batch_size=8)
    assert seen == [1, 2]


def test_missing_metric_names_the_recorded_ones() -> None:
    trainer = make_trainer(callbacks=(EarlyStoppingCallback(watch_metric="accuracy"),))
    with pytest.raises(
        MetricNotFoundError,
        match=r"watch_metric 'accuracy' has not been recorded by the end of epoch 1\. "
        r"Recorded metrics: eval_loss_epoch, train_loss_epoch\.",
    ):
        trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=8)


def test_watching_the_eval_loss_without_an_eval_set_fails_before_training() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(EarlyStoppingCallback(), recorder))
    with pytest.raises(ValueError, match=r"It is recorded only with an eval set"):
        trainer.train(TRAIN, num_epochs=2, per_device_batch_size=8)
    assert "on_train_epoch_start" not in recorder.events


@pytest.mark.parametrize(("reset_on_train", "second_run_epochs"), [(True, 3), (False, 1)])
def test_reset_on_train(reset_on_train: bool, second_run_epochs: int) -> None:
    stopper = EarlyStoppingCallback(
        watch_metric="score", early_stopping_patience=1, reset_on_train=reset_on_train
    )
    scripted = ScriptedMetric([0.1, 0.05, 0.5, 0.4, 0.3])
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(scripted, stopper, recorder))
    trainer.train(TRAIN, num_epochs=2, per_device_batch_size=8)
    trainer.train(TRAIN, num_epochs=3, per_device_batch_size=8)
    assert recorder.events.count("on_training_run_epoch_end") == 2 + second_run_epochs

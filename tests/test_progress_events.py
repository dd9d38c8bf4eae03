"""Progress events: when they fire, what they carry, and what a listener may not do."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback


class ProgressRecorder(TrainerCallback):
    """Records step ends, progress events (with ``steps_done``) and epoch ends, in order."""

    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep
        self.events: list[str] = []

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        time.sleep(self.sleep)
        self.events.append("step")

    def on_train_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        self.events.append(f"progress {steps_done}")

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append("epoch end")

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append("eval step")

    def on_eval_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        self.events.append(f"eval progress {steps_done}")

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append("eval epoch end")

    @property
    def train_counts(self) -> list[int]:
        return [int(event.split()[-1]) for event in self.events if event.startswith("progress")]


def recorded_run(
    interval: float, train_samples: int, *callbacks: TrainerCallback, **train: Any
) -> ProgressRecorder:
    recorder = ProgressRecorder()
    trainer = make_trainer(callbacks=(*callbacks, recorder))
    trainer.progress_interval = interval
    trainer.train(make_regression_dataset(train_samples), per_device_batch_size=4, **train)
    return recorder


def test_an_interval_of_zero_reports_after_every_step_and_before_each_epoch_end() -> None:
    recorder = recorded_run(0, 12, num_epochs=1, eval_dataset=make_regression_dataset(8))
    assert recorder.events == [
        *("step", "progress 1", "step", "progress 2", "step", "progress 3"),
        "epoch end",
        *("eval step", "eval progress 1", "eval step", "eval progress 2"),
        "eval epoch end",
    ]


def test_fast_steps_are_reported_in_doubling_strides_and_the_last_count_is_exact() -> None:
    recorder = recorded_run(math.inf, 40, num_epochs=2)  # every event counts as fast
    assert recorder.train_counts == [1, 2, 4, 8, 10] * 2
    first_epoch = recorder.events[: recorder.events.index("epoch end") + 1]
    assert first_epoch[-3:] == ["step", "progress 10", "epoch end"]


def test_slow_steps_are_reported_one_by_one() -> None:
    recorder = ProgressRecorder(sleep=0.06)  # slower than the default 0.05 s
    trainer = make_trainer(callbacks=(recorder,))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert recorder.train_counts == [1, 2, 3, 4]


def test_default_interval_reports_a_fast_epoch_in_few_events() -> None:
    recorder = ProgressRecorder()
    trainer = make_trainer(callbacks=(recorder,))
    trainer.train(make_regression_dataset(1024), num_epochs=1, per_device_batch_size=4)
    counts = recorder.train_counts
    assert counts[0] == 1
    assert counts[-1] == 256
    assert counts == sorted(set(counts))
    assert len(counts) < 64  # 256 steps of a tiny model take well under a second


class StopAtSecondStep(TrainerCallback):
    def on_train_step_end(self, trainer: Trainer, step: int, **kwargs: Any) -> None:
        if step == 1:
            raise StopTrainingError("")


def test_a_stop_still_reports_the_steps_done_before_the_epoch_ends() -> None:
    recorder = recorded_run(math.inf, 40, StopAtSecondStep(), num_epochs=1)
    assert recorder.events == ["step", "progress 1", "step", "progress 2", "epoch end"]


def test_limits_end_the_count_at_the_last_step_taken() -> None:
    by_updates = recorded_run(math.inf, 40, num_epochs=1, max_num_train_steps=7)
    assert by_updates.train_counts == [1, 2, 4, 7]
    recorder = ProgressRecorder()
    trainer = make_trainer(callbacks=(recorder,))
    trainer.progress_interval = math.inf
    trainer.limit_train_batches = 3
    trainer.train(make_regression_dataset(40), num_epochs=1, per_device_batch_size=4)
    assert recorder.train_counts == [1, 2, 3]


class SaveThenStop(TrainerCallback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_step_end(self, trainer: Trainer, step: int, **kwargs: Any) -> None:
        if step == 5:
            trainer.save_training_state(self.path)
            raise StopTrainingError("")


def test_a_resumed_epoch_counts_the_steps_it_skipped(tmp_path: Path) -> None:
    dataset = make_regression_dataset(40)
    make_trainer(callbacks=(SaveThenStop(tmp_path / "state"),)).train(
        dataset, num_epochs=1, per_device_batch_size=4
    )
    recorder = ProgressRecorder()
    resumed = make_trainer(callbacks=(recorder,))
    resumed.progress_interval = 0
    resumed.train(dataset, num_epochs=1, per_device_batch_size=4, resume_from=tmp_path / "state")
    assert recorder.train_counts == [7, 8, 9, 10]


class StopsOnProgress(TrainerCallback):
    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        raise StopTrainingError("")


def test_stopping_from_a_progress_event_names_the_step_event_to_use() -> None:
    trainer = make_trainer(callbacks=(StopsOnProgress(),))
    expected = r"on_train_progress may not stop training.* from on_train_step_end instead"
    with pytest.raises(RuntimeError, match=expected):
        trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)


class SavesOnProgress(TrainerCallback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.save_training_state(self.path)


def test_a_training_state_cannot_be_saved_from_a_progress_event(tmp_path: Path) -> None:
    trainer = make_trainer(callbacks=(SavesOnProgress(tmp_path / "state"),))
    with pytest.raises(RuntimeError, match=r"can only be saved between steps"):
        trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("fast", TypeError, r"progress_interval must be a number >= 0, got 'fast' \(str\)"),
        (-1.0, ValueError, r"progress_interval must be a number >= 0, got -1.0"),
        (math.nan, ValueError, r"progress_interval must be a number >= 0, got nan"),
    ],
)
def test_a_bad_progress_interval_is_named_at_train_and_evaluate(
    value: object, error: type[Exception], message: str
) -> None:
    trainer = make_trainer()
    trainer.progress_interval = value  # type: ignore[assignment]
    with pytest.raises(error, match=r"Trainer.train: trainer\." + message):
        trainer.train(make_regression_dataset(8), num_epochs=1)
    with pytest.raises(error, match=r"Trainer.evaluate: trainer\." + message):
        trainer.evaluate(make_regression_dataset(8))

"""Runs made of several train() calls (stages), and resuming a finished run for more epochs.

One run, continued with ``reset_run_history=False``: one update count for the step curves
(``trainer.global_num_updates``), one step CSV, one tracker run; the best-model callback never
hands back an earlier stage's weights; a length-bound scheduler (``OneCycleLR``) resumed for
more epochs continues with the longer run's schedule.
"""

from __future__ import annotations

import csv
import functools
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR

from pytorch_accel import Trainer, TrainerPlaceholderValues
from pytorch_accel.callbacks import (
    RunRecordCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    StepLoggingCallback,
    TrackingCallback,
    TrainerCallback,
)
from pytorch_accel.callbacks._metrics_csv import read_metrics_csv
from pytorch_accel.placeholders import TrainerPlaceholderValues as Placeholders

TRAIN, EVAL = make_regression_dataset(32), make_regression_dataset(8, seed=1)
STAGE = {"num_epochs": 2, "per_device_batch_size": 8, "eval_dataset": EVAL}  # 4 updates/epoch


class ScriptedScore(TrainerCallback):
    """Records the next scripted ``score`` at each epoch end; keeps each epoch's weights."""

    may_stop_training = False

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        trainer.run_history.update_metric("score", self.values.pop(0))
        state = trainer.get_model().state_dict()
        self.weights[epoch] = {name: tensor.clone() for name, tensor in state.items()}


def step_column(path: Path) -> list[int]:
    with open(path, newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


def scalar_steps(run_dir: Path, tag: str) -> list[int]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def assert_weights(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    actual = model.state_dict()
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        assert torch.equal(tensor, expected[name]), name


def test_a_three_stage_run_is_one_step_series_and_ends_with_the_last_stage_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The progressive-resizing scenario: 3 calls, reset_run_history=False, SaveBest."""
    scores = ScriptedScore([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # stage 1's first epoch is best
    saver = SaveBestModelCallback(
        tmp_path / "best.pt", watch_metric="score", greater_is_better=False, reset_on_train=False
    )
    tracking = TrackingCallback(
        logging_dir=tmp_path / "runs",
        csv_path=tmp_path / "metrics.csv",
        project_name="stages",
        log_every_n_updates=3,
    )
    trainer = make_trainer(callbacks=(scores, saver, tracking))
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        for stage in range(3):
            trainer.train(TRAIN, reset_run_history=stage == 0, **STAGE)

    # every stage's logging points, once each, on one axis: multiples of 3 and each call's end
    expected = [3, 6, 8, 9, 12, 15, 16, 18, 21, 24]
    assert step_column(tmp_path / "metrics_steps.csv") == expected
    run_dir = tmp_path / "runs" / "stages"
    assert scalar_steps(run_dir, "train_loss_step") == expected
    assert scalar_steps(run_dir, "train_loss_epoch") == [4, 8, 12, 16, 20, 24]  # updates
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # one tracker run
    assert len(list(run_dir.rglob("hparams.yml"))) == 1

    # the best (epoch 1) is from stage 1: the final model is stage 3's, and the log says so
    assert saver.best_metric_epoch == 1
    assert_weights(trainer.get_model(), scores.weights[6])
    assert "is from an earlier train() call" in caplog.text
    assert (trainer.num_updates, trainer.global_num_updates) == (8, 24)  # per call; the run's
    tracking.finish()


def test_a_new_run_restarts_the_count_the_step_file_and_the_tracker_run(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "metrics.csv", log_every_n_updates=3
    )
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(TRAIN, **STAGE)
    trainer.train(TRAIN, reset_run_history=False, **STAGE)
    assert trainer.global_num_updates == 16
    trainer.train(TRAIN, **STAGE)  # reset_run_history=True: a new run
    assert (trainer.num_updates, trainer.global_num_updates) == (8, 8)
    assert step_column(tmp_path / "metrics_steps.csv") == [3, 6, 8]


def test_one_tracker_run_per_run_across_train_and_evaluate_calls() -> None:
    from accelerate.tracking import GeneralTracker

    class Recording(GeneralTracker):
        name, requires_logging_directory = "recording", False

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        @property
        def tracker(self) -> None:
            return None

        def start(self) -> None:
            self.calls.append("start")

        def store_init_configuration(self, values: dict[str, Any]) -> None:
            self.calls.append("config")

        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.calls.append("log")

        def finish(self) -> None:
            self.calls.append("finish")

    tracker = Recording()
    tracking = TrackingCallback(log_with=(tracker,), csv_path=None)
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(TRAIN, **STAGE)
    trainer.evaluate(EVAL)
    trainer.train(TRAIN, reset_run_history=False, **STAGE)
    trainer.evaluate(EVAL)
    assert tracker.calls.count("start") == 1
    assert "finish" not in tracker.calls
    trainer.train(TRAIN, **STAGE)  # a new run: a new tracker run
    assert tracker.calls.count("start") == 2
    assert tracker.calls.count("finish") == 1
    other = make_trainer(callbacks=(TrackingCallback(log_with=(), csv_path=None),))
    other_tracker = Recording()
    other.callback_handler.callbacks[0].log_with = (other_tracker,)
    other.train(TRAIN, **STAGE)  # another trainer's run: W&B and MLflow have one at a time
    assert tracker.calls.count("finish") == 2
    tracking.finish()
    assert tracker.calls.count("finish") == 2  # nothing left open


def test_the_run_count_is_saved_in_training_states(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.train(TRAIN, **STAGE)
    trainer.train(TRAIN, reset_run_history=False, **STAGE)
    trainer.save_training_state(tmp_path / "state")
    resumed = make_trainer()
    resumed.train(TRAIN, num_epochs=3, per_device_batch_size=8, resume_from=tmp_path / "state")
    assert (resumed.num_updates, resumed.global_num_updates) == (12, 20)
    loaded = make_trainer()
    loaded.load_training_state(tmp_path / "state")
    assert loaded.global_num_updates == 16
    loaded.train(TRAIN, reset_run_history=False, **STAGE)
    assert loaded.global_num_updates == 24


def test_a_dry_run_between_stages_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        logging_dir=tmp_path / "runs", csv_path=tmp_path / "metrics.csv", log_every_n_updates=3
    )
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(TRAIN, **STAGE)
    trainer.train(TRAIN, reset_run_history=False, dry_run=True, **STAGE)
    assert trainer.global_num_updates == 8  # num_updates: the dry run's
    trainer.train(TRAIN, reset_run_history=False, **STAGE)
    assert trainer.global_num_updates == 16
    tracking.finish()
    assert step_column(tmp_path / "metrics_steps.csv") == [3, 6, 8, 9, 12, 15, 16]
    with open(tmp_path / "metrics.csv", newline="") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["1", "2", "3", "4"]
    run_dir = tmp_path / "runs" / "pytorch-accel"
    assert scalar_steps(run_dir, "train_loss_step") == [3, 6, 8, 9, 12, 15, 16]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1


class LastLr(StepLoggingCallback):
    """Keeps the logged points, and the learning rate each update used."""

    def __init__(self) -> None:
        super().__init__(log_every_n_updates=5)
        self.points: list[tuple[int, float]] = []
        self.used: list[float] = []

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        super().on_optimizer_step_start(trainer)
        self.used.append(trainer.optimizer.param_groups[0]["lr"])

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.points.append((step, metrics["lr"]))


def test_the_last_lr_point_is_what_the_last_update_used(tmp_path: Path) -> None:
    """Read at the run's end, after the scheduler's step and the best checkpoint's reload."""
    logged = LastLr()
    saver = SaveBestModelCallback(
        tmp_path / "best.pt", watch_metric="score", greater_is_better=True
    )
    scores = ScriptedScore([2.0, 1.0])  # epoch 1 is best: its optimizer (lr) is reloaded
    trainer = make_trainer(callbacks=(scores, saver, logged))
    halving = functools.partial(LambdaLR, lr_lambda=lambda update: 0.5**update)
    trainer.train(TRAIN, create_scheduler_fn=halving, **STAGE)
    assert [step for step, _ in logged.points] == [5, 8]
    assert logged.points == [(5, logged.used[4]), (8, logged.used[7])]
    assert logged.used[7] == 0.05 * 0.5**7


@pytest.mark.filterwarnings("ignore:The training state .* has no per-process state")
def test_a_finished_one_cycle_run_resumed_for_more_epochs_follows_the_longer_schedule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one_cycle = functools.partial(
        OneCycleLR,
        max_lr=0.05,
        epochs=Placeholders.NUM_EPOCHS,
        steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
    )
    first = make_trainer()
    first.train(TRAIN, num_epochs=2, per_device_batch_size=8, create_scheduler_fn=one_cycle)
    first.save_training_state(tmp_path / "finished")

    resumed = LastLr()
    trainer = make_trainer(callbacks=(resumed,))
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        trainer.train(
            TRAIN,
            num_epochs=4,
            per_device_batch_size=8,
            create_scheduler_fn=one_cycle,
            resume_from=tmp_path / "finished",
        )
    assert trainer.num_updates == 16
    assert "was built for 8 updates; this run has 16" in caplog.text
    # updates 9 to 16 use the rates of a 16-update cycle, as a 4-epoch run from the start
    longer = LastLr()
    reference = make_trainer(callbacks=(longer,))
    reference.train(TRAIN, num_epochs=4, per_device_batch_size=8, create_scheduler_fn=one_cycle)
    assert resumed.used == pytest.approx(longer.used[8:], rel=1e-12)


def test_epoch_metrics_can_share_the_step_metrics_axis(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        logging_dir=tmp_path / "runs",
        csv_path=tmp_path / "metrics.csv",
        project_name="axis",
        log_every_n_updates=3,
        epoch_x_axis="update",
    )
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(TRAIN, **STAGE)
    trainer.train(TRAIN, reset_run_history=False, **STAGE)
    trainer.evaluate(EVAL)
    tracking.finish()
    run_dir = tmp_path / "runs" / "axis"
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert scalar_steps(run_dir, name) == [4, 8, 12, 16]  # the update at each epoch's end
    assert scalar_steps(run_dir, "evaluation_loss") == [16]
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["epoch"], row["update"]) for row in rows] == [
        ("1", "4"),
        ("2", "8"),
        ("3", "12"),
        ("4", "16"),
    ]
    assert "update" not in read_metrics_csv(tmp_path / "metrics.csv")  # not a metric to plot
    with pytest.raises(ValueError, match=r"epoch_x_axis.*'epoch' or 'update'"):
        TrackingCallback(epoch_x_axis="step")


class KillAtRunUpdate(TrainerCallback):
    """Raise (as a killed process would stop) at the run's update ``update``."""

    def __init__(self, update: int) -> None:
        self.update = update

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: object) -> None:
        if trainer.global_num_updates == self.update:
            raise RuntimeError("killed")


def train_two_stages(directory: Path, *extra: TrainerCallback, resume: bool = False) -> Trainer:
    """Stage 1 (8 updates) then stage 2 (8 more), a step row every update; states every 3."""
    record = RunRecordCallback(directory / "run", log_every_n_updates=1, plot=False)
    states = SaveTrainingStateCallback(directory / "states", save_every_n_steps=3)
    trainer = make_trainer(callbacks=(record, states, *extra))
    if not resume:
        trainer.train(TRAIN, **STAGE)
    stage_2 = {"resume_from": "latest"} if resume else {}
    trainer.train(TRAIN, reset_run_history=False, **STAGE, **stage_2)  # type: ignore[arg-type]
    record.finish()
    return trainer


def test_a_resumed_stage_continues_the_run_s_files_and_axis(tmp_path: Path) -> None:
    train_two_stages(tmp_path / "whole")
    with pytest.raises(RuntimeError, match="killed"):
        train_two_stages(tmp_path, KillAtRunUpdate(14))  # stage 2's last state: run update 11
    trainer = train_two_stages(tmp_path, resume=True)  # a fresh trainer, as a new process
    assert (trainer.num_updates, trainer.global_num_updates) == (8, 16)
    run = tmp_path / "run"
    assert step_column(run / "metrics_steps.csv") == list(range(1, 17))
    assert scalar_steps(run / "tensorboard", "train_loss_step") == list(range(1, 17))
    with open(run / "metrics_steps.csv", newline="") as resumed_file:
        resumed = [row["train_loss_step"] for row in csv.DictReader(resumed_file)]
    with open(tmp_path / "whole" / "run" / "metrics_steps.csv", newline="") as whole_file:
        whole = [row["train_loss_step"] for row in csv.DictReader(whole_file)]
    assert resumed == whole  # an exact resume, on the run's axis


def test_training_states_are_named_by_the_run_s_update_count(tmp_path: Path) -> None:
    states = SaveTrainingStateCallback(tmp_path, save_every_n_steps=3, save_at_end=False)
    trainer = make_trainer(callbacks=(states,))
    trainer.train(TRAIN, **STAGE)
    trainer.train(TRAIN, reset_run_history=False, **STAGE)  # stage 2 replaces none of stage 1's
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [f"updates-{n:08d}" for n in (3, 6, 9, 12, 15)]

"""Step-level logging in real runs: TensorBoard and CSV series read back, values, host reads."""

from __future__ import annotations

import csv
import functools
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from host_reads import HostReads
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback
from pytorch_accel.callbacks.step_logging import StepLoggingCallback
from pytorch_accel.callbacks.trackers import TrackingCallback


class BatchLosses(TrainerCallback):
    """Records each step's loss and the update count after it (read outside any count)."""

    order = 20_000

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.updates: list[int] = []

    def on_train_step_end(
        self, trainer: Trainer, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        self.losses.append(float(batch_output["loss"].detach()))
        self.updates.append(trainer.num_updates)


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def interval_means(losses: list[float], updates: list[int], points: list[int]) -> list[float]:
    """The mean batch loss of the steps between consecutive logging points (equal batches)."""
    means, start = [], 0
    for point in points:
        end = max(index for index, update in enumerate(updates) if update <= point) + 1
        means.append(sum(losses[start:end]) / (end - start))
        start = end
    return means


def test_tensorboard_gets_per_step_loss_and_lr_at_the_update_counts(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        logging_dir=tmp_path / "runs", csv_path=tmp_path / "metrics.csv", log_every_n_updates=5
    )
    recorder = BatchLosses()
    trainer = make_trainer(callbacks=(tracking, recorder))
    scheduler = torch.optim.lr_scheduler.StepLR
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        eval_dataset=make_regression_dataset(16, seed=1),
        per_device_batch_size=8,  # 8 updates per epoch: intervals span the epoch end
        create_scheduler_fn=lambda optimizer: scheduler(optimizer, step_size=3, gamma=0.5),
    )
    scalars = read_scalars(tmp_path / "runs" / "pytorch-accel")
    points = [5, 10, 15, 16]  # every 5 updates, and the end of the run
    assert [step for step, _ in scalars["train_loss_step"]] == points
    expected = interval_means(recorder.losses, recorder.updates, points)
    assert [value for _, value in scalars["train_loss_step"]] == pytest.approx(expected, rel=1e-5)
    # the learning rate the update at each point used: halved every 3 updates
    assert scalars["lr"] == [
        (point, pytest.approx(0.05 * 0.5 ** ((point - 1) // 3))) for point in points
    ]
    assert [step for step, _ in scalars["samples_per_second"]] == points
    assert all(value > 0 for _, value in scalars["samples_per_second"])
    assert "grad_norm" not in scalars  # only when asked for
    # the epoch metrics on the same axis, at the update of each epoch's end (issue 41)
    assert [step for step, _ in scalars["train_loss_epoch"]] == [8, 16]

    rows = read_csv(tmp_path / "metrics_steps.csv")
    assert [int(row["step"]) for row in rows] == points
    assert [float(row["train_loss_step"]) for row in rows] == pytest.approx(expected, rel=1e-6)
    assert set(rows[0]) == {"step", "train_loss_step", "lr", "samples_per_second"}


def test_accumulation_and_tensor_batch_sizes_weight_the_interval_by_samples(
    tmp_path: Path,
) -> None:
    class TensorBatchSize(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_train_batch_loss(batch)
            output["batch_size"] = torch.tensor(output["batch_size"])
            return output

    tracking = TrackingCallback(log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=2)
    recorder = BatchLosses()
    model = make_model()
    trainer = TensorBatchSize(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(tracking, recorder),
    )
    trainer.train(
        make_regression_dataset(36),  # batches of 8, 8, 8, 8 and 4
        num_epochs=1,
        per_device_batch_size=8,
        gradient_accumulation_steps=2,  # updates after batches 2, 4 and 5
    )
    rows = read_csv(tmp_path / "m_steps.csv")
    assert [int(row["step"]) for row in rows] == [2, 3]
    losses = recorder.losses
    first = sum(losses[:4]) / 4
    last = losses[4]  # the last update: one batch of 4
    assert [float(row["train_loss_step"]) for row in rows] == pytest.approx([first, last])


def test_grad_norm_is_the_norm_of_the_update_at_the_logging_point(tmp_path: Path) -> None:
    class GradNorms(TrainerCallback):
        order = 20_000

        def __init__(self) -> None:
            self.norms: list[float] = []

        def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            grads = [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
            self.norms.append(float(torch.cat(grads).norm()))

    norms = GradNorms()
    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=3, log_grad_norm=True
    )
    trainer = make_trainer(callbacks=(tracking, norms))
    trainer.train(make_regression_dataset(48), num_epochs=1, per_device_batch_size=8)
    rows = read_csv(tmp_path / "m_steps.csv")
    assert [int(row["step"]) for row in rows] == [3, 6]
    assert [float(row["grad_norm"]) for row in rows] == pytest.approx(
        [norms.norms[2], norms.norms[5]], rel=1e-5
    )


def test_grad_norm_with_clipping_is_the_trainers_unclipped_norm(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=2, log_grad_norm=True
    )
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(
        make_regression_dataset(32), num_epochs=1, per_device_batch_size=8, max_grad_norm=0.01
    )
    rows = read_csv(tmp_path / "m_steps.csv")
    assert trainer.grad_norm is not None
    assert float(rows[-1]["grad_norm"]) == pytest.approx(float(trainer.grad_norm), rel=1e-5)
    assert float(rows[-1]["grad_norm"]) > 0.01  # before clipping


def test_every_parameter_group_has_its_learning_rate(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters()}],
        lr=0.01,
    )
    tracking = TrackingCallback(log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=2)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(tracking,))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=8)
    (row,) = read_csv(tmp_path / "m_steps.csv")
    assert (float(row["lr_group_0"]), float(row["lr_group_1"])) == (0.1, 0.01)
    assert "lr" not in row


def test_steps_between_logging_points_read_nothing_on_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads = HostReads(monkeypatch)

    class ReadsPerUpdate(TrainerCallback):
        """Notes the host reads of each step (runs last, inside the counting window)."""

        order = 9_999

        def __init__(self) -> None:
            self.per_step: list[tuple[int, int]] = []
            self._before = 0

        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            self._before = len(reads.calls)

        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.per_step.append((trainer.num_updates, len(reads.calls) - self._before))

    per_update = ReadsPerUpdate()
    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=4, log_grad_norm=True
    )
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, tracking, per_update, *reads.callbacks),
    )
    trainer.progress_interval = 0
    trainer.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    # the 4 logging points of each 16-update epoch are read together at the epoch's end
    assert [count for _, count in per_update.per_step] == [0] * 32  # no step reads anything
    assert reads.calls == []
    assert tracking.step_csv_path is not None
    assert len(read_csv(tracking.step_csv_path)) == 8


def test_step_logging_callback_logs_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    trainer = make_trainer(callbacks=(StepLoggingCallback(log_every_n_updates=3),))
    trainer.train(make_regression_dataset(40), num_epochs=1, per_device_batch_size=8)
    lines = [record.getMessage() for record in caplog.records]
    assert [line.split("  ")[0] for line in lines] == ["update 3/5", "update 5/5"]
    assert all("train_loss_step " in line and "  lr 0.05  " in line for line in lines)


class EveryStepLoss(StepLoggingCallback):
    def __init__(self) -> None:
        super().__init__(log_every_n_updates=1)
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, metrics))


def test_an_override_of_log_step_gets_every_point_and_no_point_twice() -> None:
    steps = EveryStepLoss()
    recorder = BatchLosses()
    trainer = make_trainer(callbacks=(steps, recorder))
    trainer.train(make_regression_dataset(24), num_epochs=2, per_device_batch_size=8)
    assert [step for step, _ in steps.logged] == [1, 2, 3, 4, 5, 6]
    assert [m["train_loss_step"] for _, m in steps.logged] == pytest.approx(recorder.losses)
    assert all(not math.isnan(m["samples_per_second"]) for _, m in steps.logged)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"log_every_n_updates": 0}, ValueError, r"log_every_n_updates must be a positive int"),
        ({"log_every_n_updates": 2.5}, TypeError, r"log_every_n_updates must be"),
        ({"log_grad_norm": "yes"}, TypeError, r"log_grad_norm must be a bool, got 'yes'"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        StepLoggingCallback(**arguments)
    with pytest.raises(error, match=message):
        TrackingCallback(log_with=(), csv_path=None, **arguments)


def test_no_interval_means_epoch_metrics_only(tmp_path: Path) -> None:
    tracking = TrackingCallback(log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=None)
    make_trainer(callbacks=(tracking,)).train(make_regression_dataset(16), num_epochs=1)
    assert tracking.step_csv_path is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.csv"]


class LogsValues(TrainerCallback):
    """Logs a value of every step, with several reductions, through ``trainer.log``."""

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        loss = kwargs["batch_output"]["loss"]
        trainer.log("scaled", loss.detach() * 2)
        trainer.log("peak", loss.detach(), reduce="max")


def _step_logging_run(tmp_path: Path, every: int) -> tuple[list[dict[str, str]], Any]:
    tracking = TrackingCallback(
        log_with="tensorboard",
        logging_dir=tmp_path / "tb",
        csv_path=tmp_path / "m.csv",
        log_every_n_updates=every,
        log_grad_norm=True,
    )
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, tracking, LogsValues()),
    )
    scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=5, gamma=0.5)
    trainer.train(
        make_regression_dataset(72),
        num_epochs=2,
        per_device_batch_size=4,
        eval_dataset=make_regression_dataset(16),
        create_scheduler_fn=scheduler,
    )
    tracking.finish()
    assert tracking.step_csv_path is not None
    rows = read_csv(tracking.step_csv_path)
    scalars = {
        tag: values
        for run_dir in (tmp_path / "tb").rglob("events.out.tfevents.*")
        for tag, values in read_scalars(run_dir.parent).items()
    }
    return rows, scalars


@pytest.mark.parametrize("every", [1, 3])
def test_points_read_together_give_the_rows_and_values_of_points_read_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    """Issue 44: the buffered points log exactly what reading each point at once logged."""
    from pytorch_accel.callbacks import step_logging

    buffered_rows, buffered_scalars = _step_logging_run(tmp_path / "buffered", every)
    monkeypatch.setattr(step_logging, "FLUSH_EVERY_N_UPDATES", 1)  # each point read at once
    rows, scalars = _step_logging_run(tmp_path / "at-once", every)

    def timeless(row: dict[str, str]) -> dict[str, str]:
        return {key: value for key, value in row.items() if key != "samples_per_second"}

    assert len(rows) == len(range(every, 37, every)) + (36 % every != 0)  # 36 updates
    assert [timeless(row) for row in buffered_rows] == [timeless(row) for row in rows]
    assert all(float(row["samples_per_second"]) > 0 for row in buffered_rows)
    assert {"train_loss_step", "grad_norm", "lr", "train_scaled_step"} <= set(rows[0])
    del buffered_scalars["samples_per_second"], scalars["samples_per_second"]
    assert buffered_scalars == scalars


def test_the_points_not_yet_read_are_logged_when_the_run_fails(tmp_path: Path) -> None:
    tracking = TrackingCallback(log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=1)

    class Fails(TrainerCallback):
        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            if trainer.num_updates == 7:
                raise RuntimeError("the batch is broken")

    trainer = make_trainer(callbacks=(tracking, Fails()))
    with pytest.raises(RuntimeError, match="the batch is broken"):
        trainer.train(make_regression_dataset(64), num_epochs=1, per_device_batch_size=4)
    assert tracking.step_csv_path is not None
    assert [row["step"] for row in read_csv(tracking.step_csv_path)] == [
        str(step) for step in range(1, 8)
    ]

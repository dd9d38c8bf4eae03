"""The hot loop reads no tensor on the host: counted by instrumenting the tensor methods."""

from __future__ import annotations

import csv
import functools
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, train_then_evaluate
from test_micro_batches import OutOfMemoryAbove
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrackingCallback, TrainerCallback

HOST_READS = ("item", "__bool__", "__float__", "__int__", "tolist", "numpy")


class SyncCounter:
    """Counts host reads of tensors while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.calls: list[str] = []


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncCounter]:
    counter = SyncCounter()
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(
            self: torch.Tensor,
            *args: Any,
            _name: str = name,
            _original: Callable[..., Any] = original,
            **kwargs: Any,
        ) -> Any:
            if counter.active:
                counter.calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, functools.wraps(original)(counted))
    return counter


def probes(counter: SyncCounter) -> tuple[TrainerCallback, TrainerCallback]:
    """Switch counting on before everything else in a step and off after everything else.

    Progress events, which come after a step's end, get a window of their own.
    """

    class On(TrainerCallback):
        order = -10_000

        def __init__(self) -> None:
            self.steps = 0

        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            self.steps += 1
            counter.active = self.steps > 1  # steady state: from the second step on

        def on_eval_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = True

        def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = self.steps > 1

        def on_eval_progress(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = True

    class Off(TrainerCallback):
        order = 10_000

        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = False

        def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = False

        def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = False

        def on_eval_progress(self, trainer: Trainer, **kwargs: Any) -> None:
            counter.active = False

    return On(), Off()


@pytest.mark.parametrize("accumulation", [1, 3])
def test_default_loop_reads_no_tensor_per_step(counter: SyncCounter, accumulation: int) -> None:
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, *probes(counter)),
    )
    trainer.progress_interval = 0  # a progress event after every step
    train_then_evaluate(trainer, accumulation)
    assert counter.calls == []


def test_the_watchdog_reads_no_tensor_per_step(counter: SyncCounter, tmp_path: Path) -> None:
    """Issue 43: the hang watchdog only notes times per step; step times are read per epoch."""
    from pytorch_accel.callbacks import WatchdogCallback

    watchdog = WatchdogCallback(timeout_s=60, directory=tmp_path, heartbeat_s=0.05)
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, watchdog, *probes(counter)),
    )
    trainer.progress_interval = 0
    train_then_evaluate(trainer, 1)
    assert counter.calls == []
    assert len(trainer.run_history.get_metric_values("train_step_seconds")) == 2


def test_the_counter_sees_a_host_read(counter: SyncCounter) -> None:
    class ReadsLoss(TrainerCallback):
        def on_train_step_end(
            self, trainer: Trainer, batch_output: dict[str, Any], **kwargs: Any
        ) -> None:
            batch_output["loss"].item()

    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(ReadsLoss(), *probes(counter)),
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert counter.calls == ["item"] * 3


def test_the_counter_sees_a_host_read_in_a_progress_event(counter: SyncCounter) -> None:
    class ReadsRunningLoss(TrainerCallback):
        def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
            total = trainer.train_loss_tracker.total_loss
            assert total is not None
            total.item()

    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(ReadsRunningLoss(), *probes(counter)),
    )
    trainer.progress_interval = 0
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert counter.calls == ["item"] * 3  # steps 2 to 4


@pytest.mark.parametrize(("accumulation", "points"), [(1, 8), (3, 3)])
def test_step_logging_reads_once_per_interval_and_never_between(
    counter: SyncCounter, tmp_path: Path, accumulation: int, points: int
) -> None:
    """Logging every 4 updates: no step reads anything (issue 44: the points are read together,
    at each epoch's end, outside the steps), and every point is logged."""

    class ReadsPerStep(TrainerCallback):
        order = 9_999  # inside the counting window, after everything else

        def __init__(self) -> None:
            self.reads: list[tuple[int, int]] = []  # (update count, reads in the step)
            self._before = 0

        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            self._before = len(counter.calls)

        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.reads.append((trainer.num_updates, len(counter.calls) - self._before))

    per_step = ReadsPerStep()
    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "metrics.csv", log_every_n_updates=4, log_grad_norm=True
    )
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, tracking, per_step, *probes(counter)),
    )
    trainer.progress_interval = 0
    train_then_evaluate(trainer, accumulation)
    assert counter.calls == []  # 2 epochs of 16 steps: 32 or 12 updates
    assert [reads for _, reads in per_step.reads] == [0] * len(per_step.reads)
    rows = list(csv.DictReader((tmp_path / "metrics_steps.csv").open()))
    assert [int(row["step"]) for row in rows] == list(range(4, 4 * points + 1, 4))


def test_evaluation_and_prediction_read_no_tensor_per_batch(counter: SyncCounter) -> None:
    """Every host read between two consecutive eval (or predict) batches, default callbacks.

    A forward pre-hook marks each batch, so the window covers the whole loop between two
    forwards (loading, the step, gathering, events), not only the step's events.
    """
    phase = ["setup"]
    marks: list[tuple[str, int]] = []

    class Phases(TrainerCallback):
        may_stop_training = False

        def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
            phase[0] = "train"

        def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
            phase[0] = f"eval{len(marks)}"  # each eval epoch a phase of its own

        def on_predict_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
            phase[0] = "predict"

    model = make_model()
    model.register_forward_pre_hook(lambda *args: marks.append((phase[0], len(counter.calls))))
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, Phases()),
    )
    counter.active = True
    train_then_evaluate(trainer, 1)
    predictions = trainer.predict(make_regression_dataset(32), per_device_batch_size=4)
    counter.active = False
    assert predictions.shape == (32, 1)
    per_batch: dict[str, list[list[str]]] = {"eval": [], "predict": []}
    for (first, start), (second, end) in itertools.pairwise(marks):
        if first == second and first != "train":
            per_batch[first.rstrip("0123456789")].append(counter.calls[start:end])
    assert len(per_batch["eval"]) == 3 * 7  # 3 eval epochs of 8 batches
    assert len(per_batch["predict"]) == 7
    assert all(reads == [] for reads in per_batch["eval"] + per_batch["predict"]), per_batch


def test_trainer_log_and_loss_components_read_nothing_between_logging_points(
    counter: SyncCounter, tmp_path: Path
) -> None:
    """``trainer.log`` per step and extra ``batch_output`` scalars: no read in any step.

    The logged values ride in the step logging's one ``tolist`` per read of its logging points
    (every 4 updates, read together at each epoch's end) and are read once more per epoch, at
    its end (outside the counted steps).
    """

    class LogsEveryStep(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_train_batch_loss(batch)
            self.log("aux", output["loss"] * 2)
            self.log_dict({"peak": output["loss"], "ones": 1.0}, reduce="max")
            return {**output, "ce": output["loss"] * 0.5, "extra": 0.25}

        def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_eval_batch_loss(batch)
            self.log("eval_aux", output["loss"])
            return {**output, "ce": output["loss"] * 0.5}

    tracking = TrackingCallback(
        log_with=(), csv_path=tmp_path / "metrics.csv", log_every_n_updates=4
    )
    model = make_model()
    trainer = LogsEveryStep(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, tracking, *probes(counter)),
    )
    trainer.progress_interval = 0
    train_then_evaluate(trainer, 1)
    assert counter.calls == []  # the 8 logging points are read at the epochs' ends, not in steps
    rows = list(csv.DictReader((tmp_path / "metrics_steps.csv").open()))
    assert len(rows) == 8
    assert all(float(row["train_ones_step"]) == 1.0 for row in rows)
    assert "train_ce_epoch" in trainer.run_history.get_metric_names()
    assert "eval_eval_aux_epoch" in trainer.run_history.get_metric_names()


@pytest.mark.parametrize("accumulation", [1, 3])
def test_a_split_loop_reads_no_tensor_per_step(counter: SyncCounter, accumulation: int) -> None:
    """``on_oom="split"`` in one process: after the split, micro-batches cost no host read."""
    model = OutOfMemoryAbove(2, in_backward=True)  # the first step splits batches of 4 in 2
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, *probes(counter)),
    )
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=accumulation,
        on_oom="split",
    )
    assert trainer._state.micro_batches is not None
    assert trainer._state.micro_batches.splits == 2
    assert counter.calls == []

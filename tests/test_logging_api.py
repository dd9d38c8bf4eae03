"""``Trainer.log`` / ``log_dict`` and the extra scalars of ``batch_output``, in real training."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.tracking import GeneralTracker
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    StepLoggingCallback,
    TrackingCallback,
    TrainerCallback,
)


class LogsLossParts(Trainer):
    """Logs two values per training step and keeps them, to compute what must be recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[float, float, int]] = []  # (aux, loss, batch size) per step

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        aux = output["loss"].detach() * 2 + 1
        self.log("aux", aux)
        self.log_dict({"peak": output["loss"]}, reduce="max")
        self.log("batches", 1.0, reduce="sum")
        self.seen.append((float(aux), float(output["loss"].detach()), output["batch_size"]))
        return output


def make(trainer_class: type[Trainer] = LogsLossParts, *callbacks: Any) -> Any:
    model = make_model()
    return trainer_class(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, *callbacks),
    )


def test_values_logged_in_a_step_are_recorded_per_epoch() -> None:
    trainer = make()
    trainer.train(make_regression_dataset(30), num_epochs=2, per_device_batch_size=4)
    history = trainer.run_history
    for epoch in range(2):
        steps = trainer.seen[8 * epoch : 8 * epoch + 8]  # 30 samples: 8 batches per epoch
        auxes = [aux for aux, _, _ in steps]
        assert history.get_metric_values("train_aux_epoch")[epoch] == pytest.approx(
            sum(auxes) / 8, rel=1e-6
        )  # the mean over the calls
        peak = max(loss for _, loss, _ in steps)
        assert history.get_metric_values("train_peak_epoch")[epoch] == pytest.approx(peak)
        assert history.get_metric_values("train_batches_epoch")[epoch] == 8.0
    assert "aux" not in history.get_metric_names()


def test_values_reach_the_step_logging_the_trackers_and_both_csv_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Recording(GeneralTracker):
        name = "recording"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()
            self.logged: list[tuple[int | None, dict[str, Any]]] = []

        @property
        def tracker(self) -> Any:
            return self.logged

        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.logged.append((step, dict(values)))

    recording = Recording()
    tracking = TrackingCallback(
        log_with=(recording,), csv_path=tmp_path / "metrics.csv", log_every_n_updates=4
    )
    trainer = make(LogsLossParts, tracking)
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        trainer.train(make_regression_dataset(32), num_epochs=2, per_device_batch_size=4)
    auxes = [aux for aux, _, _ in trainer.seen]
    expected = [sum(auxes[i : i + 4]) / 4 for i in range(0, 16, 4)]  # every 4 updates

    steps = list(csv.DictReader((tmp_path / "metrics_steps.csv").open()))
    assert [float(row["train_aux_step"]) for row in steps] == pytest.approx(expected, rel=1e-6)
    assert [float(row["train_batches_step"]) for row in steps] == [4.0] * 4
    at_steps = {step: values for step, values in recording.logged if "train_aux_step" in values}
    assert sorted(at_steps) == [4, 8, 12, 16]
    assert [at_steps[s]["train_aux_step"] for s in (4, 8, 12, 16)] == pytest.approx(expected)

    epochs = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [float(row["train_aux_epoch"]) for row in epochs] == pytest.approx(
        [sum(auxes[:8]) / 8, sum(auxes[8:]) / 8], rel=1e-6
    )
    assert any("train_aux_epoch" in values for _, values in recording.logged)
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("epoch 1/2") and "train_aux " in line for line in lines), lines


def test_the_console_step_line_shows_logged_values(caplog: pytest.LogCaptureFixture) -> None:
    trainer = make(LogsLossParts, StepLoggingCallback(log_every_n_updates=4))
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    lines = [
        record.getMessage() for record in caplog.records if "update 4/4" in record.getMessage()
    ]
    assert len(lines) == 1
    assert "train_aux_step" in lines[0]
    assert "train_peak_step" in lines[0]


class ReturnsLossParts(Trainer):
    """A model's loss components returned in ``batch_output``, next to values never logged."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        return self._with_parts(super().calculate_train_batch_loss(batch))

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        return self._with_parts(super().calculate_eval_batch_loss(batch))

    @staticmethod
    def _with_parts(output: dict[str, Any]) -> dict[str, Any]:
        loss = output["loss"]
        return {
            **output,
            "ce": loss * 0.25,  # logged (a 0-d float tensor, still attached to the graph)
            "aux": 0.5,  # logged (a Python float)
            "per_sample": output["model_outputs"].detach().squeeze(-1),  # not a scalar
            "num_tokens": 7,  # an int: a count, not logged
            "correct": torch.tensor(3),  # an integer tensor: not logged
            "_debug": loss.detach(),  # a leading underscore keeps it out
            "num_items_in_batch": torch.tensor(4.0),  # the accumulation count: not logged
        }


def test_extra_scalars_of_batch_output_are_logged_sample_weighted() -> None:
    trainer = make(ReturnsLossParts)
    trainer.train(
        make_regression_dataset(30),
        num_epochs=1,
        per_device_batch_size=4,
        eval_dataset=make_regression_dataset(10),
    )
    history = trainer.run_history
    loss = history.get_latest_metric("train_loss_epoch")  # sample-weighted, batches 4 ... 2
    assert history.get_latest_metric("train_ce_epoch") == pytest.approx(loss * 0.25, rel=1e-6)
    assert history.get_latest_metric("train_aux_epoch") == pytest.approx(0.5)
    eval_loss = history.get_latest_metric("eval_loss_epoch")
    assert history.get_latest_metric("eval_ce_epoch") == pytest.approx(eval_loss * 0.25, rel=1e-6)
    assert history.get_metric_names() == {
        "train_loss_epoch",
        "train_ce_epoch",
        "train_aux_epoch",
        "eval_loss_epoch",
        "eval_ce_epoch",
        "eval_aux_epoch",
    }


def test_evaluate_returns_the_logged_values_under_its_prefix() -> None:
    trainer = make(ReturnsLossParts)
    metrics = trainer.evaluate(make_regression_dataset(10), per_device_batch_size=4)
    assert metrics["evaluation_ce"] == pytest.approx(metrics["evaluation_loss"] * 0.25, rel=1e-6)
    assert metrics["evaluation_aux"] == pytest.approx(0.5)
    named = trainer.evaluate({"clean": make_regression_dataset(8)}, metric_prefix="test_")
    assert set(named) == {"test_clean_loss", "test_clean_ce", "test_clean_aux"}


def test_values_logged_outside_an_epoch_are_recorded_under_their_name() -> None:
    class EpochEnd(TrainerCallback):
        def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.log("weight_norm", trainer.model[0].weight.detach().norm())

        def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.log_dict({"score": 2.0, "best": torch.tensor(5.0)}, reduce="max")

    trainer = make(Trainer, EpochEnd())
    trainer.train(make_regression_dataset(16), num_epochs=2, per_device_batch_size=4)
    history = trainer.run_history
    assert len(history.get_metric_values("weight_norm")) == 2
    assert history.get_metric_values("score") == [2.0, 2.0]
    assert history.get_metric_values("best") == [5.0, 5.0]


def test_named_eval_sets_record_under_their_prefix() -> None:
    trainer = make(ReturnsLossParts)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        per_device_batch_size=4,
        eval_dataset={"val": make_regression_dataset(8), "test": make_regression_dataset(8, 1)},
    )
    names = trainer.run_history.get_metric_names()
    assert {"val_eval_ce_epoch", "test_eval_ce_epoch", "val_eval_loss_epoch"} <= names


def test_a_step_evaluation_inside_a_training_epoch_keeps_the_phases_apart() -> None:
    class EvalMidEpoch(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, step: int, **kwargs: Any) -> None:
            if step == 1:
                trainer.run_eval_epoch("mid_eval_loss", is_intermediate=True)

    class Logs(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            self.log("where", 1.0)
            return super().calculate_train_batch_loss(batch)

        def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
            self.log("where", 2.0)
            return super().calculate_eval_batch_loss(batch)

    trainer = make(Logs, EvalMidEpoch())
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        per_device_batch_size=4,
        eval_dataset=make_regression_dataset(8),
    )
    history = trainer.run_history
    assert history.get_metric_values("train_where_epoch") == [1.0]
    assert history.get_metric_values("mid_eval_where") == [2.0]  # named as its loss
    assert history.get_metric_values("eval_where_epoch") == [2.0]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda t: t.log("x", torch.ones(3)), ValueError, r"Trainer.log: x must be a real scalar"),
        (lambda t: t.log("x", "high"), TypeError, r"Trainer.log: x must be a number"),
        (lambda t: t.log("", 1.0), ValueError, r"Trainer.log: name must be a non-empty str"),
        (lambda t: t.log(3, 1.0), TypeError, r"Trainer.log: name must be a non-empty str"),
        (lambda t: t.log("x", 1.0, reduce="median"), ValueError, r"reduce must be one of"),
        (lambda t: t.log("x", 1.0, weight="4"), TypeError, r"weight must be a number"),
        (lambda t: t.log("loss", 1.0), ValueError, r"name must be a name other than 'loss'"),
        (lambda t: t.log_dict(5), TypeError, r"Trainer.log_dict: metrics must be a dict"),
        (lambda t: t.log("x", 1j), TypeError, r"x must be a number"),
        (lambda t: t.log("x", torch.tensor(1j)), ValueError, r"x must be a real scalar"),
    ],
)
def test_bad_values_are_refused_at_the_call(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(make(Trainer))


@pytest.mark.bad_input
def test_one_name_with_two_reductions_in_one_epoch_is_refused() -> None:
    class Mixed(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            self.log("x", 1.0)
            self.log("x", 1.0, reduce="max")
            return super().calculate_train_batch_loss(batch)

    with pytest.raises(ValueError, match=r"reduce must be 'mean', as 'x' was logged"):
        make(Mixed).train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)


def test_a_nan_value_is_recorded_as_nan() -> None:
    class LogsNan(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            self.log("bad", torch.tensor(float("nan")))
            return super().calculate_train_batch_loss(batch)

    trainer = make(LogsNan)
    trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
    assert math.isnan(trainer.run_history.get_latest_metric("train_bad_epoch"))


class TargetStats(Trainer):
    """Logs values that depend on each batch only, so a resumed run must log the same."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        targets = batch[1]
        self.log("target_mean", targets.mean())
        self.log("target_max", targets.max(), reduce="max")
        return {**output, "target_min": targets.min()}


class StepValues(StepLoggingCallback):
    def __init__(self) -> None:
        super().__init__(log_every_n_updates=3)
        self.logged: dict[int, dict[str, float]] = {}

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.logged[step] = {name: value for name, value in metrics.items() if "target" in name}


def run_target_stats(*extra: Any, resume_from: Path | None = None) -> tuple[Trainer, StepValues]:
    steps = StepValues()
    model = make_model()
    trainer = TargetStats(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), (steps, *extra)
    )
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        per_device_batch_size=8,
        resume_from=resume_from,
    )
    return trainer, steps


@pytest.mark.parametrize("step", [4, 13])  # mid epoch 1, mid epoch 2; both mid-interval
def test_a_mid_epoch_resume_records_the_same_logged_values(tmp_path: Path, step: int) -> None:
    from helpers import SaveAtStep

    uninterrupted, all_steps = run_target_stats()
    run_target_stats(SaveAtStep(tmp_path / "state", step))
    resumed, steps = run_target_stats(resume_from=tmp_path / "state")
    expected = uninterrupted.run_history.state_dict()["metrics"]
    got = resumed.run_history.state_dict()["metrics"]
    for name in ("train_target_mean_epoch", "train_target_max_epoch", "train_target_min_epoch"):
        assert got[name] == pytest.approx(expected[name], rel=1e-6), name
    assert steps.logged
    for update, values in steps.logged.items():
        assert values == pytest.approx(all_steps.logged[update], rel=1e-6), update

"""GradientHealthCallback: the gradient norm of a chosen type, non-finite reports, no host read."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from host_reads import HostReads
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import GradientHealthCallback, TrainerCallback


class ExpectedNorms(TrainerCallback):
    """Computes each update's gradient norms by hand, after the callback (a higher order)."""

    order = 10

    def __init__(self, norm_type: float) -> None:
        self.norm_type = norm_type
        self.totals: list[float] = []
        self.first_layer: list[float] = []

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        model = trainer.get_model()
        values = torch.cat([p.grad.flatten() for p in model.parameters()])
        self.totals.append(torch.linalg.vector_norm(values, self.norm_type).item())
        first = torch.cat([p.grad.flatten() for p in model[0].parameters()])
        self.first_layer.append(torch.linalg.vector_norm(first, self.norm_type).item())


def make(callbacks: tuple[Any, ...]) -> Trainer:
    model = make_model()
    return Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=callbacks
    )


@pytest.mark.parametrize("norm_type", [1.0, math.inf])
def test_the_norm_of_the_chosen_type_is_logged_at_logging_points(norm_type: float) -> None:
    health = GradientHealthCallback(norm_type, log_every_n_updates=2, per_layer=True)
    expected = ExpectedNorms(norm_type)
    trainer = make((health, expected))
    trainer.train(make_regression_dataset(32), num_epochs=2, per_device_batch_size=4)
    name = "grad_norm_l1" if norm_type == 1.0 else "grad_norm_linf"
    values = trainer.run_history.get_metric_values(f"train_{name}_epoch")
    at_points = expected.totals[1::2]  # updates 2, 4, ...: 4 points per epoch of 8 updates
    assert values == pytest.approx([sum(at_points[:4]) / 4, sum(at_points[4:]) / 4], rel=1e-5)
    first = trainer.run_history.get_metric_values(f"train_{name}_0_epoch")
    assert first[-1] == pytest.approx(sum(expected.first_layer[1::2][4:]) / 4, rel=1e-5)
    assert trainer.run_history.get_metric_values("train_nonfinite_grads_epoch") == [0, 0]
    assert health.reports == []


def test_no_tensor_is_read_in_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = HostReads(monkeypatch)
    health = GradientHealthCallback(log_every_n_updates=1, per_layer=True)
    trainer = make((health, *reads.callbacks))
    trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    assert reads.calls == []
    assert len(trainer.run_history.get_metric_values("train_grad_norm_l2_epoch")) == 1


class NaNGradientAt(TrainerCallback):
    """Makes the last layer's bias gradient NaN at one update (before the health check)."""

    order = -10

    def __init__(self, update: int) -> None:
        self.update = update

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.global_num_updates + 1 == self.update:
            bias = trainer.get_model()[-1].bias
            bias.grad[0] = math.nan


def test_non_finite_gradients_and_weights_are_named_at_the_epoch_end() -> None:
    health = GradientHealthCallback(log_every_n_updates=1)
    trainer = make((NaNGradientAt(update=3), health))
    first = r"gradients first at update 3 \(epoch 1\): 2\.bias \(1 of 1 values\);"
    with pytest.warns(RuntimeWarning, match=first):
        trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    assert trainer.run_history.get_metric_values("train_nonfinite_grads_epoch") == [1 + 5 * 49]
    assert "; non-finite weights at the end of epoch 1: 0.weight" in health.reports[0]  # spread


@pytest.mark.bad_input
def test_a_bad_norm_type_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"norm_type must be a positive number .* got 0"):
        GradientHealthCallback(norm_type=0)

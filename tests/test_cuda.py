"""On a CUDA device: steady-state steps never synchronise, and each precision keeps the math.

Marked ``cuda``: skipped without a CUDA device (CI has none); run where a GPU is lent. The
sync check uses torch's own ``torch.cuda.set_sync_debug_mode("error")``, which raises at any
synchronising CUDA call, including the ones a host-read counter cannot see (a copy to the
CPU, ``nonzero``, ...).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from helpers import (
    clone_params,
    make_model,
    make_regression_dataset,
    make_trainer,
    train_then_evaluate,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _default_sync_mode() -> Iterator[None]:
    yield
    torch.cuda.set_sync_debug_mode("default")  # also after a test failed inside a guarded step


class SyncGuard(TrainerCallback):
    """Has torch raise at any host sync between the end of an epoch's first and last steps.

    It runs after every other callback, so the guarded stretch holds everything a step does:
    loading and copying the next batch, forward, backward, update, and every callback.
    """

    order = 10_000

    def __init__(self) -> None:
        self.train_steps = self.eval_steps = 0

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.train_steps = 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.train_steps += 1
        _guard(self.train_steps < len(trainer.train_dataloader or ()))

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.eval_steps = 0

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.eval_steps += 1
        _guard(self.eval_steps < len(trainer.eval_dataloader or ()))


def _guard(on: bool) -> None:
    torch.cuda.set_sync_debug_mode("error" if on else "default")


@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("accumulation", [1, 3])
def test_steady_state_steps_never_synchronise(
    monkeypatch: pytest.MonkeyPatch, precision: str, accumulation: int
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, SyncGuard()))
    assert trainer.device.type == "cuda"
    train_then_evaluate(trainer, accumulation)
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


def test_the_guard_sees_a_host_read() -> None:
    class ReadsLoss(TrainerCallback):
        def on_train_step_end(
            self, trainer: Trainer, batch_output: dict[str, Any], **kwargs: Any
        ) -> None:
            batch_output["loss"].item()

    trainer = make_trainer(callbacks=(ReadsLoss(), SyncGuard()))
    with pytest.raises(RuntimeError, match="synchronizing"):
        trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)


def accelerate_loop(model: nn.Module, dataset: TensorDataset, precision: str) -> nn.Module:
    """The loop accelerate's documentation teaches, in ``precision``, unshuffled."""
    model = copy.deepcopy(model)
    accelerator = Accelerator(mixed_precision=precision)
    prepared, optimizer, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.05), DataLoader(dataset, batch_size=8)
    )
    loss_func = nn.MSELoss()
    for _ in range(2):
        for inputs, targets in loader:
            accelerator.backward(loss_func(prepared(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
    return model


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_each_precision_gives_the_weights_of_an_accelerate_loop(
    monkeypatch: pytest.MonkeyPatch, regression_dataset: TensorDataset, precision: str
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    reference = clone_params(accelerate_loop(make_model(), regression_dataset, precision))
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    trainer = make_trainer(make_model())
    trainer.train(
        regression_dataset,
        num_epochs=2,
        per_device_batch_size=8,
        train_dataloader_kwargs={"shuffle": False},
    )
    assert trainer.device.type == "cuda"
    assert (trainer.accelerator.scaler is not None) == (precision == "fp16")
    weights = clone_params(trainer.get_model())
    assert all(torch.equal(a, b) for a, b in zip(weights, reference, strict=True))


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_token_exact_accumulation_never_synchronises(
    monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Weighting by ``num_items`` and normalising each window stay on the device."""
    from helpers import TinyTokenModel, VariableLengthTokens, counting_collate, large_batch_loop

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    data = VariableLengthTokens(48)
    model = TinyTokenModel()
    reference = large_batch_loop(model, data, window_samples=12, num_epochs=2)
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), (SyncGuard(),))
    trainer.train(
        data,
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        collate_fn=counting_collate(),
        train_dataloader_kwargs={"shuffle": False},
    )
    assert trainer.device.type == "cuda"
    if precision == "no":  # the large batch's weights, on the GPU's float32 arithmetic
        weights = zip(trainer.get_model().parameters(), reference.parameters(), strict=True)
        assert max((a.cpu() - b).abs().max().item() for a, b in weights) < 1e-5

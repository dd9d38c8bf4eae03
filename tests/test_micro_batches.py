"""``train(on_oom="split")``: on out-of-memory, more micro-batches of the same total.

The model "runs out of memory" (raises ``torch.OutOfMemoryError``) on batches of more than a
given number of rows, in the forward pass or half-way through the backward pass (after the
last layer's gradients were accumulated), from a chosen forward call on. A run that splits
must end with the weights of a run that never ran out of memory.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers import make_regression_dataset
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback


class _RaiseInBackward(torch.autograd.Function):
    """The identity, whose backward pass runs out of memory."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. (simulated, in the backward pass)")


class OutOfMemoryAbove(nn.Module):
    """Runs out of memory on batches of more than ``limit`` rows, from forward ``from_call`` on."""

    def __init__(
        self, limit: int, *, in_backward: bool = False, from_call: int = 1, outputs: int = 1
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 8)
        self.last = nn.Sequential(nn.Tanh(), nn.Linear(8, outputs))
        self.limit, self.in_backward, self.from_call = limit, in_backward, from_call
        self.calls = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        too_big = inputs.shape[0] > self.limit and self.calls >= self.from_call
        if too_big and not self.in_backward:
            raise torch.OutOfMemoryError(f"CUDA out of memory. ({inputs.shape[0]} rows)")
        hidden = self.first(inputs)
        if too_big:  # the last layer's gradients accumulate before the error
            hidden = _RaiseInBackward.apply(hidden)
        return self.last(hidden)  # type: ignore[no-any-return]


def train(
    model: nn.Module,
    *,
    on_oom: str = "raise",
    accumulation: int = 1,
    trainer_class: type[Trainer] = Trainer,
    dataset: Any = None,
    callbacks: tuple[Any, ...] = (),
) -> Trainer:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = trainer_class(model, nn.MSELoss(), optimizer, callbacks=callbacks)
    trainer.train(
        make_regression_dataset(64) if dataset is None else dataset,
        num_epochs=2,
        per_device_batch_size=16,
        gradient_accumulation_steps=accumulation,
        on_oom=on_oom,  # type: ignore[arg-type]
    )
    return trainer


def max_difference(first: nn.Module, second: nn.Module) -> float:
    return max(
        (a - b).abs().max().item()
        for a, b in zip(first.parameters(), second.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("accumulation", "in_backward", "from_call"),
    [
        (1, False, 1),  # the first step, in the forward pass
        (1, True, 3),  # a later step, half-way through the backward pass
        (3, True, 6),  # the second step of a window: its earlier gradients are kept
        (3, False, 4),  # the first step of the second window
    ],
)
def test_a_run_that_splits_ends_with_the_weights_of_one_that_did_not(
    accumulation: int, in_backward: bool, from_call: int, caplog: pytest.LogCaptureFixture
) -> None:
    reference = train(OutOfMemoryAbove(1_000), accumulation=accumulation)
    model = OutOfMemoryAbove(5, in_backward=in_backward, from_call=from_call)
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        trainer = train(model, on_oom="split", accumulation=accumulation)
    assert trainer._state.micro_batches is not None
    assert trainer._state.micro_batches.splits == 4  # 16 rows: 8 do not fit, 4 do
    assert max_difference(model, reference.model) < 1e-6
    assert trainer.num_updates == reference.num_updates
    assert trainer.run_history.get_metric_values("train_loss_epoch") == pytest.approx(
        reference.run_history.get_metric_values("train_loss_epoch"), rel=1e-6
    )
    said = [record.message for record in caplog.records if "on_oom='split'" in record.message]
    assert len(said) == 1  # once, although it split twice
    assert "runs as 4 micro-batches of at most 4" in said[0]


def test_the_step_end_event_gets_the_whole_batch_output() -> None:
    class Outputs(TrainerCallback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, tuple[int, ...]]] = []

        def on_train_step_end(
            self, trainer: Trainer, batch_output: dict[str, Any], **kwargs: Any
        ) -> None:
            self.seen.append(
                (batch_output["batch_size"], tuple(batch_output["model_outputs"].shape))
            )

    outputs = Outputs()
    train(OutOfMemoryAbove(5), on_oom="split", callbacks=(outputs,))
    assert outputs.seen == [(16, (16, 1))] * 8


class TokenLoss(Trainer):
    """A loss averaged over each row's first ``length`` outputs, counted in ``num_items``."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        inputs, targets, lengths = batch
        outputs = self.model(inputs)
        mask = torch.arange(targets.shape[1]) < lengths[:, None]
        num_items = mask.sum()
        loss = ((outputs - targets) ** 2 * mask).sum() / num_items
        return {"loss": loss, "model_outputs": outputs, "batch_size": 16, "num_items": num_items}


def test_token_weighted_steps_split_to_the_same_update() -> None:
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(
        torch.randn(64, 4, generator=generator),
        torch.randn(64, 6, generator=generator),
        torch.randint(1, 7, (64,), generator=generator),
    )
    reference = train(
        OutOfMemoryAbove(1_000, outputs=6), trainer_class=TokenLoss, dataset=dataset, accumulation=2
    )
    model = OutOfMemoryAbove(5, in_backward=True, from_call=2, outputs=6)
    train(model, on_oom="split", trainer_class=TokenLoss, dataset=dataset, accumulation=2)
    assert max_difference(model, reference.model) < 1e-6


def test_out_of_memory_is_raised_by_default() -> None:
    with pytest.raises(torch.OutOfMemoryError, match="16 rows"):
        train(OutOfMemoryAbove(5))


def test_out_of_memory_with_micro_batches_of_one_sample_fails_clearly() -> None:
    with pytest.raises(RuntimeError, match="micro-batches of one sample") as raised:
        train(OutOfMemoryAbove(0), on_oom="split")
    assert isinstance(raised.value.__cause__, torch.OutOfMemoryError)


def test_another_error_in_a_split_step_is_raised_as_it_is() -> None:
    class Fails(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            raise KeyError("no such column")

    with pytest.raises(KeyError, match="no such column"):
        train(OutOfMemoryAbove(5), on_oom="split", trainer_class=Fails)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("shrink", ValueError, r"Trainer.train: on_oom must be 'raise' or 'split', got 'shrink'"),
        (True, TypeError, r"on_oom must be 'raise' or 'split', got True \(bool\)"),
    ],
)
def test_bad_on_oom_values_are_refused(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        train(OutOfMemoryAbove(5), on_oom=value)


@pytest.mark.bad_input
def test_on_oom_split_with_skip_failing_batches_is_refused() -> None:
    model = OutOfMemoryAbove(5)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="on_oom must be 'raise' with skip_failing_batches"):
        trainer.train(
            make_regression_dataset(16), num_epochs=1, on_oom="split", skip_failing_batches=3
        )

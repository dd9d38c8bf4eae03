"""Skipping failing and empty training batches: counted, kept out of the loss, limited."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import SkipFailingBatches, Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.failing_batches import is_empty_batch

POISON = 1e6  # a sample whose first feature is this makes the model run out of memory


class RunsOutOfMemory(nn.Module):
    """Raises torch's out-of-memory error on a batch holding a poisoned sample."""

    def __init__(self, model: nn.Module, error: type[Exception] = torch.OutOfMemoryError) -> None:
        super().__init__()
        self.model, self.error = model, error

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if bool((inputs[:, 0] == POISON).any()):
            raise self.error("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return self.model(inputs)  # type: ignore[no-any-return]


def poisoned(batches: tuple[int, ...], batch_size: int = 4) -> TensorDataset:
    """64 regression samples, with the first sample of each batch in ``batches`` poisoned."""
    inputs, targets = make_regression_dataset(64).tensors
    inputs = inputs.clone()
    for batch in batches:
        inputs[batch * batch_size, 0] = POISON
    return TensorDataset(inputs, targets)


def without(batches: tuple[int, ...], batch_size: int = 4) -> TensorDataset:
    inputs, targets = make_regression_dataset(64).tensors
    keep = [i for i in range(64) if i // batch_size not in batches]
    return TensorDataset(inputs[keep], targets[keep])


def trainer(model: nn.Module, *callbacks: Any) -> Trainer:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)


class SkippedSteps(TrainerCallback):
    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        if batch_output.get("skipped"):
            self.outputs.append(batch_output)


def test_failing_batches_are_skipped_counted_and_kept_out_of_the_loss() -> None:
    base = make_model()
    skipped = SkippedSteps()
    guarded = trainer(RunsOutOfMemory(copy.deepcopy(base)), skipped)
    guarded.train(
        poisoned((2, 9)),
        num_epochs=1,
        per_device_batch_size=4,
        train_dataloader_kwargs={"shuffle": False},
        skip_failing_batches=3,
    )
    reference = trainer(copy.deepcopy(base))
    reference.train(
        without((2, 9)),
        num_epochs=1,
        per_device_batch_size=4,
        train_dataloader_kwargs={"shuffle": False},
    )
    assert guarded.num_updates == reference.num_updates == 14
    for a, b in zip(clone_params(guarded.model.model), clone_params(reference.model), strict=True):
        assert torch.equal(a, b)
    history = guarded.run_history
    assert history.get_metric_values("train_skipped_batches") == [2]
    assert history.get_latest_metric("train_loss_epoch") == pytest.approx(
        reference.run_history.get_latest_metric("train_loss_epoch"), rel=1e-6
    )
    assert [output["batch_size"] for output in skipped.outputs] == [0, 0]


def test_more_failures_than_allowed_raise_from_the_last_one() -> None:
    guarded = trainer(RunsOutOfMemory(make_model()))
    too_many = r"3 training batches failed, more than .* \(2\)"
    with pytest.raises(RuntimeError, match=too_many) as info:
        guarded.train(
            poisoned((1, 2, 3)),
            num_epochs=1,
            per_device_batch_size=4,
            train_dataloader_kwargs={"shuffle": False},
            skip_failing_batches=2,
        )
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def test_the_default_fails_fast_and_other_errors_are_not_skipped() -> None:
    with pytest.raises(torch.OutOfMemoryError):
        trainer(RunsOutOfMemory(make_model())).train(poisoned((1,)), num_epochs=1)
    with pytest.raises(ValueError, match="simulated"):
        trainer(RunsOutOfMemory(make_model(), ValueError)).train(
            poisoned((1,)), num_epochs=1, skip_failing_batches=5
        )
    policy = SkipFailingBatches(max_skipped=5, exceptions=(ValueError,))
    guarded = trainer(RunsOutOfMemory(make_model(), ValueError))
    guarded.train(poisoned((1,)), num_epochs=1, skip_failing_batches=policy)
    assert guarded.run_history.get_metric_values("train_skipped_batches") == [1]


class StopsInTheStep(Trainer):
    """Raises StopTrainingError from calculate_train_batch_loss at its 3rd call."""

    calls = 0

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 3:
            raise StopTrainingError("stop from the step")
        return super().calculate_train_batch_loss(batch)


def test_a_stop_raised_in_the_step_is_never_skipped() -> None:
    model = make_model()
    stopping = StopsInTheStep(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05))
    policy = SkipFailingBatches(max_skipped=10, exceptions=(Exception,))
    stopping.train(make_regression_dataset(32), num_epochs=2, skip_failing_batches=policy)
    assert str(stopping.stopped_by) == "stop from the step"
    assert stopping.num_updates == 2
    assert stopping.run_history.get_metric_values("train_skipped_batches") == [0]


def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    if not samples:
        return torch.zeros(0, 4), torch.zeros(0, 1)
    return tuple(torch.stack(column) for column in zip(*samples, strict=True))


def test_empty_batches_are_skipped_and_a_window_of_only_skipped_batches_updates_nothing() -> None:
    data = make_regression_dataset(16)
    batches = [[0, 1, 2, 3], [4, 5, 6, 7], [], [], [8, 9, 10, 11], [12, 13, 14, 15]]
    loader = DataLoader(data, batch_sampler=batches, collate_fn=collate)  # type: ignore[arg-type]
    guarded = trainer(make_model())
    guarded.train(loader, num_epochs=1, gradient_accumulation_steps=2, skip_failing_batches=4)
    assert guarded.num_updates == 2  # the window of the two empty batches has no update
    assert guarded.run_history.get_metric_values("train_skipped_batches") == [2]


def test_is_empty_batch() -> None:
    assert is_empty_batch(torch.zeros(0, 3))
    assert is_empty_batch((torch.zeros(0, 3), torch.zeros(0)))
    assert is_empty_batch({"x": torch.zeros(0, 2)})
    assert is_empty_batch([])
    assert not is_empty_batch((torch.zeros(2, 3), torch.zeros(2)))
    assert not is_empty_batch(torch.tensor(1.0))
    assert not is_empty_batch("text")


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, "skip_failing_batches must be a positive int"),
        (True, TypeError, "skip_failing_batches must be None, an int"),
        ("all", TypeError, "skip_failing_batches must be None, an int"),
    ],
)
def test_bad_policies_are_refused(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        trainer(make_model()).train(
            make_regression_dataset(16), num_epochs=1, skip_failing_batches=value
        )
    with pytest.raises(TypeError, match="exceptions must be a tuple of Exception classes"):
        SkipFailingBatches(exceptions=torch.OutOfMemoryError)  # type: ignore[arg-type]


def test_an_empty_batch_without_the_policy_is_a_clear_error_at_that_batch() -> None:
    data = make_regression_dataset(16)
    batches = [[0, 1, 2, 3], [], [4, 5, 6, 7]]
    loader = DataLoader(data, batch_sampler=batches, collate_fn=collate)  # type: ignore[arg-type]
    plain = trainer(make_model())
    before = clone_params(plain.model)
    with pytest.raises(ValueError, match=r"batch 2 of epoch 1.*skip_failing_batches") as info:
        plain.train(loader, num_epochs=1)
    assert "empty" in str(info.value)
    assert plain.num_updates == 1  # the batch before it, and no NaN step
    assert all(bool(torch.isfinite(p).all()) for p in plain.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, plain.model.parameters(), strict=True))

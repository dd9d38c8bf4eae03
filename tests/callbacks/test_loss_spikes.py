"""LossSpikeCallback: a spike skips its update or rolls back to the last good state."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from host_reads import HostReads
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import LossSpikeCallback

BATCH = 4
SPIKE = 5  # the batch (0-based, 8 per epoch) whose targets are huge
UNSHUFFLED = {"shuffle": False}


def spiked_dataset(value: float = 1e4) -> TensorDataset:
    inputs, targets = make_regression_dataset(32).tensors
    targets = targets.clone()
    targets[SPIKE * BATCH : (SPIKE + 1) * BATCH] = value
    return TensorDataset(inputs, targets)


def adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=0.01)


def train(callback: LossSpikeCallback, dataset: TensorDataset, **kwargs: Any) -> nn.Module:
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(), adam(model), callbacks=(callback,))
    trainer.train(
        dataset,
        num_epochs=1,
        per_device_batch_size=BATCH,
        train_dataloader_kwargs=UNSHUFFLED,
        **kwargs,
    )
    return trainer.get_model()


def reference(dataset: TensorDataset, skipped: set[int]) -> nn.Module:
    """Plain PyTorch, Adam, omitting the batches in ``skipped``."""
    model = copy.deepcopy(make_model())
    optimizer = adam(model)
    inputs, targets = dataset.tensors
    for index in range(len(dataset) // BATCH):
        if index in skipped:
            continue
        part = slice(index * BATCH, (index + 1) * BATCH)
        nn.MSELoss()(model(inputs[part]), targets[part]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def assert_same(model: nn.Module, expected: nn.Module) -> None:
    for got, want in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("value", [1e4, math.nan])
def test_skip_leaves_the_weights_of_a_run_without_that_update(value: float) -> None:
    dataset = spiked_dataset(value)
    spikes = LossSpikeCallback("skip", factor=5.0, window=8, min_history=3)
    with pytest.warns(RuntimeWarning, match="skipped 1 update"):
        model = train(spikes, dataset)
    assert spikes.skipped_updates == 1
    assert_same(model, reference(dataset, {SPIKE}))


def test_skip_with_no_spike_changes_nothing() -> None:
    dataset = make_regression_dataset(32)
    spikes = LossSpikeCallback("skip", factor=5.0, window=8, min_history=3)
    assert_same(train(spikes, dataset), reference(dataset, set()))
    assert spikes.skipped_updates == 0


def reference_windows(dataset: TensorDataset, skipped: int) -> nn.Module:
    """Plain PyTorch, Adam, windows of 2 batches (their mean loss), omitting window ``skipped``."""
    model = copy.deepcopy(make_model())
    optimizer = adam(model)
    inputs, targets = dataset.tensors
    for window in range(4):
        if window == skipped:
            continue
        for index in (2 * window, 2 * window + 1):
            part = slice(index * BATCH, (index + 1) * BATCH)
            (nn.MSELoss()(model(inputs[part]), targets[part]) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize(
    ("action", "warning"), [("skip", "skipped 1 update"), ("rollback", "restored the state")]
)
def test_the_whole_accumulation_window_of_a_spike_is_omitted(action: str, warning: str) -> None:
    dataset = spiked_dataset()
    spikes = LossSpikeCallback(action, factor=5.0, window=8, min_history=3, check_every_n_updates=1)
    with pytest.warns(RuntimeWarning, match=warning):
        model = train(spikes, dataset, gradient_accumulation_steps=2)
    # the window of batches 4 and 5 (update 3) is omitted
    assert_same(model, reference_windows(dataset, skipped=2))
    assert spikes.rollbacks == ([(2, 3)] if action == "rollback" else [])


@pytest.mark.parametrize(("every", "skipped"), [(2, {4, 5}), (1, {5})])
def test_rollback_restores_the_last_good_state_and_skips_the_batches_since(
    every: int, skipped: set[int]
) -> None:
    dataset = spiked_dataset()
    spikes = LossSpikeCallback(
        "rollback", factor=5.0, window=8, min_history=3, check_every_n_updates=every
    )
    with pytest.warns(RuntimeWarning, match="restored the state of update"):
        model = train(spikes, dataset)
    # checks at every `every` updates: the spike (update 6) is seen at update 6
    assert spikes.rollbacks == [(SPIKE + 1 - len(skipped), SPIKE + 1)]
    assert_same(model, reference(dataset, skipped))


def test_rollback_at_the_epoch_end_restores_the_last_good_state() -> None:
    dataset = spiked_dataset()
    spikes = LossSpikeCallback("rollback", factor=5.0, window=8, min_history=3)  # every 50
    with pytest.warns(RuntimeWarning, match="restored the state of update 0"):
        model = train(spikes, dataset)
    assert spikes.rollbacks == [(0, 8)]
    assert_same(model, make_model())  # the whole epoch is undone


def test_skip_reads_nothing_on_the_host_in_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = HostReads(monkeypatch)
    spikes = LossSpikeCallback("skip", factor=5.0, window=8, min_history=3)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # Adam reads its step
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(spikes, *reads.callbacks))
    with pytest.warns(RuntimeWarning, match="skipped 1 update"):
        trainer.train(
            spiked_dataset(),
            num_epochs=1,
            per_device_batch_size=BATCH,
            train_dataloader_kwargs=UNSHUFFLED,
        )
    assert reads.calls == []
    assert spikes.skipped_updates == 1


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"action": "undo"}, ValueError, r"action must be 'skip' or 'rollback', got 'undo'"),
        ({"factor": 1.0}, ValueError, r"factor must be a number > 1, got 1\.0"),
        ({"factor": math.nan}, ValueError, r"factor must be"),
        ({"window": 0}, ValueError, r"window must be a positive int, got 0"),
        ({"statistic": "max"}, ValueError, r"statistic must be 'median' or 'mean', got 'max'"),
        ({"window": 4, "min_history": 5}, ValueError, r"min_history must be at most window"),
        ({"check_every_n_updates": 1.5}, TypeError, r"check_every_n_updates must be"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        LossSpikeCallback(**kwargs)


def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 0.9**update)


@pytest.mark.parametrize(("action", "steps"), [("skip", 8), ("rollback", 6)])
def test_the_schedule_counts_a_skipped_update_and_goes_back_with_a_rollback(
    action: str, steps: int
) -> None:
    spikes = LossSpikeCallback(action, factor=5.0, window=8, min_history=3, check_every_n_updates=2)
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(), adam(model), callbacks=(spikes,))
    with pytest.warns(RuntimeWarning, match="skipped 1 update|restored the state"):
        trainer.train(
            spiked_dataset(),
            num_epochs=1,
            per_device_batch_size=BATCH,
            train_dataloader_kwargs=UNSHUFFLED,
            create_scheduler_fn=schedule,
        )
    assert trainer.num_updates == 8  # the loop's count goes on either way
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.9**steps)


class CountingSGD(torch.optim.SGD):
    """SGD that also counts its steps in a Python int (state a skip cannot put back)."""

    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for parameter in group["params"]:
                state = self.state[parameter]
                state["count"] = state.get("count", 0) + 1
        return super().step(closure)


def test_skip_warns_of_optimizer_state_it_cannot_put_back() -> None:
    spikes = LossSpikeCallback("skip", factor=5.0, window=8, min_history=3)
    model = make_model()
    optimizer = CountingSGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(spikes,))
    with (
        pytest.warns(RuntimeWarning, match=r"optimizer state \['count'\] is held apart"),
        pytest.warns(RuntimeWarning, match="skipped 1 update"),
    ):
        trainer.train(
            spiked_dataset(),
            num_epochs=1,
            per_device_batch_size=BATCH,
            train_dataloader_kwargs=UNSHUFFLED,
        )
    assert spikes.skipped_updates == 1

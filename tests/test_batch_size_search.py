"""``Trainer.find_batch_size``: the largest batch that trains, everything put back bitwise."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from helpers import make_regression_dataset
from test_micro_batches import OutOfMemoryAbove
from torch import nn

from pytorch_accel import Trainer


def make(limit: int) -> Trainer:
    model = OutOfMemoryAbove(limit, in_backward=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=())


@pytest.mark.parametrize(
    ("mode", "limit", "found"),
    [("power", 37, 32), ("binsearch", 37, 37), ("binsearch", 3, 3)],
)
def test_the_search_finds_the_largest_batch_that_fits(mode: str, limit: int, found: int) -> None:
    trainer = make(limit)
    assert trainer.find_batch_size(make_regression_dataset(128), mode=mode) == found


def test_a_first_size_too_large_is_halved_until_one_fits() -> None:
    trainer = make(5)
    assert trainer.find_batch_size(make_regression_dataset(64), init_batch_size=48) == 3


def test_max_batch_size_caps_the_search() -> None:
    trainer = make(1_000)
    assert trainer.find_batch_size(make_regression_dataset(128), max_batch_size=20) == 20


def test_the_search_leaves_model_optimizer_scheduler_history_and_random_states_as_they_were() -> (
    None
):
    trainer = make(37)
    scheduler_fn = torch.optim.lr_scheduler.LambdaLR
    trainer.train(
        make_regression_dataset(32),
        num_epochs=1,
        per_device_batch_size=8,
        create_scheduler_fn=lambda optimizer: scheduler_fn(optimizer, lambda step: 0.9**step),
    )
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    optimizer_state = trainer.optimizer.state_dict()
    moments = {k: {n: t.clone() for n, t in s.items()} for k, s in optimizer_state["state"].items()}
    rates = [group["lr"] for group in trainer.optimizer.param_groups]
    scheduler, scheduler_state = trainer.scheduler, trainer.scheduler.state_dict()
    history = trainer.run_history.get_metric_values("train_loss_epoch")
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())

    assert trainer.find_batch_size(make_regression_dataset(128), mode="binsearch") == 37

    assert trainer.model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())
    after = trainer.optimizer.state_dict()["state"]
    assert after.keys() == moments.keys()
    for key, saved in moments.items():
        assert all(torch.equal(after[key][name], value) for name, value in saved.items())
    assert [group["lr"] for group in trainer.optimizer.param_groups] == rates
    assert trainer.scheduler is scheduler
    assert trainer.scheduler.state_dict() == scheduler_state
    assert trainer.run_history.get_metric_values("train_loss_epoch") == history
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    assert all(parameter.grad is None for parameter in trainer.model.parameters())


def test_the_found_size_trains_and_the_split_fallback_is_not_needed() -> None:
    trainer = make(37)
    size = trainer.find_batch_size(make_regression_dataset(128), mode="binsearch")
    trainer.train(make_regression_dataset(128), num_epochs=1, per_device_batch_size=size)
    assert trainer.num_updates == 4  # 128 samples in batches of 37


def test_nothing_fits_fails_clearly() -> None:
    trainer = make(0)
    with pytest.raises(RuntimeError, match="not even a batch of one sample fits"):
        trainer.find_batch_size(make_regression_dataset(64), init_batch_size=4)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "linear"}, ValueError, r"find_batch_size: mode must be 'power' or 'binsearch'"),
        ({"init_batch_size": 0}, ValueError, r"find_batch_size: init_batch_size must be"),
        ({"steps_per_trial": 1.5}, TypeError, r"find_batch_size: steps_per_trial must be"),
        ({"per_device_batch_size": 8}, ValueError, r"per_device_batch_size must be left out"),
        ({"on_oom": "split"}, ValueError, r"on_oom must be left out"),
    ],
)
def test_bad_search_arguments_are_refused(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make(8).find_batch_size(make_regression_dataset(64), **kwargs)


def test_a_stream_is_searched_in_updates() -> None:
    class Stream(torch.utils.data.IterableDataset[Any]):
        def __iter__(self) -> Any:
            yield from make_regression_dataset(256)

    assert make(20).find_batch_size(Stream(), max_batch_size=64, mode="binsearch") == 20


def test_out_of_memory_in_the_optimizer_step_counts_as_not_fitting() -> None:
    trainer = make(1_000)
    rows: list[int] = []
    trainer.model.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))

    def step(closure: Any = None) -> None:
        if rows[-1] > 24:
            raise torch.OutOfMemoryError("CUDA out of memory. (the optimizer's state)")

    trainer.optimizer.step = step  # type: ignore[method-assign]
    assert trainer.find_batch_size(make_regression_dataset(64), mode="binsearch") == 24

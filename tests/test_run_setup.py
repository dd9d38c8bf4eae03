"""Run set-up in train(): seeding and determinism, scaling the learning rate to the batch size."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import clone_params, make_regression_dataset, make_trainer
from torch import nn
from torch.optim.lr_scheduler import StepLR

from pytorch_accel import Trainer
from pytorch_accel._checkpointing.files import load_pickled
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.run_config import CUBLAS_WORKSPACE_CONFIG


@pytest.fixture(autouse=True)
def _restore_torch_flags() -> Iterator[None]:
    """Deterministic mode and cuDNN flags are process-wide: put them back after each test."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    if saved[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[3]


def dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


class NoisyData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Draws from NumPy and torch in __getitem__, so the seed reaches the data too."""

    def __init__(self) -> None:
        self.base = make_regression_dataset(48)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.base[index]
        noise = float(np.random.normal()) + float(torch.randn(()))
        return inputs + 0.01 * noise, targets


def seeded_run(model: nn.Module, **settings: Any) -> list[torch.Tensor]:
    trainer = make_trainer(copy.deepcopy(model))
    torch.manual_seed(1234 + len(settings))  # whatever came before: the seed decides
    trainer.train(
        NoisyData(),
        num_epochs=2,
        per_device_batch_size=4,
        train_dataloader_kwargs={"shuffle": True},
        **settings,
    )
    return clone_params(trainer.model)


def test_the_same_seed_gives_bitwise_the_same_run_and_another_seed_does_not() -> None:
    model = dropout_model()
    first, second = seeded_run(model, seed=3), seeded_run(model, seed=3, deterministic=True)
    other = seeded_run(model, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_deterministic_mode_sets_torch_cudnn_and_cublas() -> None:
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    torch.backends.cudnn.benchmark = True
    trainer = make_trainer()
    trainer.train(make_regression_dataset(16), num_epochs=1, seed=0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG
    trainer.train(make_regression_dataset(16), num_epochs=1, cudnn_benchmark=True)
    assert torch.backends.cudnn.benchmark


def test_the_set_up_is_recorded_in_the_run_config_and_the_training_state(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(32),
        num_epochs=1,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        seed=7,
        deterministic=True,
        auto_scale_lr=4,
    )
    config = trainer.run_config
    assert config is not None
    assert (config.seed, config.seed_per_rank, config.deterministic) == (7, False, True)
    assert (config.auto_scale_lr, config.lr_scale_factor) == (4, 2.0)
    assert config.to_dict()["seed"] == 7
    trainer.save_training_state(tmp_path / "state")
    shared = [load_pickled(path, "test") for path in (tmp_path / "state").glob("custom_*.pkl")]
    setups = [state["run_setup"] for state in shared if "run_setup" in state]
    assert setups == [
        {
            "seed": 7,
            "seed_per_rank": False,
            "deterministic": True,
            "cudnn_benchmark": None,
            "auto_scale_lr": 4,
            "lr_scale_factor": 2.0,
        }
    ]


class FirstLr(TrainerCallback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def test_lr_is_scaled_by_the_global_batch_once_per_run_and_never_compounded() -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    trainer.train(
        data,
        num_epochs=1,
        per_device_batch_size=4,
        gradient_accumulation_steps=4,
        auto_scale_lr=32,
    )
    assert seen.lrs == pytest.approx([0.2, 0.2, 0.05])
    assert trainer.run_config is not None
    assert trainer.run_config.lr_scale_factor == 0.5


def test_a_scheduler_starts_from_the_scaled_rate_in_every_run() -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    settings: dict[str, Any] = {
        "num_epochs": 1,
        "per_device_batch_size": 8,
        "auto_scale_lr": 2,
        "create_scheduler_fn": functools.partial(StepLR, step_size=1, gamma=0.5),
    }
    trainer.train(make_regression_dataset(32), **settings)
    trainer.train(make_regression_dataset(32), **settings)
    assert seen.lrs == pytest.approx([0.4, 0.4])


HALVING = functools.partial(StepLR, step_size=1, gamma=0.5)


def _set_lr(trainer: Trainer, lr: float) -> None:
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr


@pytest.mark.parametrize(
    "first",
    [
        {"auto_scale_lr": 4},
        {"create_scheduler_fn": HALVING},
        {"auto_scale_lr": 4, "create_scheduler_fn": HALVING},
    ],
    ids=["scaled", "scheduled", "scaled-and-scheduled"],
)
def test_a_rate_set_by_hand_between_calls_is_the_one_scaled(first: dict[str, Any]) -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, **first)
    _set_lr(trainer, 0.001)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, **{**first, "auto_scale_lr": 4})
    # was 0.2 or 0.2: the first call's rate came back, the user's 0.001 was lost
    assert seen.lrs[1:] == pytest.approx([0.002, 0.002])


@pytest.mark.parametrize("scaled", [False, True])
def test_a_rate_a_scheduler_left_is_not_the_one_scaled(scaled: bool) -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    data = make_regression_dataset(32)
    first = {"auto_scale_lr": 4} if scaled else {}
    trainer.train(data, num_epochs=2, per_device_batch_size=8, create_scheduler_fn=HALVING, **first)
    assert trainer.optimizer.param_groups[0]["lr"] < 0.01
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    assert seen.lrs[1] == pytest.approx(0.2)


def test_a_call_without_scaling_after_one_with_it_starts_from_the_users_rate() -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    trainer.train(data, num_epochs=1, per_device_batch_size=8)  # was 0.2 with factor 1.0
    assert trainer.run_config is not None
    assert trainer.run_config.lr_scale_factor == 1.0
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    _set_lr(trainer, 0.001)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, create_scheduler_fn=HALVING)
    assert seen.lrs == pytest.approx([0.2, 0.1, 0.2, 0.001])
    assert "unscaled_lr" not in trainer.optimizer.param_groups[0]


def test_a_dry_run_keeps_the_rate_set_by_hand() -> None:
    seen = FirstLr()
    trainer = make_trainer(callbacks=(seen,), lr=0.1)
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    _set_lr(trainer, 0.001)
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=2, dry_run=True)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.001
    trainer.train(data, num_epochs=1, per_device_batch_size=8, auto_scale_lr=4)
    assert seen.lrs == pytest.approx([0.2, 0.004, 0.002])


def test_scaling_needs_a_known_batch_size() -> None:
    data = make_regression_dataset(16)
    sampler = torch.utils.data.BatchSampler(range(16), batch_size=4, drop_last=False)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    with pytest.raises(ValueError, match="auto_scale_lr must be None when the train batch"):
        make_trainer().train(loader, num_epochs=1, auto_scale_lr=4)


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"seed": "3"}, TypeError, "seed must be an int or None"),
        ({"seed": -1}, ValueError, "seed must be in"),
        ({"seed": True}, TypeError, "seed must be an int or None"),
        ({"seed_per_rank": True}, ValueError, "seed_per_rank must be False without a seed"),
        ({"deterministic": 1}, TypeError, "deterministic must be True or False"),
        ({"cudnn_benchmark": "yes"}, TypeError, "cudnn_benchmark must be True, False or None"),
        (
            {"deterministic": True, "cudnn_benchmark": True},
            ValueError,
            "cudnn_benchmark must be False or None with deterministic=True",
        ),
        ({"auto_scale_lr": 0}, ValueError, "auto_scale_lr must be a positive int"),
    ],
)
def test_bad_set_up_arguments_are_refused_before_anything_runs(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    trainer = make_trainer()
    before = clone_params(trainer.model)
    with pytest.raises(error, match=match):
        trainer.train(make_regression_dataset(16), num_epochs=1, **settings)
    assert all(torch.equal(a, b) for a, b in zip(before, clone_params(trainer.model), strict=True))
    assert not torch.are_deterministic_algorithms_enabled()

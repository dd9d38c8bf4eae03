"""Resuming weights and position without the optimizer or the scheduler (fine-tuning)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset
from torch import nn
from torch.optim.lr_scheduler import StepLR

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.training_state import TrainingStateError

SETTINGS: dict[str, Any] = {
    "num_epochs": 2,
    "per_device_batch_size": 4,
    "create_scheduler_fn": functools.partial(StepLR, step_size=2, gamma=0.5),
}


class AtStart(TrainerCallback):
    """What the trainer holds when the resumed run starts (after the state was loaded)."""

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.params = clone_params(trainer.model)
        self.optimizer_state = dict(trainer.optimizer.state)
        self.num_updates = trainer.num_updates
        self.scheduler_epoch = trainer.scheduler.last_epoch
        self.lr = trainer.optimizer.param_groups[0]["lr"]


def trainer(optimizer: str, *callbacks: Any) -> Trainer:
    model = make_model()
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Trainer(model, nn.MSELoss(), opt, callbacks=callbacks)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, list[torch.Tensor]]:
    """A state saved at the end of epoch 1 (16 updates) by an SGD-with-momentum run."""
    first = trainer("sgd", SaveTrainingStateCallback(tmp_path, save_every_n_epochs=1))
    first.train(make_regression_dataset(64), **{**SETTINGS, "num_epochs": 1})
    return tmp_path / "epoch-0001", clone_params(first.model)


def test_full_resume_loads_the_optimizer_and_the_scheduler(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    directory, weights = saved
    seen = AtStart()
    trainer("sgd", seen).train(make_regression_dataset(64), **SETTINGS, resume_from=directory)
    assert all(torch.equal(a, b) for a, b in zip(seen.params, weights, strict=True))
    assert seen.num_updates == 16
    assert len(seen.optimizer_state) > 0  # the momentum buffers
    assert seen.scheduler_epoch == 16
    assert seen.lr == pytest.approx(0.05 * 0.5**8)


def test_without_optimizer_and_scheduler_weights_and_position_resume_fresh_ones_start(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    directory, weights = saved
    seen = AtStart()
    fine_tuned = trainer("adam", seen)  # another optimizer type: fine-tuning from the state
    fine_tuned.train(
        make_regression_dataset(64),
        **SETTINGS,
        resume_from=directory,
        resume_optimizer=False,
        resume_scheduler=False,
    )
    assert all(torch.equal(a, b) for a, b in zip(seen.params, weights, strict=True))
    assert seen.num_updates == 16  # the position is resumed: epoch 2 is the one left
    assert seen.optimizer_state == {}
    assert seen.scheduler_epoch == 0
    assert seen.lr == 0.01
    assert fine_tuned.num_updates == 32
    assert isinstance(fine_tuned.optimizer.optimizer, torch.optim.Adam)
    assert "betas" in fine_tuned.optimizer.param_groups[0]


def test_another_optimizer_type_needs_resume_optimizer_false(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    directory, _ = saved
    with pytest.raises(TrainingStateError, match="does not fit this trainer's model or optimizer"):
        trainer("adam").train(make_regression_dataset(64), **SETTINGS, resume_from=directory)


def test_without_the_scheduler_a_run_may_add_or_drop_one(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    directory, _ = saved
    settings = {**SETTINGS, "create_scheduler_fn": None}
    resumed = trainer("sgd")
    resumed.train(
        make_regression_dataset(64), **settings, resume_from=directory, resume_scheduler=False
    )
    assert resumed.num_updates == 32


def test_a_kept_optimizer_keeps_its_learning_rate_under_a_resumed_scheduler(
    saved: tuple[Path, list[torch.Tensor]],
) -> None:
    directory, _ = saved  # saved with lr 0.05 and StepLR(step_size=2, gamma=0.5)
    model = make_model()
    kept = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=1e-5))
    kept.train(
        make_regression_dataset(64), **SETTINGS, resume_from=directory, resume_optimizer=False
    )
    assert kept.scheduler.last_epoch == 32  # the schedule's position resumed, on the kept rate
    assert kept.scheduler.base_lrs == [1e-5]
    assert kept.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5 * 0.5**16)


@pytest.mark.parametrize("name", ["resume_optimizer", "resume_scheduler"])
def test_the_switches_need_a_state_to_resume_from(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be True without resume_from"):
        trainer("sgd").train(make_regression_dataset(16), num_epochs=1, **{name: False})
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        trainer("sgd").train(
            make_regression_dataset(16), num_epochs=1, resume_from="x", **{name: "no"}
        )

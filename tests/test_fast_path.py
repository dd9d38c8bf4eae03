"""The direct-call fast path and accelerate's wrapper path give the same weights."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from helpers import clone_params, hand_written_loop, make_model, make_trainer
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import TensorDataset

import pytorch_accel._state
from pytorch_accel import TrainerPlaceholderValues as P

UNSHUFFLED = {"shuffle": False}


def train(dataset: TensorDataset, **kwargs: object) -> list[torch.Tensor]:
    trainer = make_trainer(make_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
        trainer.train(
            dataset,
            num_epochs=2,
            per_device_batch_size=8,
            train_dataloader_kwargs=UNSHUFFLED,
            create_scheduler_fn=functools.partial(
                OneCycleLR,
                max_lr=0.05,
                epochs=P.NUM_EPOCHS,
                steps_per_epoch=P.NUM_UPDATE_STEPS_PER_EPOCH,
            ),
            **kwargs,
        )
    return clone_params(trainer.get_model())


def test_fast_path_is_used_where_the_wrapper_only_forwards(
    regression_dataset: TensorDataset,
) -> None:
    trainer = make_trainer()
    trainer.train(regression_dataset, num_epochs=1)
    assert trainer._preparation.direct_optimizer is trainer.optimizer.optimizer


@pytest.mark.parametrize("accumulation", [1, 3])
def test_both_paths_give_bitwise_equal_weights(
    monkeypatch: pytest.MonkeyPatch, regression_dataset: TensorDataset, accumulation: int
) -> None:
    fast = train(regression_dataset, gradient_accumulation_steps=accumulation, max_grad_norm=0.5)
    monkeypatch.setattr(pytorch_accel._state, "_FORWARDING_TYPES", frozenset())
    wrapped_trainer = make_trainer()
    wrapped_trainer.train(regression_dataset, num_epochs=1)
    assert (
        wrapped_trainer._preparation.direct_optimizer is None
    )  # really through accelerate's wrapper
    wrapped = train(regression_dataset, gradient_accumulation_steps=accumulation, max_grad_norm=0.5)
    for a, b in zip(fast, wrapped, strict=True):
        assert torch.equal(a, b)


def test_wrapper_path_matches_the_hand_written_loop(
    monkeypatch: pytest.MonkeyPatch, regression_dataset: TensorDataset
) -> None:
    monkeypatch.setattr(pytorch_accel._state, "_FORWARDING_TYPES", frozenset())
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=2)
    trainer = make_trainer(model)
    trainer.train(regression_dataset, num_epochs=2, train_dataloader_kwargs=UNSHUFFLED)
    for a, b in zip(trainer.get_model().parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)

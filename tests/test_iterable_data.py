"""IterableDatasets and runs counted in updates: real training against hand-written loops, a
mid-pass resume, evaluation every N updates, and clear errors for what cannot work."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    SaveAtStep,
    clone_params,
    make_model,
    make_regression_dataset,
    make_trainer,
)
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel import TrainerPlaceholderValues
from pytorch_accel.callbacks import StepBasedEvaluationCallback, TrainerCallback
from pytorch_accel.trainer import Trainer

DATA = make_regression_dataset(24)  # 6 batches of 4 per pass


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """The samples of DATA, reshuffled on every pass with torch's global generator."""

    def __init__(self, shuffle: bool = True, passes: int | None = None) -> None:
        self.shuffle, self.passes_left = shuffle, passes

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.passes_left is not None:  # a stream that runs dry after a number of passes
            if self.passes_left == 0:
                return
            self.passes_left -= 1
        inputs, targets = DATA.tensors
        order = torch.randperm(len(inputs)) if self.shuffle else torch.arange(len(inputs))
        for index in order.tolist():
            yield inputs[index], targets[index]


class Endless(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from zip(*DATA.tensors, strict=True)


def hand_written(model: nn.Module, updates: int, accumulation: int = 1) -> nn.Module:
    """The reference: passes through Stream(shuffle=False) until `updates`, as documented.

    A pass's last window, when shorter, is stepped with its gradients divided by the full
    window's size.
    """
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    done = 0
    while done < updates:
        batches = list(DataLoader(Stream(shuffle=False), batch_size=4))
        for index, (inputs, targets) in enumerate(batches):
            loss = nn.functional.mse_loss(model(inputs), targets) / accumulation
            loss.backward()
            if (index + 1) % accumulation == 0 or index + 1 == len(batches):
                optimizer.step()
                optimizer.zero_grad()
                done += 1
                if done == updates:
                    return model
    return model


@pytest.mark.parametrize(("updates", "accumulation"), [(10, 1), (7, 1), (4, 4), (5, 4)])
def test_a_stream_trains_like_a_hand_written_loop(updates: int, accumulation: int) -> None:
    model = make_model()
    reference = hand_written(model, updates, accumulation)
    trainer = make_trainer(model)
    trainer.train(
        Stream(shuffle=False),
        max_num_train_steps=updates,
        per_device_batch_size=4,
        gradient_accumulation_steps=accumulation,
    )
    assert trainer.num_updates == updates
    for got, expected in zip(clone_params(trainer.model), reference.parameters(), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_a_run_counted_in_updates_over_a_stream() -> None:
    trainer = make_trainer(make_model())
    trainer.train(Stream(), max_num_train_steps=10, per_device_batch_size=4)
    config = trainer.run_config
    assert config is not None
    assert (config.num_epochs, config.train_dataloader_len) == (None, None)
    assert (config.num_update_steps_per_epoch, config.total_num_update_steps) == (None, 10)
    assert config.train_dl_kwargs["shuffle"] is False  # a stream has no order to shuffle
    assert config.train_dl_kwargs["num_workers"] == 0  # workers would each yield the stream
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2  # 6 + 4 steps


def test_an_endless_stream_and_num_epochs_capping_the_passes() -> None:
    trainer = make_trainer(make_model())
    trainer.train(Endless(), max_num_train_steps=7, per_device_batch_size=4)
    assert trainer.num_updates == 7
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 1
    capped = make_trainer(make_model())
    capped.train(Stream(), num_epochs=1, max_num_train_steps=100, per_device_batch_size=4)
    assert capped.num_updates == 6  # one pass


def test_a_map_style_dataset_counted_in_updates() -> None:
    trainer = make_trainer(make_model())
    trainer.train(DATA, max_num_train_steps=10, per_device_batch_size=4)
    assert trainer.num_updates == 10
    assert trainer.run_config is not None
    assert trainer.run_config.num_epochs == 2
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


def test_a_dataloader_over_a_stream() -> None:
    trainer = make_trainer(make_model())
    trainer.train(DataLoader(Stream(), batch_size=3), max_num_train_steps=9)
    assert trainer.num_updates == 9  # 8 batches per pass


def test_placeholders_that_need_a_length_fail_clearly_and_the_total_works() -> None:
    per_epoch = functools.partial(
        torch.optim.lr_scheduler.StepLR,
        step_size=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
    )
    with pytest.raises(
        ValueError,
        match=r"NUM_UPDATE_STEPS_PER_EPOCH cannot be resolved.*"
        r"TOTAL_NUM_UPDATE_STEPS",
    ):
        make_trainer(make_model()).train(
            Stream(), max_num_train_steps=5, create_scheduler_fn=per_epoch
        )
    one_cycle = functools.partial(
        torch.optim.lr_scheduler.OneCycleLR,
        max_lr=0.1,
        total_steps=TrainerPlaceholderValues.TOTAL_NUM_UPDATE_STEPS,
    )
    trainer = make_trainer(make_model())
    trainer.train(Stream(), max_num_train_steps=8, create_scheduler_fn=one_cycle)
    assert trainer.scheduler.total_steps == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"train_dataset": Stream()},
            r"max_num_train_steps must be a positive int when "
            r"train_dataset has no length",
        ),
        ({"train_dataset": Stream(), "num_epochs": 2}, r"max_num_train_steps must be"),
        (
            {"train_dataset": DATA},
            r"num_epochs must be a positive int when "
            r"max_num_train_steps is not given",
        ),
    ],
)
def test_a_run_without_a_length_or_budget_is_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"Trainer\.train: {match}"):
        make_trainer(make_model()).train(**kwargs)


def test_a_stream_that_runs_dry_is_named() -> None:
    trainer = make_trainer(make_model())
    with pytest.raises(
        ValueError,
        match=r"train_dataset must be data that yields batches on "
        r"every pass.*Epoch 2 got no batch",
    ):
        trainer.train(Stream(passes=1), max_num_train_steps=20, per_device_batch_size=4)


def test_a_budget_reached_inside_a_pass_ends_the_run_with_no_empty_pass() -> None:
    trainer = make_trainer(make_model())
    trainer.train(Stream(), num_epochs=5, max_num_train_steps=8, per_device_batch_size=4)
    assert trainer.num_updates == 8  # 6 + 2 updates: two passes, then the budget is spent
    losses = trainer.run_history.get_metric_values("train_loss_epoch")
    assert len(losses) == 2
    assert all(loss == loss for loss in losses)  # no NaN of an empty pass
    assert trainer.stopped_by is None


@pytest.mark.parametrize("num_epochs", [None, 3])
def test_an_empty_stream_is_an_error_naming_the_dataset(num_epochs: int | None) -> None:
    trainer = make_trainer(make_model())
    with pytest.raises(ValueError, match=r"train_dataset must be.*Epoch 1 got no batch.*empty"):
        trainer.train(
            Stream(passes=0), num_epochs=num_epochs, max_num_train_steps=5, per_device_batch_size=4
        )


def stream_run(*callbacks: TrainerCallback, resume_from: Path | None = None) -> Trainer:
    torch.manual_seed(5)
    trainer = make_trainer(make_model(), callbacks=callbacks)
    trainer.train(
        Stream(),  # reshuffled every pass from torch's generator
        max_num_train_steps=8,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        resume_from=resume_from,
    )
    return trainer


@pytest.mark.parametrize("step", [3, 8, 13])  # mid pass 1, mid pass 2 (twice)
def test_a_resume_in_the_middle_of_a_pass_is_exact(tmp_path: Path, step: int) -> None:
    uninterrupted = stream_run()
    stream_run(SaveAtStep(tmp_path / "state", step))
    resumed = stream_run(resume_from=tmp_path / "state")
    assert resumed.num_updates == 8
    for got, expected in zip(
        clone_params(resumed.model), clone_params(uninterrupted.model), strict=True
    ):
        assert torch.equal(got, expected)
    assert resumed.run_history.state_dict() == uninterrupted.run_history.state_dict()


def test_evaluating_every_n_updates_over_a_stream() -> None:
    trainer = make_trainer(make_model(), callbacks=(StepBasedEvaluationCallback(4),))
    trainer.train(
        Endless(),
        max_num_train_steps=12,
        eval_dataset=make_regression_dataset(8, seed=1),
        per_device_batch_size=4,
    )
    history = trainer.run_history
    assert len(history.get_metric_values("intermediate_eval_loss")) == 3
    assert len(history.get_metric_values("eval_loss_epoch")) == 1  # after the run's one pass


def test_a_dry_run_over_a_stream_and_no_overfitting_one() -> None:
    trainer = make_trainer(make_model())
    before = clone_params(trainer.model)
    trainer.train(Endless(), max_num_train_steps=100, per_device_batch_size=4, dry_run=True)
    assert all(torch.equal(a, b) for a, b in zip(before, clone_params(trainer.model), strict=True))
    with pytest.raises(
        ValueError,
        match=r"overfit_batches must be None when train_dataset is an "
        r"IterableDataset",
    ):
        trainer.train(Stream(), max_num_train_steps=4, overfit_batches=2)

"""Placeholders: arithmetic, resolution inside partials, and schedules that end exactly."""

from __future__ import annotations

import functools
from collections import namedtuple

import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from torch.optim.lr_scheduler import MultiStepLR, OneCycleLR, StepLR

from pytorch_accel import Trainer
from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.placeholders import contains_placeholder, resolve_placeholders

VALUES = {
    P.NUM_EPOCHS: 3,
    P.NUM_UPDATE_STEPS_PER_EPOCH: 10,
    P.TOTAL_NUM_UPDATE_STEPS: 30,
    P.TRAIN_DATALOADER_LEN: 20,
    P.EVAL_DATALOADER_LEN: None,
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (2 * P.NUM_UPDATE_STEPS_PER_EPOCH, 20),
        (P.NUM_UPDATE_STEPS_PER_EPOCH * 7, 70),
        (P.NUM_EPOCHS + 1, 4),
        (1 + P.NUM_EPOCHS, 4),
        (P.NUM_UPDATE_STEPS_PER_EPOCH - 1, 9),
        (100 - P.NUM_UPDATE_STEPS_PER_EPOCH, 90),
        ((P.NUM_UPDATE_STEPS_PER_EPOCH - 1) // 2, 4),
        (100 // P.NUM_UPDATE_STEPS_PER_EPOCH, 10),
        (P.TRAIN_DATALOADER_LEN / 8, 2.5),
        (60 / P.NUM_UPDATE_STEPS_PER_EPOCH, 6.0),
        (P.NUM_EPOCHS * P.NUM_UPDATE_STEPS_PER_EPOCH, 30),
        ((P.NUM_EPOCHS * 2 + 1) * (P.NUM_UPDATE_STEPS_PER_EPOCH - 5) // 3, 11),
        (P.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH, 10),
    ],
)
def test_arithmetic_works_both_ways_and_chains(expression: object, expected: float) -> None:
    assert resolve_placeholders(expression, VALUES) == expected


def test_resolution_reaches_nested_partials_and_containers() -> None:
    Pair = namedtuple("Pair", "a b")
    inner = functools.partial(dict, steps=P.TOTAL_NUM_UPDATE_STEPS)
    outer = functools.partial(
        lambda *args, **kwargs: (args, kwargs),
        P.NUM_EPOCHS,
        inner,
        milestones=[P.NUM_UPDATE_STEPS_PER_EPOCH, 2 * P.NUM_UPDATE_STEPS_PER_EPOCH],
        pair=Pair(P.NUM_EPOCHS, 1),
        mapping={"n": P.TRAIN_DATALOADER_LEN},
    )
    assert contains_placeholder(outer)
    resolved = resolve_placeholders(outer, VALUES)
    assert not contains_placeholder(resolved)
    args, kwargs = resolved()
    assert args[0] == 3
    assert args[1]() == {"steps": 30}
    assert kwargs == {"milestones": [10, 20], "pair": Pair(3, 1), "mapping": {"n": 20}}


def test_placeholders_are_not_evaluated_as_strings() -> None:
    assert repr((P.NUM_UPDATE_STEPS_PER_EPOCH - 1) // 2) == (
        "((TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH - 1) // 2)"
    )
    with pytest.raises(TypeError):
        P.NUM_EPOCHS + "1"  # type: ignore[operator]


def test_eval_dataloader_len_without_eval_set_is_a_clear_error() -> None:
    trainer = make_trainer()
    scheduler_fn = functools.partial(StepLR, step_size=P.EVAL_DATALOADER_LEN)
    with pytest.raises(
        ValueError, match=r"EVAL_DATALOADER_LEN cannot be resolved.*without an eval"
    ):
        trainer.train(make_regression_dataset(16), num_epochs=1, create_scheduler_fn=scheduler_fn)


def test_placeholder_hidden_from_the_trainer_is_reported() -> None:
    def factory(optimizer: torch.optim.Optimizer) -> StepLR:
        scheduler = StepLR(optimizer, step_size=1)
        scheduler.hidden = [P.NUM_EPOCHS]  # type: ignore[attr-defined]
        return scheduler

    trainer = make_trainer()
    with pytest.raises(ValueError, match=r"StepLR.hidden holds the unresolved placeholder"):
        trainer.train(make_regression_dataset(16), num_epochs=1, create_scheduler_fn=factory)


def one_cycle() -> functools.partial[OneCycleLR]:
    return functools.partial(
        OneCycleLR, max_lr=0.1, epochs=P.NUM_EPOCHS, steps_per_epoch=P.NUM_UPDATE_STEPS_PER_EPOCH
    )


class LrLog(TrainerCallback):
    """The learning rate each optimizer update used."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: object) -> None:
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def test_one_cycle_runs_to_its_last_step_with_accumulation_and_a_second_call() -> None:
    log = LrLog()
    trainer = make_trainer(callbacks=(log,))
    # 50 samples / 4 = 13 batches; accumulation 3 -> 5 updates per epoch (last window of 1)
    trainer.train(
        make_regression_dataset(50),
        num_epochs=3,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        create_scheduler_fn=one_cycle(),
    )
    scheduler = trainer.scheduler
    assert scheduler.last_epoch == scheduler.total_steps == 15
    assert len(log.lrs) == 15
    assert log.lrs[-1] == pytest.approx(0.1 / 25 / 1e4)  # the last update uses the minimum
    assert max(log.lrs) == pytest.approx(0.1, rel=0.05)

    trainer.train(
        make_regression_dataset(24),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=one_cycle(),
        reset_run_history=False,
    )
    assert trainer.scheduler.last_epoch == trainer.scheduler.total_steps == 12
    assert log.lrs[-1] == pytest.approx(0.1 / 25 / 1e4)


def test_one_cycle_with_max_steps_uses_total_updates() -> None:
    trainer = make_trainer()
    scheduler_fn = functools.partial(OneCycleLR, max_lr=0.1, total_steps=P.TOTAL_NUM_UPDATE_STEPS)
    trainer.train(
        make_regression_dataset(40),
        num_epochs=10,
        per_device_batch_size=4,
        max_num_train_steps=25,
        create_scheduler_fn=scheduler_fn,
    )
    assert trainer.scheduler.last_epoch == trainer.scheduler.total_steps == 25


def test_step_lr_with_placeholder_multiple() -> None:
    trainer = make_trainer(lr=1.0)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=4,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(
            MultiStepLR, milestones=[P.NUM_UPDATE_STEPS_PER_EPOCH * 2], gamma=0.5
        ),
    )
    assert trainer.optimizer.param_groups[0]["lr"] == 0.5

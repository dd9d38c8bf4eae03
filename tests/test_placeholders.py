"""Placeholders: arithmetic, resolution inside partials, and schedules that end exactly."""

from __future__ import annotations

import functools
from collections import namedtuple
from typing import Any

import pytest
import torch
from helpers import clone_params, make_regression_dataset, make_trainer
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


@pytest.mark.bad_input
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


def _period(optimizer: torch.optim.Optimizer, period=10) -> StepLR:  # type: ignore[no-untyped-def]
    """Unannotated, with an int default: the parameter takes an int."""
    return StepLR(optimizer, step_size=period)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (
            functools.partial(StepLR, step_size=P.NUM_UPDATE_STEPS_PER_EPOCH / 3),
            r"StepLR argument step_size must be an int, got 1.333\d* \(float\) from the "
            r"placeholder expression \(TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH / 3\)"
            r"\. Use // instead of / .*NUM_UPDATE_STEPS_PER_EPOCH // 3\)",
        ),
        (
            functools.partial(
                functools.partial(StepLR, gamma=0.5), step_size=P.TOTAL_NUM_UPDATE_STEPS * 0.3
            ),
            r"StepLR argument step_size must be an int, got 2.4",
        ),
        (
            functools.partial(MultiStepLR, milestones=[2, P.TOTAL_NUM_UPDATE_STEPS / 3]),
            r"MultiStepLR argument milestones must hold ints, got 2.666",
        ),
        (
            functools.partial(_period, period=P.NUM_UPDATE_STEPS_PER_EPOCH / 3),
            r"_period argument period must be an int, got 1.333",
        ),
    ],
    ids=["step_size", "nested", "milestones", "int-default"],
)
def test_a_fractional_expression_for_an_int_argument_is_refused(
    factory: functools.partial[Any], match: str
) -> None:
    # was accepted: StepLR(step_size=1.333) decays at no update, MultiStepLR never reaches 2.667
    trainer = make_trainer()
    before = clone_params(trainer.model)
    with pytest.raises(ValueError, match=rf"Trainer.train: create_scheduler_fn's {match}"):
        trainer.train(
            make_regression_dataset(16),
            num_epochs=2,
            per_device_batch_size=4,
            create_scheduler_fn=factory,
        )
    assert all(torch.equal(a, b) for a, b in zip(before, clone_params(trainer.model), strict=True))


def test_a_whole_expression_for_an_int_argument_becomes_an_int() -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(16),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(
            StepLR, step_size=P.NUM_UPDATE_STEPS_PER_EPOCH / 2, gamma=0.5
        ),
    )
    assert trainer.scheduler.step_size == 2
    assert type(trainer.scheduler.step_size) is int  # was 2.0


def test_a_fractional_expression_for_a_float_argument_is_kept() -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(16),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(
            OneCycleLR,
            max_lr=0.1,
            total_steps=P.TOTAL_NUM_UPDATE_STEPS,
            pct_start=P.NUM_UPDATE_STEPS_PER_EPOCH / (P.TOTAL_NUM_UPDATE_STEPS * 2),
        ),
    )
    assert trainer.scheduler._schedule_phases[0]["end_step"] == 0.25 * 8 - 1

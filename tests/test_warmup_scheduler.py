"""LRWarmupScheduler: the documented rate of every update, around torch and our schedulers."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import LearningRateRecorder, make_regression_dataset, make_trainer
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, ReduceLROnPlateau, StepLR

from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.schedulers import CosineLrScheduler, LRWarmupScheduler


def make_optimizer(*lrs: float) -> torch.optim.Optimizer:
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0])


def used_rates(scheduler: LRWarmupScheduler, num_updates: int) -> list[list[float]]:
    """The rates of updates 1..num_updates with the trainer's protocol: step() after each."""
    used = []
    for _ in range(num_updates):
        used.append([group["lr"] for group in scheduler.optimizer.param_groups])
        scheduler.optimizer.step()
        scheduler.step()
    return used


def step_lr(update: int, base: float) -> float:
    """StepLR(step_size=3, gamma=0.5) for the 1-based update, written out."""
    return base * 0.5 ** ((update - 1) // 3)


@pytest.mark.parametrize("mode", ["linear", "factor", "constant"])
def test_each_mode_gives_the_documented_rate_around_a_chainable_torch_scheduler(
    mode: Any,
) -> None:
    optimizer = make_optimizer(0.1, 0.4)
    warmup_lr = 0.02 if mode == "constant" else None
    scheduler = LRWarmupScheduler(
        optimizer,
        functools.partial(StepLR, step_size=3, gamma=0.5),
        warmup_steps=4,
        mode=mode,
        warmup_factor=0.25,
        warmup_lr=warmup_lr,
    )
    used = used_rates(scheduler, 10)
    for update, rates in enumerate(used, start=1):
        for rate, base in zip(rates, (0.1, 0.4), strict=True):
            regular = step_lr(update, base)
            if update > 4:
                expected = regular
            elif mode == "linear":
                alpha = (update - 1) / 4
                expected = regular * (0.25 * (1 - alpha) + alpha)
            elif mode == "factor":
                expected = regular * 0.25
            else:
                expected = 0.02
            assert math.isclose(rate, expected, rel_tol=1e-12), (update, rate, expected)


def test_no_warmup_and_no_scheduler_keeps_the_optimizer_rates() -> None:
    scheduler = LRWarmupScheduler(make_optimizer(0.3), warmup_steps=0)
    assert used_rates(scheduler, 3) == [[0.3]] * 3
    linear = LRWarmupScheduler(make_optimizer(0.3), warmup_steps=2, warmup_factor=0.5)
    assert [rates[0] for rates in used_rates(linear, 4)] == pytest.approx([0.15, 0.225, 0.3, 0.3])


def test_state_dict_round_trip_mid_warmup_continues_the_same_rates() -> None:
    def build() -> LRWarmupScheduler:
        return LRWarmupScheduler(
            make_optimizer(0.1),
            functools.partial(CosineAnnealingLR, T_max=12),
            warmup_steps=5,
        )

    reference = build()
    expected = used_rates(reference, 12)
    first = build()
    used_rates(first, 3)
    state = first.state_dict()
    saved_lr = first.optimizer.state_dict()
    second = build()
    second.optimizer.load_state_dict(saved_lr)
    second.load_state_dict(state)
    assert second.num_updates == 3
    assert used_rates(second, 9) == expected[3:]


def test_state_from_other_settings_is_refused() -> None:
    state = LRWarmupScheduler(make_optimizer(0.1), warmup_steps=5).state_dict()
    other = LRWarmupScheduler(make_optimizer(0.1), warmup_steps=6)
    with pytest.raises(ValueError, match=r"state_dict\['warmup_steps'\] must be 6"):
        other.load_state_dict(state)


class RecordScheduler(TrainerCallback):
    def __init__(self) -> None:
        self.scheduler: Any = None

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.scheduler = trainer.scheduler


def test_trainer_resolves_placeholders_in_the_warmup_and_the_wrapped_scheduler() -> None:
    recorder, seen = LearningRateRecorder(), RecordScheduler()
    trainer = make_trainer(callbacks=(recorder, seen), lr=0.2)
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        per_device_batch_size=8,  # 4 updates per epoch, 12 in all
        create_scheduler_fn=LRWarmupScheduler.create_scheduler_fn(
            functools.partial(CosineAnnealingLR, T_max=P.TOTAL_NUM_UPDATE_STEPS),  # type: ignore[arg-type]
            warmup_steps=P.NUM_UPDATE_STEPS_PER_EPOCH,
            warmup_factor=0.1,
        ),
    )
    assert seen.scheduler.warmup_steps == 4
    assert seen.scheduler.scheduler.T_max == 12
    for update, rate in enumerate(recorder.first_group, start=1):
        regular = 0.2 * (1 + math.cos(math.pi * (update - 1) / 12)) / 2
        factor = 0.1 * (1 - (update - 1) / 4) + (update - 1) / 4 if update <= 4 else 1.0
        assert math.isclose(rate, regular * factor, rel_tol=1e-9), update


def test_wraps_our_cosine_scheduler_and_resumes_in_train(tmp_path: Path) -> None:
    dataset = make_regression_dataset(32)
    create = LRWarmupScheduler.create_scheduler_fn(
        CosineLrScheduler.create_scheduler_fn(lr_min=0.0),
        warmup_steps=P.TOTAL_NUM_UPDATE_STEPS // 3,
        mode="factor",
        warmup_factor=0.5,
    )
    settings: dict[str, Any] = {"per_device_batch_size": 8, "create_scheduler_fn": create}
    whole = LearningRateRecorder()
    saver = SaveTrainingStateCallback(tmp_path, save_every_n_epochs=1, preemption_signals=())
    make_trainer(callbacks=(whole, saver)).train(dataset, num_epochs=3, **settings)
    resumed_rates = LearningRateRecorder()
    second = make_trainer(callbacks=(resumed_rates,))
    second.train(dataset, num_epochs=3, resume_from=tmp_path / "epoch-0001", **settings)
    assert resumed_rates.lrs == whole.lrs[4:]  # the epoch saved above holds 4 updates


def test_bad_arguments_name_the_argument_and_the_fix() -> None:
    optimizer = make_optimizer(0.1)
    with pytest.raises(ValueError, match="mode must be one of"):
        LRWarmupScheduler(optimizer, warmup_steps=2, mode="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="warmup_lr must be None unless"):
        LRWarmupScheduler(optimizer, warmup_steps=2, warmup_lr=0.1)
    with pytest.raises(TypeError, match="warmup_lr must be a number"):
        LRWarmupScheduler(optimizer, warmup_steps=2, mode="constant")
    with pytest.raises(ValueError, match="warmup_factor must be in"):
        LRWarmupScheduler(optimizer, warmup_steps=2, warmup_factor=2.0)
    with pytest.raises(TypeError, match="Divide placeholders with //"):
        LRWarmupScheduler.create_scheduler_fn(warmup_steps=P.TOTAL_NUM_UPDATE_STEPS / 10)
    with pytest.raises(TypeError, match="warmup_steps must be an int"):
        LRWarmupScheduler(optimizer, warmup_steps=P.NUM_EPOCHS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scheduler must be a function"):
        LRWarmupScheduler(optimizer, StepLR(optimizer, 3), warmup_steps=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ReduceLROnPlateau steps on a metric"):
        LRWarmupScheduler(optimizer, ReduceLROnPlateau, warmup_steps=2)

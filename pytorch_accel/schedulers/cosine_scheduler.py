"""Cosine learning-rate decay with optional linear warmup and a cooldown at the minimum.

Which learning rate each update uses (updates counted from 1 to `N`, with `W` warmup, `C`
cooldown and `D = N - W - C` cosine updates):

- warmup, `1 <= k <= W`: linear from the warmup start (update 1) towards the base LR, which the
  line reaches at update `W + 1`;
- cosine, `W < k <= W + D`: `lr_min + (base - lr_min) * (1 + cos(pi * p**k_decay)) / 2` with
  `p = (k - W - 1) / (D - 1)`: the base LR at the first cosine update, exactly `lr_min` at the
  last (a one-update cosine phase uses `lr_min`);
- cooldown, `k > W + D`: exactly `lr_min`.

So the last update of the run uses exactly `lr_min`, and stepping past the end keeps it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import torch

from pytorch_accel._checks import (
    check_count,
    check_fraction,
    check_group_bound,
    check_number,
    fail,
)
from pytorch_accel.placeholders import (
    PlaceholderExpression,
    TrainerPlaceholderValues,
    contains_placeholder,
)
from pytorch_accel.schedulers.scheduler_base import StatefulSchedulerBase, interpolate

__all__ = ["CosineLrScheduler"]

IntOrPlaceholder = int | TrainerPlaceholderValues | PlaceholderExpression


class _Alias:
    """An attribute under pytorch-accelerated's name, reading and writing ours."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self if instance is None else getattr(instance, self.name)

    def __set__(self, instance: object, value: Any) -> None:
        setattr(instance, self.name, value)


_RENAMED = {
    "total_iterations": "total_num_updates",
    "warmup_iterations": "num_warmup_updates",
    "num_cooldown_iterations": "num_cooldown_updates",
    "warmup_lr_init": "warmup_starting_lr",
    "warmup_lr_ratio": "warmup_starting_lr_ratio",
    "lr_min_ratio": "min_lr_ratio",
    "lr_min": "lr_min",
    "k_decay": "k_decay",
}
"""pytorch-accelerated's attribute and state-dict names, and ours."""


class CosineLrScheduler(StatefulSchedulerBase):
    """Cosine annealing (SGDR without restarts) with warmup, cooldown and k-decay.

    See the module docstring for the exact value of every update. `k_decay` (from
    [k-decay](https://arxiv.org/abs/2004.05909)) above 1 keeps the LR high for longer.

    Args:
        optimizer: The optimizer; each group's `lr` (or `initial_lr`) is its base LR.
        total_num_epochs: Epochs of the run, warmup and cooldown included.
        num_update_steps_per_epoch: Optimizer updates per epoch.
        k_decay: Exponent of the cosine progress, > 0.
        lr_min: The final LR of every group.
        min_lr_ratio: If given, each group's final LR is `min_lr_ratio * base` instead.
        num_warmup_epochs: Epochs of linear warmup.
        warmup_starting_lr: The LR of the first warmup update, for every group.
        warmup_starting_lr_ratio: If given, each group starts at `ratio * base` instead.
        num_cooldown_epochs: Epochs at the final LR after the cosine phase.

    Raises:
        TypeError: If an argument has the wrong type (e.g. an unresolved placeholder).
        ValueError: If an argument is out of range, warmup and cooldown leave no cosine
            epoch, or `lr_min` / `warmup_starting_lr` exceed a group's base LR.

    Example:
        ```python
        trainer.train(
            train_dataset,
            num_epochs=10,
            gradient_accumulation_steps=4,
            create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1),
        )
        ```
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_epochs: int,
        num_update_steps_per_epoch: int,
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: int = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: int = 0,
    ) -> None:
        arguments = {
            "total_num_epochs": total_num_epochs,
            "num_update_steps_per_epoch": num_update_steps_per_epoch,
            "k_decay": k_decay,
            "lr_min": lr_min,
            "min_lr_ratio": min_lr_ratio,
            "num_warmup_epochs": num_warmup_epochs,
            "warmup_starting_lr": warmup_starting_lr,
            "warmup_starting_lr_ratio": warmup_starting_lr_ratio,
            "num_cooldown_epochs": num_cooldown_epochs,
        }
        _check_arguments("CosineLrScheduler", arguments, resolved=True)
        super().__init__(optimizer, "lr")
        steps = num_update_steps_per_epoch
        self.total_num_updates = total_num_epochs * steps
        self.num_warmup_updates = num_warmup_epochs * steps
        self.num_cooldown_updates = num_cooldown_epochs * steps
        self.k_decay = float(k_decay)
        self.lr_min = float(lr_min)
        self.min_lr_ratio = None if min_lr_ratio is None else float(min_lr_ratio)
        self.warmup_starting_lr = float(warmup_starting_lr)
        ratio = warmup_starting_lr_ratio
        self.warmup_starting_lr_ratio = None if ratio is None else float(ratio)
        self._check_groups()
        self.step_update(0)

    # pytorch-accelerated's names for the same attributes
    total_iterations = _Alias("total_num_updates")
    warmup_iterations = _Alias("num_warmup_updates")
    num_cooldown_iterations = _Alias("num_cooldown_updates")
    warmup_lr_init = _Alias("warmup_starting_lr")
    warmup_lr_ratio = _Alias("warmup_starting_lr_ratio")
    lr_min_ratio = _Alias("min_lr_ratio")

    def translate_state_dict(self, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
        """Translate a state saved by pytorch-accelerated's ``CosineLrScheduler`` (its keys).

        Its update count is one less after the same number of steps (it starts at -1); the
        base LRs are this scheduler's (that state does not hold them).
        """
        if "total_iterations" not in state_dict:
            return state_dict
        renamed = {ours: state_dict[theirs] for theirs, ours in _RENAMED.items()}
        return {
            **self.state_dict(),
            **renamed,
            "_num_updates": int(state_dict["num_updates"]) + 1,
        }

    @property
    def num_cosine_updates(self) -> int:
        """Updates in the cosine phase: the run minus warmup and cooldown."""
        return self.total_num_updates - self.num_warmup_updates - self.num_cooldown_updates

    def final_value(self, base: float) -> float:
        """Return the final LR of a group with base LR `base`."""
        return self.lr_min if self.min_lr_ratio is None else self.min_lr_ratio * base

    def warmup_start(self, base: float) -> float:
        """Return the LR of the first warmup update of a group with base LR `base`."""
        ratio = self.warmup_starting_lr_ratio
        return self.warmup_starting_lr if ratio is None else ratio * base

    def get_updated_values(self, num_updates: int) -> list[float]:
        """Return each group's LR for update `num_updates + 1` (the last one past the end)."""
        update = min(num_updates + 1, self.total_num_updates)
        return [self._lr(update, base) for base in self.base_values]

    def _lr(self, update: int, base: float) -> float:
        warmup, cosine = self.num_warmup_updates, self.num_cosine_updates
        if update <= warmup:
            return interpolate(self.warmup_start(base), base, (update - 1) / warmup)
        if update > warmup + cosine:
            return self.final_value(base)
        progress = (update - warmup - 1) / (cosine - 1) if cosine > 1 else 1.0
        weight = 0.5 * (1.0 - math.cos(math.pi * progress**self.k_decay))
        return interpolate(base, self.final_value(base), weight)

    def _check_groups(self) -> None:
        where, bases = "CosineLrScheduler", self.base_values
        minimums = [self.final_value(base) for base in bases]
        fix = "Lower lr_min, or pass min_lr_ratio to set each group's minimum relative to its LR."
        check_group_bound(where, "lr_min", minimums, bases, fix)
        if self.num_warmup_updates:
            starts = [self.warmup_start(base) for base in bases]
            fix = "Lower warmup_starting_lr, or pass warmup_starting_lr_ratio."
            check_group_bound(where, "warmup_starting_lr", starts, bases, fix)

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: IntOrPlaceholder = TrainerPlaceholderValues.NUM_EPOCHS,
        num_update_steps_per_epoch: IntOrPlaceholder = (
            TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH
        ),
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: IntOrPlaceholder = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: IntOrPlaceholder = 0,
    ) -> functools.partial[CosineLrScheduler]:
        """Return `optimizer -> CosineLrScheduler`, for `Trainer.train(create_scheduler_fn=...)`.

        The arguments are the class's. The epoch and update counts default to placeholders
        that the trainer fills in; the others are checked now, so a mistake fails before
        training starts.
        """
        arguments: dict[str, Any] = {
            "total_num_epochs": total_num_epochs,
            "num_update_steps_per_epoch": num_update_steps_per_epoch,
            "k_decay": k_decay,
            "lr_min": lr_min,
            "min_lr_ratio": min_lr_ratio,
            "num_warmup_epochs": num_warmup_epochs,
            "warmup_starting_lr": warmup_starting_lr,
            "warmup_starting_lr_ratio": warmup_starting_lr_ratio,
            "num_cooldown_epochs": num_cooldown_epochs,
        }
        _check_arguments("CosineLrScheduler.create_scheduler_fn", arguments, resolved=False)
        return functools.partial(cls, **arguments)


def _check_arguments(where: str, arguments: dict[str, Any], *, resolved: bool) -> None:
    """Check every argument; `resolved` means placeholders are no longer allowed."""
    for name, minimum in _COUNTS.items():
        check_count(where, name, arguments[name], minimum=minimum, resolved=resolved)
    check_number(where, "k_decay", arguments["k_decay"], strict=True)
    check_number(where, "lr_min", arguments["lr_min"])
    check_number(where, "warmup_starting_lr", arguments["warmup_starting_lr"])
    check_fraction(where, "min_lr_ratio", arguments["min_lr_ratio"], allow_none=True)
    ratio = arguments["warmup_starting_lr_ratio"]
    check_fraction(where, "warmup_starting_lr_ratio", ratio, allow_none=True)
    total = arguments["total_num_epochs"]
    warmup, cooldown = arguments["num_warmup_epochs"], arguments["num_cooldown_epochs"]
    if any(contains_placeholder(value) for value in (total, warmup, cooldown)):
        return
    if warmup + cooldown >= total:
        fail(
            ValueError,
            where,
            "num_warmup_epochs + num_cooldown_epochs",
            warmup + cooldown,
            f"< total_num_epochs ({total}), leaving at least one epoch of cosine decay",
            "Shorten the warmup or the cooldown, or train for more epochs.",
        )


_COUNTS = {
    "total_num_epochs": 1,
    "num_update_steps_per_epoch": 1,
    "num_warmup_epochs": 0,
    "num_cooldown_epochs": 0,
}
"""The integer arguments and their smallest accepted values."""

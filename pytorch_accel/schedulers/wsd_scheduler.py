"""Warmup-stable-decay (WSD) learning rates, with a decay before every checkpoint.

From [Understanding Warmup-Stable-Decay Learning Rates](https://arxiv.org/abs/2410.05192).
Updates are counted from 1 to `N` (`total_steps`). The run is split into periods that end at
the checkpoint steps `c_1 < ... < c_n = N`. Each period ends with `D_i = max(1,
floor(L_i * decay_phase_ratio))` decay updates (`L_i`: the period's length); the others are
stable. With `W` warmup updates and base LR `b`, update `k` uses:

- warmup, `k <= W`: linear from `warmup_starting_lr` (update 1) towards `b`;
- stable: `b`;
- decay, `k = c_i - D_i + j` for `j = 1..D_i`, with `t = j / D_i`:
  `b * (r + (1 - r) * (1 - sqrt(t)))` (sqrt decay, the default) or
  `b * r / (t + (1 - t) * r)` (the paper's inverse-proportional decay), where `r = lr_min`
  is a *fraction of the base LR*. The last update of each period, `c_i`, uses exactly `b * r`.

The next period starts stable again at `b`. The last update of the run, `N`, is the last of
the final decay and uses exactly `b * r`; stepping past the end keeps that value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, cast

import torch

from pytorch_accel._checks import (
    check_count,
    check_fraction,
    check_group_bound,
    check_number,
    fail,
)
from pytorch_accel.placeholders import PlaceholderExpression, TrainerPlaceholderValues
from pytorch_accel.schedulers.scheduler_base import (
    StatefulSchedulerBase,
    _one_state,
    interpolate,
)

__all__ = ["WSDLrScheduler", "estimate_checkpoint_steps"]

IntOrPlaceholder = int | TrainerPlaceholderValues | PlaceholderExpression


def estimate_checkpoint_steps(total_steps: int, num_checkpoints: int = 3) -> list[int]:
    """Return checkpoint steps doubling up to `total_steps`: `N / 2**(n-1), ..., N / 2, N`.

    Rounded down, e.g. 3 checkpoints of 200,000 steps: `[50000, 100000, 200000]`. The last one
    is always `total_steps`, so the final decay ends with the run.

    Args:
        total_steps: Optimizer updates in the run.
        num_checkpoints: How many checkpoints; at most `1 + log2(total_steps)`.

    Returns:
        Strictly increasing update numbers, the last being `total_steps`.

    Raises:
        ValueError: If the run is too short for that many distinct checkpoints.
    """
    where = "estimate_checkpoint_steps"
    check_count(where, "total_steps", total_steps, minimum=1)
    check_count(where, "num_checkpoints", num_checkpoints, minimum=1)
    if total_steps < 2 ** (num_checkpoints - 1):
        fail(
            ValueError,
            where,
            "num_checkpoints",
            num_checkpoints,
            f"at most {1 + int(math.log2(total_steps))} for a run of {total_steps} updates",
            "Use fewer checkpoints or train for more updates.",
        )
    return [total_steps // 2 ** (num_checkpoints - 1 - i) for i in range(num_checkpoints)]


class WSDLrScheduler(StatefulSchedulerBase):
    """Warmup, a long stable phase at the base LR, and a short decay before each checkpoint.

    See the module docstring for the exact value of every update. Use it with
    `WSDCheckpointCallback`, which saves the model before and after every decay.

    Args:
        optimizer: The optimizer; each group's `lr` (or `initial_lr`) is its base LR.
        num_epochs: Epochs of the run (with `num_update_steps_per_epoch`).
        num_update_steps_per_epoch: Optimizer updates per epoch.
        total_steps: Updates of the run, instead of the two arguments above.
        num_warmup_steps: Updates of linear warmup; `None` means 1% of the run.
        decay_phase_ratio: Fraction of each period spent decaying, in `(0, 1]`.
        lr_min: The LR at the end of each decay, as a *fraction* of the base LR, in `[0, 1]`
            (`> 0` for the inverse-proportional decay).
        warmup_starting_lr: The LR of the first warmup update, for every group.
        use_inverse_sqrt_decay: `True`: the sqrt decay; `False`: inverse-proportional.
        num_checkpoints: Number of periods, each ending with a decay (see
            `estimate_checkpoint_steps`).
        is_continuation_from_checkpoint: A continuation run: no warmup, and `load_state_dict`
            restores only the base LRs, keeping this run's length and a fresh update count.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If an argument is out of range, or the warmup reaches into a decay.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        num_epochs: int | None = None,
        num_update_steps_per_epoch: int | None = None,
        total_steps: int | None = None,
        num_warmup_steps: int | None = 0,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> None:
        where = "WSDLrScheduler"
        total = _total_steps(where, num_epochs, num_update_steps_per_epoch, total_steps)
        _check_decay(where, decay_phase_ratio, lr_min, use_inverse_sqrt_decay)
        check_number(where, "warmup_starting_lr", warmup_starting_lr)
        check_count(where, "num_checkpoints", num_checkpoints, minimum=1, resolved=True)
        super().__init__(optimizer, "lr")
        self.total_steps = total
        self.num_checkpoints = num_checkpoints
        self.checkpoint_steps = estimate_checkpoint_steps(total, num_checkpoints)
        self.decay_phase_ratio = float(decay_phase_ratio)
        self.lr_min = float(lr_min)
        self.warmup_starting_lr = float(warmup_starting_lr)
        self.use_inverse_sqrt_decay = bool(use_inverse_sqrt_decay)
        self.is_continuation_from_checkpoint = bool(is_continuation_from_checkpoint)
        if num_warmup_steps is None:
            num_warmup_steps = int(0.01 * total)
        check_count(where, "num_warmup_steps", num_warmup_steps, minimum=0, resolved=True)
        self.num_warmup_steps = 0 if self.is_continuation_from_checkpoint else num_warmup_steps
        self.checkpoint_decay_info = self._calculate_decay_info()
        first_decay = self.checkpoint_decay_info[0]["pre_decay_step"]
        if self.num_warmup_steps > first_decay:
            fail(
                ValueError,
                where,
                "num_warmup_steps",
                self.num_warmup_steps,
                f"<= the last stable update before the first decay ({first_decay})",
                "Shorten the warmup, lower decay_phase_ratio or use fewer checkpoints.",
            )
        if self.num_warmup_steps:
            fix = "Lower warmup_starting_lr to at most the optimizer's smallest lr."
            starts = [self.warmup_starting_lr] * len(self.base_values)
            check_group_bound(where, "warmup_starting_lr", starts, self.base_values, fix)
        self.step_update(0)

    def get_checkpoint_steps(self) -> list[int]:
        """Return the updates after which each decay ends (the last is `total_steps`)."""
        return list(self.checkpoint_steps)

    def get_decay_info(self) -> list[dict[str, int]]:
        """Return, per period: `period_start`, `period_end`, `decay_steps`, `pre_decay_step`.

        `pre_decay_step` is the last stable update of the period (equal to `period_start`
        when the whole period decays); `period_end` is its last decay update.
        """
        return [dict(info) for info in self.checkpoint_decay_info]

    def get_phase_info(self, num_updates: int) -> dict[str, int]:
        """Return the decay info of the period that update `num_updates` (1-based) is in."""
        for info in self.checkpoint_decay_info:
            if num_updates <= info["period_end"]:
                return dict(info)
        return dict(self.checkpoint_decay_info[-1])

    def get_current_phase_info(self) -> dict[str, int]:
        """Return the decay info of the period of the next update."""
        return self.get_phase_info(self.num_updates + 1)

    def get_updated_values(self, num_updates: int) -> list[float]:
        """Return each group's LR for update `num_updates + 1` (the last one past the end)."""
        update = min(num_updates + 1, self.total_steps)
        return [self._lr(update, base) for base in self.base_values]

    def _lr(self, update: int, base: float) -> float:
        if update <= self.num_warmup_steps:
            return interpolate(self.warmup_starting_lr, base, (update - 1) / self.num_warmup_steps)
        info = self.get_phase_info(update)
        if update <= info["pre_decay_step"]:
            return base
        return self._decayed(base, (update - info["pre_decay_step"]) / info["decay_steps"])

    def _decayed(self, base: float, t: float) -> float:
        """The LR at decay progress `t` in `(0, 1]`; exactly `base * lr_min` at `t == 1`.

        Both formulas are written as a fraction of the way from `base` to `base * lr_min`:
        `sqrt(t)`, or `1 / (1 + r * (1 / t - 1))` (the same as `b * r / (t + (1 - t) * r)`),
        so that rounding keeps them monotone and exact at the end.
        """
        if self.use_inverse_sqrt_decay:
            fraction = math.sqrt(t)
        else:
            fraction = 1.0 / (1.0 + self.lr_min * (1.0 / t - 1.0))
        return interpolate(base, base * self.lr_min, fraction)

    def _calculate_decay_info(self) -> list[dict[str, int]]:
        info, start = [], 0
        for end in self.checkpoint_steps:
            decay_steps = max(1, math.floor((end - start) * self.decay_phase_ratio))
            info.append(
                {
                    "period_start": start,
                    "period_end": end,
                    "decay_steps": decay_steps,
                    "pre_decay_step": end - decay_steps,
                }
            )
            start = end
        return info

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any] | None = None,
        *,
        scheduler_state_dict: Mapping[str, Any] | None = None,
    ) -> None:
        """Restore a saved state (by either keyword); in a continuation run, only the base LRs."""
        state = _one_state(self, state_dict, scheduler_state_dict)
        if not self.is_continuation_from_checkpoint:
            super().load_state_dict(state)
            return
        super().load_state_dict({**self.state_dict(), "base_values": _base_values(state)})

    @property
    def previous_checkpoint_step(self) -> int | None:
        """The last pre-decay step (``get_decay_info``) reached so far, or ``None`` before one.

        pytorch-accelerated's attribute of this name, derived here from the update count.
        """
        reached = [
            period["pre_decay_step"]
            for period in self.checkpoint_decay_info
            if period["pre_decay_step"] <= self.num_updates
        ]
        return reached[-1] if reached else None

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: IntOrPlaceholder = TrainerPlaceholderValues.NUM_EPOCHS,
        num_update_steps_per_epoch: IntOrPlaceholder = (
            TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH
        ),
        num_warmup_epochs: int | None = None,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> functools.partial[WSDLrScheduler]:
        """Return `optimizer -> WSDLrScheduler`, for `Trainer.train(create_scheduler_fn=...)`.

        The arguments are the class's, with the run counted in epochs: `total_num_epochs`
        and `num_update_steps_per_epoch` default to the trainer's placeholders, and
        `num_warmup_epochs` (`None`: 1% of the run's updates) replaces `num_warmup_steps`.
        """
        where = "WSDLrScheduler.create_scheduler_fn"
        check_count(where, "num_warmup_epochs", num_warmup_epochs, minimum=0, allow_none=True)
        check_count(where, "num_checkpoints", num_checkpoints, minimum=1)
        _check_decay(where, decay_phase_ratio, lr_min, use_inverse_sqrt_decay)
        check_number(where, "warmup_starting_lr", warmup_starting_lr)
        steps = num_update_steps_per_epoch
        arguments: dict[str, Any] = {
            "num_epochs": total_num_epochs,
            "num_update_steps_per_epoch": steps,
            "num_warmup_steps": None if num_warmup_epochs is None else steps * num_warmup_epochs,
            "decay_phase_ratio": decay_phase_ratio,
            "lr_min": lr_min,
            "warmup_starting_lr": warmup_starting_lr,
            "use_inverse_sqrt_decay": use_inverse_sqrt_decay,
            "num_checkpoints": num_checkpoints,
            "is_continuation_from_checkpoint": is_continuation_from_checkpoint,
        }
        return functools.partial(cls, **arguments)


def _total_steps(
    where: str, num_epochs: int | None, steps_per_epoch: int | None, total_steps: int | None
) -> int:
    """Return the run length from `total_steps` or from epochs x steps (exactly one)."""
    by_epochs = num_epochs is not None or steps_per_epoch is not None
    if by_epochs == (total_steps is not None):
        fail(
            ValueError,
            where,
            "total_steps",
            total_steps,
            "given alone, or None with num_epochs and num_update_steps_per_epoch",
            "Pass either total_steps, or num_epochs and num_update_steps_per_epoch.",
        )
    if total_steps is not None:
        check_count(where, "total_steps", total_steps, minimum=1, resolved=True)
        return total_steps
    check_count(where, "num_epochs", num_epochs, minimum=1, resolved=True)
    check_count(where, "num_update_steps_per_epoch", steps_per_epoch, minimum=1, resolved=True)
    return cast(int, num_epochs) * cast(int, steps_per_epoch)


def _check_decay(where: str, ratio: object, lr_min: object, sqrt_decay: object) -> None:
    check_fraction(where, "decay_phase_ratio", ratio, allow_zero=False)
    check_fraction(where, "lr_min", lr_min, allow_zero=bool(sqrt_decay))


def _base_values(state_dict: Mapping[str, Any]) -> list[float]:
    if "base_values" not in state_dict:
        fail(
            ValueError,
            "WSDLrScheduler.load_state_dict",
            "state_dict",
            state_dict,
            "a WSDLrScheduler state with 'base_values'",
            "Load the scheduler state saved by the run you continue from.",
        )
    return [float(value) for value in state_dict["base_values"]]

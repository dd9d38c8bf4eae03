"""Learning-rate warmup around any scheduler (torch's, ours or yours), in optimizer updates.

Placeholders (`TrainerPlaceholderValues`) may stand for the warmup length and inside the
wrapped factory; the trainer resolves both.
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

from pytorch_accel._checks import check_count, check_number, check_optimizer, fail
from pytorch_accel.placeholders import PlaceholderExpression, TrainerPlaceholderValues

__all__ = ["LRWarmupScheduler", "WarmupMode"]

WarmupMode = Literal["linear", "factor", "constant"]
"""How the warmup updates get their learning rate (see `LRWarmupScheduler`)."""

_MODES = ("linear", "factor", "constant")
_SETTINGS = ("warmup_steps", "mode", "warmup_factor", "warmup_lr")
IntOrPlaceholder = int | TrainerPlaceholderValues | PlaceholderExpression
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class LRWarmupScheduler:
    """Warm up the learning rate over the first `warmup_steps` updates, then follow `scheduler`.

    The wrapped scheduler runs from the first update, unchanged: call `step()` after every
    optimizer update (`Trainer.scheduler_step` does) and it steps the wrapped one, whose
    learning rates (the *regular* ones) then apply, except during the warmup, where update
    `u` (1-based, `u <= warmup_steps`) uses:

    - `"linear"`: `regular * (f + (1 - f) * (u - 1) / warmup_steps)`, `f = warmup_factor`:
      from `f` times the regular rate up to the full rate at update `warmup_steps + 1`;
    - `"factor"`: `regular * warmup_factor`, a constant fraction of the schedule;
    - `"constant"`: `warmup_lr`, the same fixed rate in every parameter group.

    Between steps the wrapped scheduler sees its own (regular) rates in the optimizer, so a
    chainable torch scheduler (`StepLR`, `ExponentialLR`) is not compounded with the warmup.
    `ReduceLROnPlateau` steps on a metric, not per update, and cannot be wrapped.

    Args:
        optimizer: The optimizer whose `"lr"` is scheduled.
        scheduler: `optimizer -> scheduler`, e.g. `functools.partial(CosineAnnealingLR,
            T_max=TrainerPlaceholderValues.TOTAL_NUM_UPDATE_STEPS)`; `None` keeps the
            optimizer's learning rates after the warmup.
        warmup_steps: Optimizer updates to warm up over (0: no warmup).
        mode: `"linear"`, `"factor"` or `"constant"`.
        warmup_factor: The fraction of the regular rate of the first update (`"linear"`) or of
            every warmup update (`"factor"`), in `[0, 1]`.
        warmup_lr: The learning rate of every warmup update with `mode="constant"`.

    Example:
        ```python
        from functools import partial
        from torch.optim.lr_scheduler import CosineAnnealingLR
        from pytorch_accel import TrainerPlaceholderValues as P

        trainer.train(
            dataset,
            num_epochs=10,
            create_scheduler_fn=LRWarmupScheduler.create_scheduler_fn(
                partial(CosineAnnealingLR, T_max=P.TOTAL_NUM_UPDATE_STEPS),
                warmup_steps=P.NUM_UPDATE_STEPS_PER_EPOCH,
            ),
        )
        ```
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: SchedulerFactory | None = None,
        *,
        warmup_steps: int,
        mode: WarmupMode = "linear",
        warmup_factor: float = 0.001,
        warmup_lr: float | None = None,
    ) -> None:
        where = "LRWarmupScheduler"
        check_optimizer(
            where,
            "optimizer",
            optimizer,
            "Pass the optimizer, or use LRWarmupScheduler.create_scheduler_fn(...).",
        )
        _check_settings(where, scheduler, warmup_steps, mode, warmup_factor, warmup_lr)
        check_count(where, "warmup_steps", warmup_steps, minimum=0, resolved=True)
        self.optimizer = optimizer
        self.warmup_steps, self.mode = warmup_steps, mode
        self.warmup_factor, self.warmup_lr = float(warmup_factor), warmup_lr
        self.scheduler = None if scheduler is None else _build(where, scheduler, optimizer)
        self._num_updates = 0
        self.regular_values = [float(group["lr"]) for group in optimizer.param_groups]
        self._apply()

    @classmethod
    def create_scheduler_fn(
        cls,
        scheduler: SchedulerFactory | None = None,
        *,
        warmup_steps: IntOrPlaceholder,
        mode: WarmupMode = "linear",
        warmup_factor: float = 0.001,
        warmup_lr: float | None = None,
    ) -> functools.partial[LRWarmupScheduler]:
        """Return `optimizer -> LRWarmupScheduler`, for `Trainer.train(create_scheduler_fn=...)`.

        The arguments are the class's, checked now (placeholders pass; the trainer resolves
        them, also inside `scheduler` when it is a `functools.partial`), so a mistake fails
        before training starts.
        """
        where = "LRWarmupScheduler.create_scheduler_fn"
        _check_settings(where, scheduler, warmup_steps, mode, warmup_factor, warmup_lr)
        check_count(where, "warmup_steps", warmup_steps, minimum=0)
        return functools.partial(
            cls,
            scheduler=scheduler,
            warmup_steps=warmup_steps,  # type: ignore[arg-type]
            mode=mode,
            warmup_factor=warmup_factor,
            warmup_lr=warmup_lr,
        )

    @property
    def num_updates(self) -> int:
        """The number of completed updates this scheduler has been stepped for."""
        return self._num_updates

    def step(self) -> None:
        """Count one more completed update; step the wrapped scheduler; set the next rates."""
        groups = self.optimizer.param_groups
        for group, regular in zip(groups, self.regular_values, strict=True):
            group["lr"] = regular  # the wrapped scheduler continues from its own rates
        if self.scheduler is not None:
            self.scheduler.step()
        self._num_updates += 1
        self.regular_values = [float(group["lr"]) for group in groups]
        self._apply()

    def get_last_lr(self) -> list[float]:
        """Return the learning rate of each parameter group for the next update."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def warmup_value(self, regular: float, update: int) -> float:
        """Return the learning rate of the 1-based `update` whose regular rate is `regular`."""
        if update > self.warmup_steps:
            return regular
        if self.mode == "constant":
            return float(self.warmup_lr)  # type: ignore[arg-type]
        if self.mode == "factor":
            return regular * self.warmup_factor
        alpha = (update - 1) / self.warmup_steps
        return regular * (self.warmup_factor * (1 - alpha) + alpha)

    def _apply(self) -> None:
        update = self._num_updates + 1
        for group, regular in zip(self.optimizer.param_groups, self.regular_values, strict=True):
            group["lr"] = self.warmup_value(regular, update)

    def state_dict(self) -> dict[str, Any]:
        """Return the update count, the regular rates, the settings and the wrapped state.

        Returns:
            A dict of plain values, loadable with `torch.load(..., weights_only=True)` when the
            wrapped scheduler's state is.
        """
        return {
            **{name: getattr(self, name) for name in _SETTINGS},
            "num_updates": self._num_updates,
            "regular_values": list(self.regular_values),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state saved by `state_dict` and set the rates of the next update.

        Raises:
            ValueError: If it was saved with other settings or another number of groups.
        """
        where = "LRWarmupScheduler.load_state_dict"
        for name in _SETTINGS:
            if state_dict.get(name) != getattr(self, name):
                fail(
                    ValueError,
                    where,
                    f"state_dict[{name!r}]",
                    state_dict.get(name),
                    f"{getattr(self, name)!r}, as this scheduler",
                    "Load a state saved by a warmup scheduler built with the same arguments.",
                )
        if (state_dict["scheduler"] is None) != (self.scheduler is None):
            fail(
                ValueError,
                where,
                "state_dict['scheduler']",
                type(state_dict["scheduler"]).__name__,
                "a state of the wrapped scheduler, as built",
                "Load a state saved with the same wrapped scheduler.",
            )
        if len(state_dict["regular_values"]) != len(self.optimizer.param_groups):
            fail(
                ValueError,
                where,
                "state_dict['regular_values']",
                state_dict["regular_values"],
                f"one value per parameter group ({len(self.optimizer.param_groups)})",
                "Load the state into a scheduler over the same parameter groups.",
            )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        self._num_updates = int(state_dict["num_updates"])
        self.regular_values = [float(value) for value in state_dict["regular_values"]]
        self._apply()


def _check_settings(
    where: str,
    scheduler: object,
    warmup_steps: object,
    mode: object,
    warmup_factor: object,
    warmup_lr: object,
) -> None:
    """Check the arguments shared by the constructor and `create_scheduler_fn`."""
    if scheduler is not None and not callable(scheduler):
        fail(
            TypeError,
            where,
            "scheduler",
            scheduler,
            "a function optimizer -> scheduler, or None",
            "Pass e.g. functools.partial(torch.optim.lr_scheduler.StepLR, step_size=10).",
        )
    if mode not in _MODES:
        fail(ValueError, where, "mode", mode, f"one of {_MODES}", 'Pass e.g. mode="linear".')
    if isinstance(warmup_steps, float) or _divides(warmup_steps):
        fail(
            TypeError,
            where,
            "warmup_steps",
            warmup_steps,
            "an int",
            "Divide placeholders with // (e.g. P.TOTAL_NUM_UPDATE_STEPS // 20), not /.",
        )
    check_number(where, "warmup_factor", warmup_factor)
    if isinstance(warmup_factor, numbers.Real) and float(warmup_factor) > 1:
        fail(ValueError, where, "warmup_factor", warmup_factor, "in [0, 1]", "Pass e.g. 0.001.")
    if mode == "constant":
        check_number(where, "warmup_lr", warmup_lr)
    elif warmup_lr is not None:
        fail(
            ValueError,
            where,
            "warmup_lr",
            warmup_lr,
            'None unless mode="constant"',
            'Pass mode="constant" to warm up at a fixed rate, or leave warmup_lr out.',
        )


def _divides(value: object) -> bool:
    """Whether a placeholder expression uses ``/``, which gives a float number of updates."""
    if not isinstance(value, PlaceholderExpression):
        return False
    return value.op is operator.truediv or _divides(value.left) or _divides(value.right)


def _build(where: str, factory: SchedulerFactory, optimizer: torch.optim.Optimizer) -> Any:
    """Build the wrapped scheduler and check that it can be stepped once per update."""
    scheduler = factory(optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        fail(
            TypeError,
            where,
            "scheduler",
            scheduler,
            "a scheduler stepped once per update",
            "ReduceLROnPlateau steps on a metric: call it from a callback instead.",
        )
    for name in ("step", "state_dict", "load_state_dict"):
        if not callable(getattr(scheduler, name, None)):
            fail(
                TypeError,
                where,
                "scheduler's result",
                scheduler,
                f"a scheduler with a {name}() method",
                "Return a scheduler from the function, e.g. StepLR(optimizer, step_size=10).",
            )
    return scheduler

"""Base classes of parameter schedulers stepped once per optimizer update.

The convention, shared with timm and pytorch-accelerated: `step_update(num_updates)` is called
after an optimizer update, with the number of updates completed so far, and sets the values
the *next* update uses. So `get_updated_values(n)` returns the values of update `n + 1`
(1-based), and a new scheduler applies `get_updated_values(0)`: the values of the first update.
"""

from __future__ import annotations

import copy
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pytorch_accel._checks import check_optimizer, fail

__all__ = ["SchedulerBase", "StatefulSchedulerBase"]

ScheduledValues = float | Sequence[float] | None


class SchedulerBase(ABC):
    """Schedule any field of an optimizer's parameter groups (`"lr"`, `"weight_decay"`, ...).

    The first value of the field in each group is remembered as `initial_<field>` in the group
    (kept if already there, as timm and torch do), and as `base_values`. Subclasses implement
    `get_updated_values` and call `self.step_update(0)` at the end of `__init__`, so that the
    first update uses the first scheduled value.

    This base class is stateless: the caller passes the number of completed updates.

    Args:
        optimizer: The optimizer whose parameter groups are scheduled.
        param_group_field: The parameter-group key to schedule.

    Example:
        ```python
        class HalveEveryUpdate(SchedulerBase):
            def get_updated_values(self, num_updates):
                return [base / 2**num_updates for base in self.base_values]

        scheduler = HalveEveryUpdate(optimizer)
        for num_updates, batch in enumerate(batches, start=1):
            train_step(batch)  # forward, backward, optimizer.step()
            scheduler.step_update(num_updates)  # the values of the next update
        ```
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        where = type(self).__name__
        check_optimizer(where, "optimizer", optimizer, _FIX_OPT)
        if not isinstance(param_group_field, str):
            fail(TypeError, where, "param_group_field", param_group_field, "a str", _FIX_FIELD)
        self.optimizer = optimizer
        self.param_group_field = param_group_field
        self.base_values: list[float] = _initial_values(optimizer, param_group_field, where)

    @property
    def base_lr_values(self) -> list[float]:
        """The base values, under their pytorch-accelerated name (whatever the field)."""
        return self.base_values

    @abstractmethod
    def get_updated_values(self, num_updates: int) -> ScheduledValues:
        """Return the values after `num_updates` completed updates: those of update `n + 1`.

        Args:
            num_updates: Optimizer updates completed so far (0 before the first).

        Returns:
            One value for every group, a value per group, or `None` to leave the groups as
            they are.
        """

    def values_for_update(self, update: int) -> list[float]:
        """Return the value each parameter group uses in the 1-based `update`."""
        _check_count(type(self).__name__ + ".values_for_update", "update", update, minimum=1)
        return self._expand(self.get_updated_values(update - 1))

    def step_update(self, num_updates: int) -> None:
        """Set the values of the next update, after `num_updates` completed updates."""
        _check_count(type(self).__name__ + ".step_update", "num_updates", num_updates, minimum=0)
        values = self.get_updated_values(num_updates)
        if values is not None:
            for group, value in zip(self.optimizer.param_groups, self._expand(values), strict=True):
                group[self.param_group_field] = value

    def _expand(self, values: ScheduledValues) -> list[float]:
        groups = self.optimizer.param_groups
        if values is None:
            return [float(group[self.param_group_field]) for group in groups]
        if not isinstance(values, Sequence):
            return [float(values)] * len(groups)
        expanded = [float(value) for value in values]
        if len(expanded) != len(groups):
            raise ValueError(
                f"{type(self).__name__}.get_updated_values returned {len(expanded)} values for "
                f"{len(groups)} parameter groups. Return one value, or one per group."
            )
        return expanded

    def state_dict(self) -> dict[str, Any]:
        """Return every attribute except the optimizer (save the optimizer separately).

        Returns:
            A dict of plain values (numbers, strings, lists), loadable with
            `torch.load(..., weights_only=True)`.
        """
        return {
            key: copy.deepcopy(value) for key, value in vars(self).items() if key != "optimizer"
        }

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any] | None = None,
        *,
        scheduler_state_dict: Mapping[str, Any] | None = None,
    ) -> None:
        """Restore the attributes saved by `state_dict`, base values included.

        Args:
            state_dict: A dict returned by `state_dict` of a scheduler of the same class (or,
                where a subclass translates it, of its pytorch-accelerated counterpart).
            scheduler_state_dict: The same, by pytorch-accelerated's keyword.

        Raises:
            TypeError: If `state_dict` is not a mapping, or both or neither are given.
            ValueError: If its keys or number of base values do not fit this scheduler.
        """
        state = self.translate_state_dict(_one_state(self, state_dict, scheduler_state_dict))
        _check_state(self, state)
        for key, value in state.items():
            setattr(self, key, copy.deepcopy(value))

    def translate_state_dict(self, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
        """Return a saved state in this class's keys (a subclass translates other formats).

        ``load_state_dict`` applies it; ``load_checkpoint`` uses it to check a saved state
        before anything is loaded.
        """
        return state_dict


class StatefulSchedulerBase(SchedulerBase, ABC):
    """A scheduler that counts the updates itself: call `step()` after every optimizer update.

    This is the protocol of `Trainer.scheduler_step`, which calls `scheduler.step()` after
    each update. After `k` calls, the optimizer holds the values of update `k + 1`. The
    arguments are `SchedulerBase`'s.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        super().__init__(optimizer, param_group_field)
        self._num_updates = 0

    @property
    def num_updates(self) -> int:
        """The number of completed updates this scheduler has been stepped for."""
        return self._num_updates

    def get_current_step(self) -> int:
        """Return `num_updates` (the pytorch-accelerated name)."""
        return self._num_updates

    def step(self) -> None:
        """Count one more completed update and set the values of the next one."""
        self.step_update(self._num_updates + 1)

    def step_update(self, num_updates: int) -> None:
        """Set the update count to `num_updates` and apply the values of the next update."""
        super().step_update(num_updates)
        self._num_updates = num_updates

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any] | None = None,
        *,
        scheduler_state_dict: Mapping[str, Any] | None = None,
    ) -> None:
        """Restore the saved state and put the values of the next update in the optimizer."""
        super().load_state_dict(state_dict, scheduler_state_dict=scheduler_state_dict)
        self.step_update(self._num_updates)


_FIX_OPT = "Pass the optimizer, e.g. CosineLrScheduler(optimizer, ...)."
_FIX_FIELD = 'Pass the name of a parameter-group key, e.g. param_group_field="lr".'


def _initial_values(optimizer: torch.optim.Optimizer, field: str, where: str) -> list[float]:
    """Record `initial_<field>` in every group (if absent) and return those values."""
    for index, group in enumerate(optimizer.param_groups):
        if field not in group:
            fail(
                ValueError,
                where,
                "param_group_field",
                field,
                f"a key of every parameter group (group {index} has {sorted(group)})",
                "Schedule an existing field such as 'lr' or 'weight_decay'.",
            )
    initial = f"initial_{field}"
    for group in optimizer.param_groups:
        group.setdefault(initial, group[field])
    return [float(group[initial]) for group in optimizer.param_groups]


def _check_count(where: str, name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(TypeError, where, name, value, "an int", f"Pass an int >= {minimum}.")
    if value < minimum:
        fail(ValueError, where, name, value, f"an int >= {minimum}", f"Pass {name} >= {minimum}.")


def _one_state(
    scheduler: SchedulerBase, state_dict: object, scheduler_state_dict: object
) -> Mapping[str, Any]:
    """The state passed by either keyword (``scheduler_state_dict`` is pytorch-accelerated's)."""
    where = f"{type(scheduler).__name__}.load_state_dict"
    if (state_dict is None) == (scheduler_state_dict is None):
        fail(
            TypeError,
            where,
            "state_dict",
            state_dict,
            "given once (state_dict, or scheduler_state_dict)",
            "Pass the dict returned by scheduler.state_dict().",
        )
    state = state_dict if state_dict is not None else scheduler_state_dict
    if not isinstance(state, Mapping):
        fail(TypeError, where, "state_dict", state, "a dict", "Pass scheduler.state_dict().")
    return state


def _check_state(scheduler: SchedulerBase, state_dict: Mapping[str, Any]) -> None:
    where = f"{type(scheduler).__name__}.load_state_dict"
    expected = set(vars(scheduler)) - {"optimizer"}
    if set(state_dict) != expected:
        fail(
            ValueError,
            where,
            "state_dict",
            sorted(state_dict),
            f"the keys of {type(scheduler).__name__}.state_dict()",
            f"Missing {sorted(expected - set(state_dict))}, unexpected "
            f"{sorted(set(state_dict) - expected)}: load a state saved by the same class.",
        )
    groups = len(scheduler.optimizer.param_groups)
    if len(state_dict["base_values"]) != groups:
        fail(
            ValueError,
            where,
            "state_dict['base_values']",
            state_dict["base_values"],
            f"one value per parameter group ({groups})",
            "Load the state into a scheduler over an optimizer with the same parameter groups.",
        )


def interpolate(start: float, end: float, fraction: float) -> float:
    """Return the point `fraction` (in `[0, 1]`) of the way from `start` to `end`.

    Exactly `end` at 1 (the plain formula can miss it by a rounding error), clamped between
    the two, and monotone in `fraction` even in floating point.
    """
    if fraction >= 1.0:
        return end
    value = start + (end - start) * fraction
    return min(max(value, min(start, end)), max(start, end))

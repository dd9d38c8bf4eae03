"""Argument checks shared by the schedulers; placeholders pass (they are checked once resolved)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from pytorch_accel._validation import fail
from pytorch_accel.placeholders import contains_placeholder

__all__ = [
    "FIX_PLACEHOLDER",
    "check_count",
    "check_fraction",
    "check_group_bound",
    "check_non_negative",
]


def check_count(
    where: str,
    name: str,
    value: object,
    *,
    minimum: int,
    allow_none: bool = False,
    resolved: bool = False,
) -> None:
    """Check that `value` is an int >= `minimum` (or a placeholder, unless `resolved`).

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        minimum: The smallest accepted value.
        allow_none: Whether `None` is accepted.
        resolved: Reject placeholders (the scheduler is being built, not configured).

    Raises:
        TypeError: If the value is not an int, or an unresolved placeholder when `resolved`.
        ValueError: If the value is below `minimum`.
    """
    if value is None and allow_none:
        return
    if contains_placeholder(value):
        if resolved:
            fail(TypeError, where, name, value, "an int", FIX_PLACEHOLDER)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(TypeError, where, name, value, f"an int >= {minimum}", f"Pass an int, e.g. {name}=1.")
    if value < minimum:
        fail(ValueError, where, name, value, f"an int >= {minimum}", f"Pass {name} >= {minimum}.")


FIX_PLACEHOLDER = (
    "Placeholders are resolved by the Trainer: pass create_scheduler_fn=<Scheduler>."
    "create_scheduler_fn(...) to Trainer.train, or pass numbers when creating it yourself."
)
"""How to fix an unresolved placeholder reaching a scheduler's constructor."""


def check_non_negative(where: str, name: str, value: object, *, positive: bool = False) -> None:
    """Check that `value` is a real number >= 0 (> 0 when `positive`).

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        positive: Require a strictly positive value.

    Raises:
        TypeError: If the value is not a real number.
        ValueError: If the value is out of range.
    """
    expected = "a number > 0" if positive else "a number >= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, f"Pass a float, e.g. {name}=1e-6.")
    number = float(value)
    if not (number > 0 if positive else number >= 0):
        fail(ValueError, where, name, value, expected, f"Pass {name} {expected[9:]}.")


def check_fraction(
    where: str, name: str, value: object, *, allow_none: bool = False, allow_zero: bool = True
) -> None:
    """Check that `value` is a real number in `[0, 1]` (`(0, 1]` unless `allow_zero`).

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        allow_none: Whether `None` is accepted.
        allow_zero: Whether 0 is accepted.

    Raises:
        TypeError: If the value is not a real number.
        ValueError: If the value is outside the range.
    """
    if value is None and allow_none:
        return
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    expected = f"a number in {interval}" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, f"Pass a float, e.g. {name}=0.1.")
    number = float(value)
    if not (0 <= number <= 1) or (number == 0 and not allow_zero):
        fail(ValueError, where, name, value, expected, f"Pass a fraction in {interval}.")


def check_group_bound(
    where: str, name: str, values: Sequence[float], bases: Sequence[float], fix: str
) -> None:
    """Check that each group's derived value (a minimum, a warmup start) is <= its base.

    Args:
        where: The entry point, for the message.
        name: The argument the values derive from.
        values: The derived value of each parameter group.
        bases: The base value of each parameter group.
        fix: How to fix the call.

    Raises:
        ValueError: If a group's value exceeds its base value.
    """
    for index, (value, base) in enumerate(zip(values, bases, strict=True)):
        if value > base:
            fail(
                ValueError,
                where,
                name,
                value,
                f"<= the base value of every parameter group (group {index} has {base})",
                fix,
            )

"""Evaluation sets: one unnamed set, or several named ones, and the names their metrics get.

``train(..., eval_dataset=...)`` and ``evaluate(...)`` take either one dataset (or
``DataLoader``), whose metrics keep their plain names (``eval_loss_epoch``, ``accuracy``), or
a mapping ``{"val": ..., "ood": ...}`` of named sets. Each named set is evaluated in turn with
the run history's prefix extended by ``"<name>_"``, so everything recorded while it is
evaluated, by the trainer and by every callback, is named after it (``val_eval_loss_epoch``,
``ood_accuracy``) without any callback knowing about sets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytorch_accel._checks import fail

__all__ = ["EVAL_SET_NAME_PATTERN", "eval_set_prefix", "named_eval_sets"]

EVAL_SET_NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
"""A set's name: a letter, then letters, digits, ``_``, ``.`` or ``-`` (it starts metric names)."""


def named_eval_sets(where: str, argument: str, data: Any) -> dict[str | None, Any]:
    """Return the evaluation sets in ``data`` by name: ``{None: data}`` for one unnamed set.

    Args:
        where: The entry point, for messages.
        argument: The argument's name, for messages.
        data: A dataset or ``DataLoader``, or a mapping of set names to them.

    Returns:
        The sets in the mapping's order; the datasets themselves are checked by the caller.

    Raises:
        ValueError: If the mapping is empty or a name is not a usable metric-name prefix.
        TypeError: If a name is not a string.
    """
    if not isinstance(data, Mapping):
        return {None: data}
    if not data:
        fail(
            ValueError,
            where,
            argument,
            data,
            "a dataset or a non-empty mapping of set names to datasets",
            f"Pass e.g. {argument}={{'val': val_dataset, 'test': test_dataset}}.",
        )
    for name in data:
        _check_name(where, argument, name)
    return dict(data)


def eval_set_prefix(name: str | None) -> str:
    """Return the run-history prefix of a set's metrics: ``""`` unnamed, else ``"<name>_"``."""
    return "" if name is None else f"{name}_"


def _check_name(where: str, argument: str, name: object) -> None:
    expected = "a name that starts with a letter (letters, digits, _ . -)"
    if not isinstance(name, str):
        fail(TypeError, where, f"{argument}'s key", name, expected, "Name each set, e.g. 'val'.")
    if not EVAL_SET_NAME_PATTERN.fullmatch(name):
        fail(
            ValueError,
            where,
            f"{argument}'s key",
            name,
            expected,
            "Its metrics are named '<name>_...': use e.g. 'val' or 'ood-test'.",
        )

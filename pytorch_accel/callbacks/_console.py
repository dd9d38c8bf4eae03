"""How the console shows metrics: short names, 4 significant digits, one line.

Private: used by ``PrintProgressCallback``, ``StepLoggingCallback`` and ``LogMetricsCallback``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["SEPARATOR", "display_name", "format_metrics", "format_value", "loss_first"]

SEPARATOR = "  "
"""Between the items of a console line."""


def display_name(name: str) -> str:
    """The metric's name without the ``_epoch`` suffix (``train_loss_epoch`` -> ``train_loss``)."""
    return name.removesuffix("_epoch") or name


def format_value(value: Any) -> str | None:
    """The value with 4 significant digits, or ``None`` if it is not a number.

    Integers are shown whole; one-element tensors as their number (``.item()``: called once
    per epoch, on values the run history holds, never in a step).

    Args:
        value: A metric value.

    Returns:
        The text, or ``None`` for values that are not real numbers (lists, strings, ...).
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return str(number)
    return f"{number:.4g}"


def loss_first(names: Iterable[str]) -> list[str]:
    """Sort metric names alphabetically, with those that name a loss first."""
    ordered = sorted(names)
    return [name for name in ordered if "loss" in name] + [
        name for name in ordered if "loss" not in name
    ]


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """``name value`` pairs, in the mapping's order, for the numeric values.

    Args:
        metrics: Metric names and values.

    Returns:
        E.g. ``"train_loss 0.1234  accuracy 0.9833"`` (names shortened by ``display_name``).
    """
    items = []
    for name, value in metrics.items():
        text = format_value(value)
        if text is not None:
            items.append(f"{display_name(name)} {text}")
    return SEPARATOR.join(items)

"""The callbacks a trainer uses when none are given: the one place the trainer wires callbacks in.

``pytorch_accel.trainer`` imports this module and nothing else of the catalogue (a layer rule,
checked by ``tests/test_architecture.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks.device import MoveModulesToDeviceCallback
from pytorch_accel.callbacks.limit_batches import (
    LimitBatchesCallback,
    limit_batches_from_environment,
)
from pytorch_accel.callbacks.log_metrics import LogMetricsCallback
from pytorch_accel.callbacks.nan import TerminateOnNaNCallback
from pytorch_accel.callbacks.progress import PrintProgressCallback, ProgressBarCallback
from pytorch_accel.handler import CallbackLike

__all__ = ["DEFAULT_CALLBACKS", "get_default_callbacks", "with_environment_callbacks"]


def get_default_callbacks(progress_bar: bool = True) -> tuple[type[TrainerCallback], ...]:
    """Return the default callback classes.

    Args:
        progress_bar: Whether to include ``ProgressBarCallback``.

    Returns:
        Device placement, NaN termination, progress messages, (progress bars) and metric
        logging, as classes: each trainer instantiates its own.
    """
    progress: tuple[type[TrainerCallback], ...] = (ProgressBarCallback,) if progress_bar else ()
    return (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        *progress,
        LogMetricsCallback,
    )


DEFAULT_CALLBACKS: tuple[type[TrainerCallback], ...] = get_default_callbacks()
"""The callbacks used by ``Trainer`` when none are given."""


def with_environment_callbacks(callbacks: Iterable[CallbackLike]) -> list[CallbackLike]:
    """Return ``callbacks`` plus those that environment variables ask for.

    When ``PYTORCH_ACCEL_LIMIT_BATCHES`` is set (see ``LimitBatches``), a
    ``LimitBatchesCallback`` is added unless one was given.

    Args:
        callbacks: The trainer's callbacks, instances or classes.

    Returns:
        A new list: the callbacks given, then any added.

    Raises:
        ValueError: If ``PYTORCH_ACCEL_LIMIT_BATCHES`` holds something other than a count.
    """
    callbacks = list(callbacks)
    limit = limit_batches_from_environment()
    if limit is not None and not any(_is_limit_callback(callback) for callback in callbacks):
        callbacks.append(LimitBatchesCallback(limit))
    return callbacks


def _is_limit_callback(callback: CallbackLike) -> bool:
    kind = callback if isinstance(callback, type) else type(callback)
    return issubclass(kind, LimitBatchesCallback)

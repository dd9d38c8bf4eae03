"""The callbacks a trainer uses when none are given."""

from __future__ import annotations

from pytorch_accel.callbacks.base import TrainerCallback
from pytorch_accel.callbacks.device import MoveModulesToDeviceCallback
from pytorch_accel.callbacks.log_metrics import LogMetricsCallback
from pytorch_accel.callbacks.nan import TerminateOnNaNCallback
from pytorch_accel.callbacks.progress import PrintProgressCallback, ProgressBarCallback

__all__ = ["DEFAULT_CALLBACKS", "get_default_callbacks"]


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

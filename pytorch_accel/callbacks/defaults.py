"""The default callbacks and their console formatting, under the catalogue's name.

Defined beside the trainer in ``pytorch_accel.default_callbacks``, which a plain run imports.
"""

from pytorch_accel.default_callbacks import (
    DEFAULT_CALLBACKS,
    SEPARATOR,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
    format_duration,
    format_metrics,
    format_value,
    get_default_callbacks,
    precision_text,
    with_environment_callbacks,
)

__all__ = [
    "DEFAULT_CALLBACKS",
    "SEPARATOR",
    "LogMetricsCallback",
    "MoveModulesToDeviceCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "TerminateOnNaNCallback",
    "format_duration",
    "format_metrics",
    "format_value",
    "get_default_callbacks",
    "precision_text",
    "with_environment_callbacks",
]

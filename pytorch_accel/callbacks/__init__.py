"""Callbacks: the base class, the handler, and the built-in catalogue."""

from pytorch_accel.callbacks.base import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.defaults import DEFAULT_CALLBACKS, get_default_callbacks
from pytorch_accel.callbacks.device import MoveModulesToDeviceCallback
from pytorch_accel.callbacks.handler import CallbackHandler
from pytorch_accel.callbacks.log_metrics import LogMetricsCallback
from pytorch_accel.callbacks.nan import TerminateOnNaNCallback
from pytorch_accel.callbacks.progress import PrintProgressCallback, ProgressBarCallback
from pytorch_accel.callbacks.sync_batchnorm import ConvertSyncBatchNormCallback

__all__ = [
    "DEFAULT_CALLBACKS",
    "CallbackHandler",
    "ConvertSyncBatchNormCallback",
    "LogMetricsCallback",
    "MoveModulesToDeviceCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "StopTrainingError",
    "TerminateOnNaNCallback",
    "TrainerCallback",
    "get_default_callbacks",
]

"""Callbacks: the base class, the handler, and the built-in catalogue.

The names are loaded on first use (PEP 562 ``__getattr__``): ``import pytorch_accel`` loads only
the callbacks the trainer uses by default, not the whole catalogue and what it imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytorch_accel.callback import CallbackHandler, TrainerCallback
    from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
    from pytorch_accel.callbacks.ema import EMA_METRIC_PREFIX, ModelEmaCallback
    from pytorch_accel.callbacks.health import GradientHealthCallback
    from pytorch_accel.callbacks.limit_batches import (
        LIMIT_BATCHES_ENV_VAR,
        LimitBatches,
        LimitBatchesCallback,
        limit_batches_from_environment,
    )
    from pytorch_accel.callbacks.limit_eval_steps import LimitEvalStepsCallback
    from pytorch_accel.callbacks.metrics import MetricsCallback
    from pytorch_accel.callbacks.plotting import PlotMetricsCallback, plot_metrics
    from pytorch_accel.callbacks.profiler import ProfilerCallback
    from pytorch_accel.callbacks.run_record import RunRecordCallback
    from pytorch_accel.callbacks.run_report import RunReportCallback
    from pytorch_accel.callbacks.save_best import SaveBestModelCallback
    from pytorch_accel.callbacks.save_state import SaveTrainingStateCallback
    from pytorch_accel.callbacks.step_eval import StepBasedEvaluationCallback
    from pytorch_accel.callbacks.step_logging import (
        DEFAULT_LOG_EVERY_N_UPDATES,
        StepLoggingCallback,
        StepMetrics,
    )
    from pytorch_accel.callbacks.sync_batchnorm import ConvertSyncBatchNormCallback
    from pytorch_accel.callbacks.throughput import ThroughputCallback
    from pytorch_accel.callbacks.time_budget import TimeBudgetCallback
    from pytorch_accel.callbacks.trackers import TrackingCallback
    from pytorch_accel.callbacks.watchdog import WatchdogCallback
    from pytorch_accel.callbacks.wsd_checkpoint import WSDCheckpointCallback
    from pytorch_accel.default_callbacks import (
        DEFAULT_CALLBACKS,
        LogMetricsCallback,
        MoveModulesToDeviceCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        TerminateOnNaNCallback,
        get_default_callbacks,
    )
    from pytorch_accel.errors import CallbackMethodNotImplementedError, StopTrainingError
    from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths

__all__ = [
    "DEFAULT_CALLBACKS",
    "DEFAULT_LOG_EVERY_N_UPDATES",
    "EMA_METRIC_PREFIX",
    "LIMIT_BATCHES_ENV_VAR",
    "CallbackHandler",
    "CallbackMethodNotImplementedError",
    "ConvertSyncBatchNormCallback",
    "DefaultPath",
    "EarlyStoppingCallback",
    "GradientHealthCallback",
    "LimitBatches",
    "LimitBatchesCallback",
    "LimitEvalStepsCallback",
    "LogMetricsCallback",
    "MetricsCallback",
    "ModelEmaCallback",
    "MoveModulesToDeviceCallback",
    "PlotMetricsCallback",
    "PrintProgressCallback",
    "ProfilerCallback",
    "ProgressBarCallback",
    "RunPaths",
    "RunRecordCallback",
    "RunReportCallback",
    "SaveBestModelCallback",
    "SaveTrainingStateCallback",
    "StepBasedEvaluationCallback",
    "StepLoggingCallback",
    "StepMetrics",
    "StopTrainingError",
    "TerminateOnNaNCallback",
    "ThroughputCallback",
    "TimeBudgetCallback",
    "TrackingCallback",
    "TrainerCallback",
    "WSDCheckpointCallback",
    "WatchdogCallback",
    "get_default_callbacks",
    "limit_batches_from_environment",
    "plot_metrics",
    "redirected_paths",
]

_HOMES = {
    "pytorch_accel.callback": "CallbackHandler TrainerCallback",
    "pytorch_accel.outputs": "DefaultPath RunPaths redirected_paths",
    "pytorch_accel.errors": "CallbackMethodNotImplementedError StopTrainingError",
    "pytorch_accel.default_callbacks": "DEFAULT_CALLBACKS LogMetricsCallback "
    "MoveModulesToDeviceCallback PrintProgressCallback ProgressBarCallback "
    "TerminateOnNaNCallback get_default_callbacks",
    ".early_stopping": "EarlyStoppingCallback",
    ".ema": "EMA_METRIC_PREFIX ModelEmaCallback",
    ".health": "GradientHealthCallback",
    ".limit_batches": "LIMIT_BATCHES_ENV_VAR LimitBatches LimitBatchesCallback "
    "limit_batches_from_environment",
    ".limit_eval_steps": "LimitEvalStepsCallback",
    ".metrics": "MetricsCallback",
    ".plotting": "PlotMetricsCallback plot_metrics",
    ".profiler": "ProfilerCallback",
    ".run_record": "RunRecordCallback",
    ".run_report": "RunReportCallback",
    ".save_best": "SaveBestModelCallback",
    ".save_state": "SaveTrainingStateCallback",
    ".step_eval": "StepBasedEvaluationCallback",
    ".step_logging": "DEFAULT_LOG_EVERY_N_UPDATES StepLoggingCallback StepMetrics",
    ".sync_batchnorm": "ConvertSyncBatchNormCallback",
    ".throughput": "ThroughputCallback",
    ".time_budget": "TimeBudgetCallback",
    ".trackers": "TrackingCallback",
    ".watchdog": "WatchdogCallback",
    ".wsd_checkpoint": "WSDCheckpointCallback",
}
"""The module of each name (relative: in this package), names separated by spaces."""
_MODULES = {name: module for module, names in _HOMES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use, and keep the name here."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

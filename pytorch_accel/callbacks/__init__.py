"""Callbacks: the base class, the handler, and the built-in catalogue.

The names are loaded on first use (PEP 562 ``__getattr__``): ``import pytorch_accel`` loads only
the callbacks the trainer uses by default, not the whole catalogue and what it imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytorch_accel.callback import (
        CallbackHandler,
        DefaultPath,
        RunPaths,
        TrainerCallback,
        redirected_paths,
    )
    from pytorch_accel.callbacks.defaults import (
        DEFAULT_CALLBACKS,
        LogMetricsCallback,
        MoveModulesToDeviceCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        TerminateOnNaNCallback,
        get_default_callbacks,
    )
    from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
    from pytorch_accel.callbacks.ema import EMA_METRIC_PREFIX, ModelEmaCallback
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
    from pytorch_accel.callbacks.wsd_checkpoint import WSDCheckpointCallback
    from pytorch_accel.errors import CallbackMethodNotImplementedError, StopTrainingError

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
    "get_default_callbacks",
    "limit_batches_from_environment",
    "plot_metrics",
    "redirected_paths",
]

_MODULES = {
    "CallbackHandler": "pytorch_accel.callback",
    "CallbackMethodNotImplementedError": "pytorch_accel.errors",
    "ConvertSyncBatchNormCallback": "pytorch_accel.callbacks.sync_batchnorm",
    "DEFAULT_CALLBACKS": "pytorch_accel.callbacks.defaults",
    "DEFAULT_LOG_EVERY_N_UPDATES": "pytorch_accel.callbacks.step_logging",
    "EMA_METRIC_PREFIX": "pytorch_accel.callbacks.ema",
    "EarlyStoppingCallback": "pytorch_accel.callbacks.early_stopping",
    "LIMIT_BATCHES_ENV_VAR": "pytorch_accel.callbacks.limit_batches",
    "LimitBatches": "pytorch_accel.callbacks.limit_batches",
    "LimitBatchesCallback": "pytorch_accel.callbacks.limit_batches",
    "LimitEvalStepsCallback": "pytorch_accel.callbacks.limit_eval_steps",
    "LogMetricsCallback": "pytorch_accel.callbacks.defaults",
    "MetricsCallback": "pytorch_accel.callbacks.metrics",
    "ModelEmaCallback": "pytorch_accel.callbacks.ema",
    "MoveModulesToDeviceCallback": "pytorch_accel.callbacks.defaults",
    "PlotMetricsCallback": "pytorch_accel.callbacks.plotting",
    "PrintProgressCallback": "pytorch_accel.callbacks.defaults",
    "ProfilerCallback": "pytorch_accel.callbacks.profiler",
    "ProgressBarCallback": "pytorch_accel.callbacks.defaults",
    "RunRecordCallback": "pytorch_accel.callbacks.run_record",
    "SaveBestModelCallback": "pytorch_accel.callbacks.save_best",
    "SaveTrainingStateCallback": "pytorch_accel.callbacks.save_state",
    "StepBasedEvaluationCallback": "pytorch_accel.callbacks.step_eval",
    "StepLoggingCallback": "pytorch_accel.callbacks.step_logging",
    "StepMetrics": "pytorch_accel.callbacks.step_logging",
    "StopTrainingError": "pytorch_accel.errors",
    "TerminateOnNaNCallback": "pytorch_accel.callbacks.defaults",
    "ThroughputCallback": "pytorch_accel.callbacks.throughput",
    "TimeBudgetCallback": "pytorch_accel.callbacks.time_budget",
    "TrackingCallback": "pytorch_accel.callbacks.trackers",
    "TrainerCallback": "pytorch_accel.callback",
    "WSDCheckpointCallback": "pytorch_accel.callbacks.wsd_checkpoint",
    "get_default_callbacks": "pytorch_accel.callbacks.defaults",
    "limit_batches_from_environment": "pytorch_accel.callbacks.limit_batches",
    "plot_metrics": "pytorch_accel.callbacks.plotting",
    "redirected_paths": "pytorch_accel.callback",
    "DefaultPath": "pytorch_accel.callback",
    "RunPaths": "pytorch_accel.callback",
}


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use, and keep the name here."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""Callbacks: the base class, the handler, and the built-in catalogue."""

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks.defaults import DEFAULT_CALLBACKS, get_default_callbacks
from pytorch_accel.callbacks.device import MoveModulesToDeviceCallback
from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
from pytorch_accel.callbacks.ema import EMA_METRIC_PREFIX, ModelEmaCallback
from pytorch_accel.callbacks.limit_batches import (
    LIMIT_BATCHES_ENV_VAR,
    LimitBatches,
    LimitBatchesCallback,
    limit_batches_from_environment,
)
from pytorch_accel.callbacks.limit_eval_steps import LimitEvalStepsCallback
from pytorch_accel.callbacks.log_metrics import LogMetricsCallback
from pytorch_accel.callbacks.metrics import MetricsCallback
from pytorch_accel.callbacks.nan import TerminateOnNaNCallback
from pytorch_accel.callbacks.plotting import PlotMetricsCallback, plot_metrics
from pytorch_accel.callbacks.progress import PrintProgressCallback, ProgressBarCallback
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
from pytorch_accel.handler import CallbackHandler

__all__ = [
    "DEFAULT_CALLBACKS",
    "DEFAULT_LOG_EVERY_N_UPDATES",
    "EMA_METRIC_PREFIX",
    "LIMIT_BATCHES_ENV_VAR",
    "CallbackHandler",
    "CallbackMethodNotImplementedError",
    "ConvertSyncBatchNormCallback",
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
    "ProgressBarCallback",
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
]

"""Every built-in callback, built with defaults (or the minimum it needs), for catalogue tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from helpers import make_model, make_regression_dataset


def factories() -> dict[str, Callable[[], Any]]:
    """Name -> zero-argument factory of each built-in callback."""
    from torchmetrics.regression import MeanAbsoluteError

    from pytorch_accel import callbacks as cb

    return {
        "MoveModulesToDeviceCallback": cb.MoveModulesToDeviceCallback,
        "TerminateOnNaNCallback": cb.TerminateOnNaNCallback,
        "PrintProgressCallback": cb.PrintProgressCallback,
        "ProgressBarCallback": cb.ProgressBarCallback,
        "LogMetricsCallback": cb.LogMetricsCallback,
        "ConvertSyncBatchNormCallback": cb.ConvertSyncBatchNormCallback,
        "EarlyStoppingCallback": cb.EarlyStoppingCallback,
        "SaveBestModelCallback": cb.SaveBestModelCallback,
        "ModelEmaCallback": cb.ModelEmaCallback,
        "StepBasedEvaluationCallback": lambda: cb.StepBasedEvaluationCallback(eval_every_n_steps=2),
        "LimitBatchesCallback": lambda: cb.LimitBatchesCallback(num_batches=2),
        "LimitEvalStepsCallback": lambda: cb.LimitEvalStepsCallback(num_eval_steps=1),
        "MetricsCallback": lambda: cb.MetricsCallback(MeanAbsoluteError(), name="mae"),
        "TrackingCallback": cb.TrackingCallback,
        "StepLoggingCallback": lambda: cb.StepLoggingCallback(log_every_n_updates=3),
        "RunRecordCallback": lambda: cb.RunRecordCallback("record", {"lr": 0.05}),
        "PlotMetricsCallback": cb.PlotMetricsCallback,
        "RunReportCallback": cb.RunReportCallback,
        "GradientHealthCallback": lambda: cb.GradientHealthCallback(log_every_n_updates=2),
        "ThroughputCallback": cb.ThroughputCallback,
        "ProfilerCallback": lambda: cb.ProfilerCallback(wait=1, warmup=0, active=1),
        "SaveTrainingStateCallback": lambda: cb.SaveTrainingStateCallback(save_every_n_steps=3),
        "TimeBudgetCallback": lambda: cb.TimeBudgetCallback(max_time=3600),
        "WatchdogCallback": lambda: cb.WatchdogCallback(timeout_s=120),
    }


def exercise(name: str) -> dict[str, Any]:
    """Two `train()` calls and an `evaluate()` with the callback next to the defaults."""
    from pytorch_accel import Trainer
    from pytorch_accel.callbacks import DEFAULT_CALLBACKS

    callback = factories()[name]()
    model = make_model()
    extra = () if type(callback) in DEFAULT_CALLBACKS else (callback,)
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, *extra),
    )
    train, evaluate = make_regression_dataset(32), make_regression_dataset(12, seed=1)
    trainer.train(train, num_epochs=2, eval_dataset=evaluate, per_device_batch_size=4)
    trainer.train(train, num_epochs=1, eval_dataset=evaluate, reset_run_history=False)
    trainer.evaluate(evaluate)
    history = trainer.run_history
    return {
        "epochs": len(history.get_metric_values("train_loss_epoch")),
        "evaluation_loss": history.get_latest_metric("evaluation_loss"),
        "metrics": sorted(history.get_metric_names()),
    }

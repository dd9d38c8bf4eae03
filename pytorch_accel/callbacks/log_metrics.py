"""Log the run history's metrics at the end of the phase that produced them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._console import format_metrics
from pytorch_accel.logging_setup import get_logger, setup_logging
from pytorch_accel.tracking import MetricCursor

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["LogMetricsCallback"]


class LogMetricsCallback(TrainerCallback):
    """Log each newly recorded metric once, at the end of the phase that recorded it.

    At the end of each training epoch, evaluation epoch, training-run epoch and evaluation
    run, it logs the metrics that gained a value since it last logged. It runs last
    (``order = 100``) so that metrics recorded by other callbacks at the same event are included.
    Override ``log_metrics`` to send them elsewhere; by default they are printed once per
    node.

    Example:
        ```python
        class JsonLogger(LogMetricsCallback):
            def log_metrics(self, trainer, metrics):
                trainer.print(json.dumps(metrics))
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(self) -> None:
        self._cursor = MetricCursor()

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Mark everything already recorded as logged."""
        setup_logging()
        self._mark_all_seen(trainer)

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Mark everything already recorded as logged."""
        setup_logging()
        self._mark_all_seen(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log the metrics of the training epoch."""
        self._log_new(trainer)

    def on_eval_epoch_end(
        self, trainer: Trainer, sanity_check: bool = False, **kwargs: Any
    ) -> None:
        """Log the metrics of the evaluation epoch (not those of a sanity evaluation)."""
        if not sanity_check:
            self._log_new(trainer)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log metrics recorded at the end of the epoch by other callbacks."""
        self._log_new(trainer)

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log metrics recorded at the end of the evaluation run."""
        self._log_new(trainer)

    def log_metrics(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """Log a dict of metric values; override to send them elsewhere.

        Args:
            trainer: The trainer.
            metrics: The latest value of each newly recorded metric.
        """
        logger = get_logger()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("metrics: %s", format_metrics(metrics))

    def _log_new(self, trainer: Trainer) -> None:
        new = self._cursor.read_new(trainer.run_history)
        if new:
            self.log_metrics(trainer, new)

    def _mark_all_seen(self, trainer: Trainer) -> None:
        self._cursor.skip_to_end(trainer.run_history)

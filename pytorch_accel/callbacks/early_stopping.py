"""Stop training when a watched metric stops improving."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._watch import MetricWatch
from pytorch_accel.callbacks.defaults import format_value
from pytorch_accel.checks import check_bool, check_number, check_positive_int
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["EarlyStoppingCallback"]


class EarlyStoppingCallback(TrainerCallback):
    """Raise ``StopTrainingError`` after ``early_stopping_patience`` epochs without improvement.

    At each epoch's end (``on_training_run_epoch_end``) it reads the latest value of
    ``watch_metric``. The threshold is absolute: a value improves when
    ``value < best - early_stopping_threshold`` (``value > best + threshold`` with
    ``greater_is_better=True``; strict, so ``0`` accepts any improvement), where ``best`` is
    the last improvement, so small steps count once they add up. The first value of a run
    improves, NaN never does; an improvement restarts the count at 0.

    A metric never recorded by an epoch's end is an error naming the recorded ones; one with
    no new value this epoch is not compared; watching an ``...eval_loss_epoch`` without an
    eval set fails when the run starts. Each process decides on its own values, and a stop on
    any stops them all at the same point.

    Order ``150``: after the callbacks that record metrics at ``on_training_run_epoch_end``
    (default 0, ``ModelEmaCallback`` 40, ``SaveBestModelCallback`` 50) and
    ``LogMetricsCallback`` (100), which would miss the last epoch after its stop.

    Args:
        early_stopping_patience: Epochs without improvement after which training stops.
        early_stopping_threshold: The absolute change that counts as an improvement (>= 0).
        watch_metric: The run-history metric to watch.
        greater_is_better: Whether larger values of the metric are better. Left out, lower is
            better, with a warning unless the metric's name says it is a loss or an error.
        reset_on_train: Forget the best value and the count at the start of each ``train()``;
            ``False`` carries them over from earlier runs.

    Attributes:
        best_metric: The best value so far (``None`` before the first).
        best_metric_epoch: The epoch of ``best_metric``.
        early_stopping_patience_counter: Epochs since the last improvement.

    Example:
        ```python
        stop = EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=0.001)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, stop))
        trainer.train(train_dataset, num_epochs=100, eval_dataset=eval_dataset)
        ```
    """

    order = 150

    def __init__(
        self,
        early_stopping_patience: int = 1,
        early_stopping_threshold: float = 0.01,
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool | None = None,
        reset_on_train: bool = True,
    ) -> None:
        where = "EarlyStoppingCallback"
        check_positive_int(where, "early_stopping_patience", early_stopping_patience)
        check_number(
            where,
            "early_stopping_threshold",
            early_stopping_threshold,
            finite=True,
            fix="Pass early_stopping_threshold >= 0 (0: any improvement).",
        )
        self._watch = MetricWatch(where, watch_metric, greater_is_better)
        check_bool(where, "reset_on_train", reset_on_train)
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = float(early_stopping_threshold)
        self.watch_metric = watch_metric
        self.greater_is_better = self._watch.greater_is_better
        self.reset_on_train = reset_on_train
        self.best_metric: float | None = None
        self.best_metric_epoch: int | None = None
        self.early_stopping_patience_counter = 0

    def reset(self) -> None:
        """Forget the best value and the count of epochs without improvement."""
        self.best_metric = None
        self.best_metric_epoch = None
        self.early_stopping_patience_counter = 0

    def state_dict(self) -> dict[str, Any]:
        """Return the best value, its epoch and the patience counter (saved in training states)."""
        return {
            "best_metric": self.best_metric,
            "best_metric_epoch": self.best_metric_epoch,
            "early_stopping_patience_counter": self.early_stopping_patience_counter,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state returned by ``state_dict``."""
        self.best_metric = state_dict["best_metric"]
        self.best_metric_epoch = state_dict["best_metric_epoch"]
        self.early_stopping_patience_counter = int(state_dict["early_stopping_patience_counter"])

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Reset (if ``reset_on_train``) and check that the metric can be recorded."""
        if self.reset_on_train:
            self.reset()
        self._watch.start_run(trainer)

    def on_training_run_epoch_end(
        self, trainer: TrainerLike, evaluated: bool = True, **kwargs: Any
    ) -> None:
        """Compare the epoch's value with the best; stop once patience is exhausted."""
        value = self._watch.read(trainer, evaluated)
        if value is None:
            return
        if self._watch.is_better(value, self.best_metric, self.early_stopping_threshold):
            self.best_metric = value
            self.best_metric_epoch = trainer.run_history.current_epoch
            self.early_stopping_patience_counter = 0
            return
        self.early_stopping_patience_counter += 1
        get_logger().info(
            f"EarlyStoppingCallback: {self.watch_metric} = {format_value(value)} is no "
            f"improvement on {format_value(self.best_metric)} "
            f"(epoch {self.best_metric_epoch}) by more than "
            f"{self.early_stopping_threshold}: {self.early_stopping_patience_counter}/"
            f"{self.early_stopping_patience} epochs without improvement."
        )
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            raise StopTrainingError(
                f"Stopping training early: {self.watch_metric} has not improved by more than "
                f"{self.early_stopping_threshold} for {self.early_stopping_patience} epoch(s) "
                f"(best {format_value(self.best_metric)} in epoch {self.best_metric_epoch})."
            )

"""The metric watch of ``EarlyStoppingCallback``, ``SaveBestModelCallback`` and the EMA's."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel.checks import check_bool, check_metric_name, fail
from pytorch_accel.distributed import AgreedFlag
from pytorch_accel.tracking import MetricNotFoundError, get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["MetricWatch"]


def _direction(where: str, metric_name: str, greater_is_better: bool | None) -> bool:
    """Whether a higher value is better; ``None``: lower, with a warning unless a loss's name."""
    if greater_is_better is not None:
        check_bool(where, "greater_is_better", greater_is_better)
        return greater_is_better
    lowered = metric_name.lower()
    if not any(word in lowered for word in ("loss", "error", "perplexity")):
        warnings.warn(
            f"{where}: watching {metric_name!r} as lower-is-better (the default, for losses). "
            f"If a higher {metric_name} is better (an accuracy, a score), pass "
            "greater_is_better=True; pass greater_is_better=False to silence this warning.",
            UserWarning,
            stacklevel=4,  # the callback's constructor's caller
        )
    return False


class MetricWatch:
    """Reads one run-history metric at each epoch end and compares its values.

    A value is new when the metric gained a value since the last read. A metric never
    recorded is an error naming the recorded ones; a metric not recorded again this epoch is
    skipped: silently in an epoch the trainer did not evaluate, else with a message.

    Args:
        where: The callback's name, for messages.
        metric_name: The run-history name to watch (the callback's ``watch_metric``).
        greater_is_better: Whether larger values are better; ``None``: lower, with a warning
            unless the name says it is a loss or an error.
    """

    def __init__(self, where: str, metric_name: str, greater_is_better: bool | None) -> None:
        check_metric_name(where, "watch_metric", metric_name)
        self.where = where
        self.metric_name = metric_name
        self.greater_is_better = _direction(where, metric_name, greater_is_better)
        self._seen = 0
        self._agreement: AgreedFlag | None = None

    def start_run(self, trainer: TrainerLike) -> None:
        """Note the values already recorded; fail now if an eval loss is watched without evals.

        With several processes it makes, once, the ``AgreedFlag`` that ``read_main`` uses.
        """
        if trainer.accelerator.num_processes > 1 and self._agreement is None:
            self._agreement = AgreedFlag()
        history = trainer.run_history
        recorded = self.metric_name in history.get_metric_names()
        self._seen = len(history.get_metric_values(self.metric_name)) if recorded else 0
        named = [name for name in trainer.eval_dataloaders if name is not None]
        fix = None
        if self.metric_name == "eval_loss_epoch" and named:
            fix = (
                "With named eval sets each set's metrics carry its name: watch e.g. "
                f"{named[0] + '_eval_loss_epoch'!r} (sets: {', '.join(map(repr, named))})."
            )
        elif self.metric_name.endswith("eval_loss_epoch") and trainer.eval_dataloader is None:
            fix = (
                "It is recorded only with an eval set: pass train(..., eval_dataset=...), "
                "or watch another metric such as 'train_loss_epoch'."
            )
        if fix is not None:
            expected = "a metric this run records"
            fail(ValueError, self.where, "watch_metric", self.metric_name, expected, fix)

    def read_main(self, trainer: TrainerLike, evaluated: bool = True) -> float:
        """Return the main process's ``read`` on every process (NaN for none), one exchange.

        For callbacks that call collectives (``save_checkpoint``) depending on a metric.
        """
        local = self.read(trainer, evaluated)
        value = float("nan") if local is None else local
        return value if self._agreement is None else self._agreement.main_value(value)

    def read(self, trainer: TrainerLike, evaluated: bool = True) -> float | None:
        """Return the value recorded this epoch, or ``None`` (with a message) if there is none.

        In an epoch between evaluations (``evaluated=False``) a metric not recorded yet is not
        an error.

        Raises:
            MetricNotFoundError: If the metric was never recorded, naming those that were.
        """
        history = trainer.run_history
        names = history.get_metric_names()
        if self.metric_name not in names and not evaluated:
            return None  # recorded at the first evaluation, after a later epoch
        if self.metric_name not in names:
            raise MetricNotFoundError(
                f"{self.where}: watch_metric {self.metric_name!r} has not been recorded by the "
                f"end of epoch {history.current_epoch}. Recorded metrics: "
                f"{', '.join(sorted(names)) or 'none'}. Pass one of them as watch_metric, or "
                "record it in a callback that runs earlier (a lower order)."
            )
        values = history.get_metric_values(self.metric_name)
        if len(values) <= self._seen:
            if evaluated:  # an epoch without evaluation is skipped as a matter of course
                get_logger().info(
                    f"{self.where}: {self.metric_name} has no new value in epoch "
                    f"{history.current_epoch}; this epoch is not compared."
                )
            return None
        self._seen = len(values)
        return self._as_float(values[-1])

    def is_better(self, value: float, reference: float | None, threshold: float = 0.0) -> bool:
        """Return whether ``value`` beats ``reference`` by more than ``threshold``.

        NaN never beats anything; anything else beats ``None`` (no reference yet).
        """
        if math.isnan(value):
            return False
        if reference is None:
            return True
        if self.greater_is_better:
            return value > reference + threshold
        return value < reference - threshold

    def _as_float(self, value: Any) -> float:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
        if isinstance(value, numbers.Real):
            return float(value)
        raise TypeError(
            f"{self.where}: the latest value of {self.metric_name!r} is {value!r} "
            f"({type(value).__name__}); a watched metric must hold numbers. Record a float, "
            "e.g. run_history.update_metric(name, tensor.item())."
        )

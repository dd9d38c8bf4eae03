"""Limit the steps of evaluation epochs, by default only the intermediate ones."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_positive_int

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["LimitEvalStepsCallback"]


class LimitEvalStepsCallback(TrainerCallback):
    """Run at most ``num_eval_steps`` evaluation steps, in total over all processes, per epoch.

    At ``on_eval_epoch_start`` it lowers ``trainer.limit_eval_batches`` and restores the
    previous limit at ``on_eval_epoch_end`` (also when the run stops); a stricter limit
    (``LimitBatchesCallback``) is kept. Each process runs ``ceil(num_eval_steps /
    num_processes)`` steps. With ``limit_intermediate_only`` (the default) only evaluations
    inside a training epoch (``is_intermediate=True``: ``StepBasedEvaluationCallback``'s) are
    limited; the one after each epoch, ``evaluate()`` and the EMA's keep the whole eval set.

    Args:
        num_eval_steps: The most evaluation steps per limited epoch, over all processes.
        limit_intermediate_only: Limit only intermediate evaluations; ``False`` limits all.

    Example:
        ```python
        extra = (StepBasedEvaluationCallback(200), LimitEvalStepsCallback(20))
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, *extra))
        ```
    """

    order = -100  # the limit is in place before the other callbacks see the epoch start
    may_stop_training = False

    def __init__(self, num_eval_steps: int, limit_intermediate_only: bool = True) -> None:
        check_positive_int("LimitEvalStepsCallback", "num_eval_steps", num_eval_steps)
        check_bool("LimitEvalStepsCallback", "limit_intermediate_only", limit_intermediate_only)
        self.num_eval_steps = num_eval_steps
        self.limit_intermediate_only = limit_intermediate_only
        self._saved_limits: list[int | None] = []
        self._limited: list[bool] = []

    def steps_per_process(self, trainer: TrainerLike) -> int:
        """Return how many steps each process runs in a limited epoch."""
        num_processes = int(trainer.accelerator.num_processes)
        return math.ceil(self.num_eval_steps / num_processes)

    def on_eval_epoch_start(
        self, trainer: TrainerLike, is_intermediate: bool = False, **kwargs: Any
    ) -> None:
        """Lower the eval limit for this epoch, if it is one to limit."""
        applies = is_intermediate or not self.limit_intermediate_only
        self._limited.append(applies)
        if not applies:
            return
        previous = trainer.limit_eval_batches
        self._saved_limits.append(previous)
        steps = self.steps_per_process(trainer)
        trainer.limit_eval_batches = steps if previous is None else min(previous, steps)

    def on_eval_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Restore the limit that was in place before the epoch."""
        if self._limited and self._limited.pop():
            trainer.limit_eval_batches = self._saved_limits.pop()

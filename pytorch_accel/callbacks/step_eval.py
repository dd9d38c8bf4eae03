"""Evaluate every N optimizer updates, in the middle of training epochs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_positive_int, fail
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["StepBasedEvaluationCallback"]


class StepBasedEvaluationCallback(TrainerCallback):
    """Run an evaluation epoch after every ``eval_every_n_steps`` optimizer updates.

    It counts updates (``trainer.num_updates``, across epochs), not batches, so gradient
    accumulation does not change its rhythm. At the end of the step whose update completes a
    multiple of the interval it calls ``trainer.run_eval_epoch()``: the eval events fire with
    ``is_intermediate=True``, the loss is recorded as ``intermediate_eval_loss``, and the model
    is back in train mode afterwards, with the epoch's training loss and the random state
    untouched, so training follows the same path as without it. These evaluations are
    independent of the one after each epoch. Combine with ``LimitEvalStepsCallback`` to
    evaluate on a few batches only.

    The run must have an eval set (checked when it starts); every process evaluates at the
    same update. A callback's stop during the evaluation ends a single process's run at once;
    with several, the trainer agrees on it at the training epoch's end.

    Args:
        eval_every_n_steps: Optimizer updates between two evaluations.

    Example:
        ```python
        evaluate = StepBasedEvaluationCallback(500)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, evaluate))
        trainer.train(train_dataset, num_epochs=3, eval_dataset=eval_dataset)
        trainer.run_history.get_metric_values("intermediate_eval_loss")
        ```
    """

    may_stop_training = False

    def __init__(self, eval_every_n_steps: int) -> None:
        check_positive_int("StepBasedEvaluationCallback", "eval_every_n_steps", eval_every_n_steps)
        self.eval_every_n_steps = eval_every_n_steps
        self._last_evaluated = 0

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Check that the run has an eval set; restart the count."""
        if trainer.eval_dataloader is None:
            fail(
                ValueError,
                "StepBasedEvaluationCallback",
                "eval_dataset",
                None,
                "a dataset",
                "Pass train(..., eval_dataset=...), or remove the callback.",
            )
        self._last_evaluated = 0

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Evaluate if this step's update completed a multiple of ``eval_every_n_steps``."""
        updates = trainer.num_updates
        if updates == self._last_evaluated or updates % self.eval_every_n_steps:
            return
        self._last_evaluated = updates
        get_logger().info(f"Evaluating after {updates} optimizer updates")
        trainer.run_eval_epoch()  # keeps the training's random state and train mode

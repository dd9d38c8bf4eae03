"""Limit the batches of every epoch, for quick debug runs: the callback.

The environment switch (``PYTORCH_ACCEL_LIMIT_BATCHES``, ``LimitBatches``) is in the core
(``pytorch_accel._batch_limits``) and re-exported here.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from pytorch_accel._batch_limits import (
    LIMIT_BATCHES_ENV_VAR,
    LimitBatches,
    limit_batches_from_environment,
)
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_positive_int

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = [
    "LIMIT_BATCHES_ENV_VAR",
    "LimitBatches",
    "LimitBatchesCallback",
    "limit_batches_from_environment",
]


class LimitBatchesCallback(TrainerCallback):
    """Use at most ``num_batches`` batches in every training and evaluation epoch.

    It sets ``trainer.limit_train_batches`` and ``trainer.limit_eval_batches`` at
    ``on_init_end``, so pass it to the ``Trainer`` constructor (added later, it raises at the
    next run's start; to limit an existing trainer, set those two attributes). Each process
    uses at most ``num_batches`` of its own batches. Trainers created inside ``LimitBatches``
    (or with ``PYTORCH_ACCEL_LIMIT_BATCHES`` set) get this callback automatically.

    Args:
        num_batches: The most batches per epoch, for training and evaluation alike.

    Example:
        ```python
        limit = LimitBatchesCallback(2)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, limit))
        trainer.train(train_dataset, num_epochs=2, eval_dataset=eval_dataset)  # a smoke test
        ```
    """

    order = -100  # it only sets attributes when the trainer is created
    may_stop_training = False

    def __init__(self, num_batches: int) -> None:
        check_positive_int("LimitBatchesCallback", "num_batches", num_batches)
        self.num_batches = num_batches
        self._trainers: weakref.WeakSet[TrainerLike] = weakref.WeakSet()

    def on_init_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Set both limits on the new trainer."""
        trainer.limit_train_batches = self.num_batches
        trainer.limit_eval_batches = self.num_batches
        self._trainers.add(trainer)

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Fail if the callback was added after the trainer was created."""
        if trainer not in self._trainers:
            raise ValueError(
                "LimitBatchesCallback: it was added after the Trainer was created, so its limit "
                "is not applied. Pass it to Trainer(..., callbacks=...), or set "
                f"trainer.limit_train_batches = trainer.limit_eval_batches = {self.num_batches}."
            )

    on_evaluation_run_start = on_training_run_start

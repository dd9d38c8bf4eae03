"""Fewer batches for quick debug runs: ``LimitBatchesCallback`` and its environment switch.

Thin aliases over the one mechanism, the trainer's ``limit_train_batches`` and
``limit_eval_batches`` (see ``pytorch_accel._state.fewer_batches``): the callback sets them when
a trainer is created, and ``PYTORCH_ACCEL_LIMIT_BATCHES`` (or the ``LimitBatches`` block that
sets it) makes new trainers get the callback (``default_callbacks`` wires it in).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_positive_int, fail
from pytorch_accel.dataloaders import LIMIT_BATCHES_ENV_VAR, OLD_LIMIT_BATCHES_ENV_VAR

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = [
    "LIMIT_BATCHES_ENV_VAR",
    "LimitBatches",
    "LimitBatchesCallback",
    "limit_batches_from_environment",
]


def limit_batches_from_environment() -> int | None:
    """Return the batch limit set in ``PYTORCH_ACCEL_LIMIT_BATCHES``, or ``None`` if there is none.

    Unset, empty and ``none`` (any case) mean no limit; surrounding spaces are ignored.
    pytorch-accelerated's ``PT_ACC_LIMIT_BATCHES`` is read too when ours is unset, with a
    ``DeprecationWarning``.

    Returns:
        The positive number of batches, or ``None``.

    Raises:
        ValueError: If the variable holds anything else.
    """
    raw = os.environ.get(LIMIT_BATCHES_ENV_VAR, "").strip()
    if not raw and os.environ.get(OLD_LIMIT_BATCHES_ENV_VAR, "").strip():
        raw = os.environ[OLD_LIMIT_BATCHES_ENV_VAR].strip()
        warnings.warn(
            f"{OLD_LIMIT_BATCHES_ENV_VAR} is pytorch-accelerated's name: set "
            f"{LIMIT_BATCHES_ENV_VAR} instead.",
            DeprecationWarning,
            stacklevel=2,
        )
    if not raw or raw.lower() == "none":
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        fail(
            ValueError,
            "limit_batches_from_environment",
            f"the environment variable {LIMIT_BATCHES_ENV_VAR}",
            raw,
            "a positive integer or 'none'",
            f"Set e.g. {LIMIT_BATCHES_ENV_VAR}=2, or unset it.",
        )
    return int(raw)


class LimitBatches(contextlib.ContextDecorator):
    """Make trainers created inside the block use at most ``num_batches`` batches per epoch.

    It sets ``PYTORCH_ACCEL_LIMIT_BATCHES`` for the block and restores it on exit (blocks can be
    nested). Trainers created while it is set get a ``LimitBatchesCallback(num_batches)``,
    which stays with them after the block. The variable is process-wide and inherited by child
    processes (``accelerate launch``, ``notebook_launcher``). Also usable as a decorator.

    Args:
        num_batches: The most batches per epoch, for training and evaluation alike.

    Example:
        ```python
        with LimitBatches(2):
            trainer = Trainer(model, loss_func, optimizer)
            trainer.train(train_dataset, num_epochs=1, eval_dataset=eval_dataset)
        ```
    """

    def __init__(self, num_batches: int) -> None:
        check_positive_int("LimitBatches", "num_batches", num_batches)
        self.num_batches = num_batches
        self._previous: list[str | None] = []

    def __enter__(self) -> LimitBatches:
        self._previous.append(os.environ.get(LIMIT_BATCHES_ENV_VAR))
        os.environ[LIMIT_BATCHES_ENV_VAR] = str(self.num_batches)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        previous = self._previous.pop()
        if previous is None:
            os.environ.pop(LIMIT_BATCHES_ENV_VAR, None)
        else:
            os.environ[LIMIT_BATCHES_ENV_VAR] = previous


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

"""The environment switch that limits the batches of every epoch, for quick debug runs.

``PYTORCH_ACCEL_LIMIT_BATCHES`` (or the ``LimitBatches`` block that sets it) makes new trainers
get a ``LimitBatchesCallback``; the callback is in the catalogue
(``pytorch_accel.callbacks.limit_batches``), which re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from types import TracebackType

from pytorch_accel._checks import check_positive_int, fail

__all__ = ["LIMIT_BATCHES_ENV_VAR", "LimitBatches", "limit_batches_from_environment"]

LIMIT_BATCHES_ENV_VAR = "PYTORCH_ACCEL_LIMIT_BATCHES"
"""The environment variable that makes new trainers use at most that many batches per epoch."""

_OLD_ENV_VAR = "PT_ACC_LIMIT_BATCHES"


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
    if not raw and os.environ.get(_OLD_ENV_VAR, "").strip():
        raw = os.environ[_OLD_ENV_VAR].strip()
        warnings.warn(
            f"{_OLD_ENV_VAR} is pytorch-accelerated's name: set {LIMIT_BATCHES_ENV_VAR} instead.",
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

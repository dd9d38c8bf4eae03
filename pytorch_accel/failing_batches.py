"""Skipping batches whose forward pass fails, or which are empty (opt-in): the policy.

``SkipFailingBatches`` is the policy that ``train``, ``evaluate`` and ``predict`` take
(``skip_failing_batches=...``); a ``FailingBatchGuard`` (``pytorch_accel.plugins``, on the
loop's step hook) runs the step method of each batch,
catching the policy's exceptions (out-of-memory by default). With several processes they
agree on what happened on any of them (one blocking ``AgreedFlag`` exchange per step, only
when the policy is on): a skip, a ``StopTrainingError`` (never skipped: every process stops)
or another error (every process raises), so none waits in a collective for one that did
something else. Each eval epoch of ``train()`` has a guard of its own
(``eval_epoch_guard``): the limit counts per eval epoch.

With several processes and a DDP model, a guarded run keeps DDP out of its collectives: a
guarded evaluation or prediction broadcasts the buffers at its start
(``distributed.broadcast_buffers``); in training every micro-batch runs under ``no_sync``,
and the loop averages the window's gradients and broadcasts the buffers at the window's end
(``distributed.synchronise_replicas``) when a batch of the window was not skipped. So a
failure anywhere in a step, on any process, leaves every process's DDP state the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from pytorch_accel._checks import check_bool, check_positive_int, fail

__all__ = [
    "PREDICT_SKIPPED_METRIC",
    "SKIPPED",
    "SKIPPED_METRIC",
    "SKIPPED_OUTPUT",
    "SkipFailingBatches",
    "is_empty_batch",
    "skip_policy",
]

SKIPPED_METRIC = "train_skipped_batches"
"""The run-history metric of the batches skipped in each training epoch."""

SKIPPED_OUTPUT: Mapping[str, Any] = {"skipped": True, "loss": None, "batch_size": 0}
"""The ``batch_output`` that ``on_train_step_end`` and ``on_eval_step_end`` receive for a
skipped batch."""

SKIPPED: Any = object()
"""What ``FailingBatchGuard.attempt`` returns for a batch every process skips."""

PREDICT_SKIPPED_METRIC = "predict_skipped_batches"
"""The run-history metric of ``predict()``: the 0-based indices of the batches it skipped."""


@dataclasses.dataclass(frozen=True)
class SkipFailingBatches:
    """Skip a training batch whose ``calculate_train_batch_loss`` raises, or which is empty.

    Attributes:
        max_skipped: The most batches one ``train()`` call may skip; one more raises a
            ``RuntimeError`` from the last batch's error.
        exceptions: The exception types that skip a batch (out-of-memory by default: any other
            error still fails at once).
        skip_empty: Skip a batch with no samples (its first tensor has 0 rows, or it is an
            empty container).
    """

    max_skipped: int = 10
    exceptions: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)
    skip_empty: bool = True

    def __post_init__(self) -> None:
        where = "SkipFailingBatches"
        check_positive_int(where, "max_skipped", self.max_skipped)
        if not isinstance(self.exceptions, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, Exception) for kind in self.exceptions
        ):
            fail(
                TypeError,
                where,
                "exceptions",
                self.exceptions,
                "a tuple of Exception classes",
                "Pass e.g. exceptions=(torch.OutOfMemoryError, ValueError).",
            )
        check_bool(where, "skip_empty", self.skip_empty, expected="True or False", fix="Pass True.")


def skip_policy(where: str, value: object) -> SkipFailingBatches | None:
    """Return the policy ``train(skip_failing_batches=value)`` asks for (an int: the limit)."""
    if value is None or isinstance(value, SkipFailingBatches):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        fail(
            TypeError,
            where,
            "skip_failing_batches",
            value,
            "None, an int (the most batches to skip) or a SkipFailingBatches",
            "Pass e.g. skip_failing_batches=10, or SkipFailingBatches(max_skipped=10, ...).",
        )
    check_positive_int(where, "skip_failing_batches", value)
    return SkipFailingBatches(max_skipped=value)


def is_empty_batch(batch: Any) -> bool:
    """Whether ``batch`` holds no samples: an empty container, or a first tensor with 0 rows."""
    if isinstance(batch, torch.Tensor):
        return batch.ndim > 0 and batch.shape[0] == 0
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return False
    if not values:
        return True
    return is_empty_batch(values[0])

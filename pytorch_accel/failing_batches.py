"""Skipping batches whose forward pass fails, or which are empty (opt-in).

``SkipFailingBatches`` is the policy that ``train``, ``evaluate`` and ``predict`` take
(``skip_failing_batches=...``); a ``FailingBatchGuard`` runs the step method of each batch,
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

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel._checks import check_batch_output, check_bool, check_positive_int, fail
from pytorch_accel.distributed import AgreedFlag, broadcast_buffers
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel._state import TrainerState
    from pytorch_accel.trainer import Trainer

__all__ = [
    "PREDICT_SKIPPED_METRIC",
    "SKIPPED",
    "SKIPPED_METRIC",
    "SKIPPED_OUTPUT",
    "FailingBatchGuard",
    "SkipFailingBatches",
    "eval_epoch_guard",
    "guarding",
    "is_empty_batch",
    "record_eval_epoch",
    "skip_policy",
]

SKIPPED_METRIC = "train_skipped_batches"
"""The run-history metric of the batches skipped in each training epoch."""

_OK, _SKIP, _STOP, _FAIL = 0, 1, 2, 3
"""What a guarded step did, agreed as the maximum over the processes: an error beats a stop,
a stop beats a skip."""

SKIPPED_OUTPUT: Mapping[str, Any] = {"skipped": True, "loss": None, "batch_size": 0}
"""The ``batch_output`` that ``on_train_step_end`` and ``on_eval_step_end`` receive for a
skipped batch."""

_STEP_METHODS = {
    "training": "calculate_train_batch_loss",
    "evaluation": "calculate_eval_batch_loss",
    "prediction": "calculate_predict_batch",
}

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


class FailingBatchGuard:
    """Runs the step method of each batch of a ``kind`` under a ``SkipFailingBatches`` policy.

    ``kind`` is ``"training"``, ``"evaluation"`` or ``"prediction"``; ``where`` names the entry
    point in messages. ``skipped`` and ``skipped_indices`` count in the guard's scope (a
    ``train()`` call, an eval epoch, a ``predict()`` call), ``skipped_in_epoch`` per epoch.
    """

    def __init__(
        self,
        policy: SkipFailingBatches,
        num_processes: int,
        where: str = "Trainer.train",
        kind: str = "training",
        agreement: AgreedFlag | None = None,
    ) -> None:
        self.policy, self.where, self.kind = policy, where, kind
        self.skipped = 0
        self.skipped_in_epoch = 0
        self.skipped_indices: list[int] = []
        self.last_skip_reason: str | None = None  # why the last skipped batch was skipped
        self._calls = 0
        self._num_processes = num_processes
        self._window_contributed = False
        self._any_failed = agreement or (AgreedFlag() if num_processes > 1 else None)

    def start(self, model: torch.nn.Module) -> None:
        """Broadcast a DDP model's buffers before a guarded evaluation or prediction.

        Else DDP does it in the first forward, a collective that a failure before that forward
        on one process would leave waiting.
        """
        if self._any_failed is not None and isinstance(
            model, torch.nn.parallel.DistributedDataParallel
        ):
            broadcast_buffers(model)
            model.require_forward_param_sync = False  # done: DDP's forwards broadcast nothing

    def forward(self, trainer: Trainer, batch: Any) -> dict[str, Any] | None:
        """Return the training batch's output, or ``None`` when every process skips it."""
        output = self.attempt(trainer, lambda: trainer.calculate_train_batch_loss(batch), batch)
        if output is SKIPPED:
            return None
        self._window_contributed = True
        return check_batch_output(output, "calculate_train_batch_loss")

    def attempt(self, trainer: Trainer, compute: Callable[[], Any], batch: Any) -> Any:
        """Return ``compute()``'s result, or ``SKIPPED`` when every process skips this batch.

        What happened on any process happens on all: a skip, a ``StopTrainingError`` (never
        skipped), or an error (a ``RuntimeError`` on the others); more than ``max_skipped``
        skips raise a ``RuntimeError`` from the last error.
        """
        index, self._calls = self._calls, self._calls + 1
        error: BaseException | None = None
        outcome = _OK
        output = None
        if self.policy.skip_empty and is_empty_batch(batch):
            error, outcome = RuntimeError("the batch is empty"), _SKIP
        else:
            try:
                output = compute()
            except StopTrainingError as stop:
                error, outcome = stop, _STOP
            except self.policy.exceptions as raised:
                error, outcome = raised, _SKIP
            except Exception as raised:
                if self._any_failed is None:
                    raise
                error, outcome = raised, _FAIL
        own = outcome
        if self._any_failed is not None:
            outcome = self._any_failed.settle(outcome)
        if outcome == _OK:
            return output
        del output
        if outcome == _SKIP:
            self._skip(trainer, error, index)
            return SKIPPED
        if own == outcome and error is not None:  # this process's own stop or error
            raise error
        if outcome == _STOP:
            raise StopTrainingError("Stopping: another process raised StopTrainingError.")
        raise RuntimeError(
            f"{self.where}: {_STEP_METHODS[self.kind]} raised on another process an error that "
            "skip_failing_batches does not skip (see that process's traceback); every process "
            "stops with it."
        )

    def _skip(self, trainer: Trainer, error: BaseException | None, index: int) -> None:
        """Count a skipped batch, say why, and free what the failed step held."""
        self.skipped += 1
        self.skipped_in_epoch += 1
        self.skipped_indices.append(index)
        reason = "another process failed" if error is None else f"{type(error).__name__}: {error}"
        self.last_skip_reason = reason
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        scope = {"training": "", "evaluation": " in one eval epoch"}.get(self.kind, "")
        if self.skipped > self.policy.max_skipped:
            raise RuntimeError(
                f"{self.where}: {self.skipped} {self.kind} batches failed{scope}, more than "
                f"skip_failing_batches allows ({self.policy.max_skipped}); the last: {reason}."
            ) from error
        where = f"update {trainer.num_updates}" if self.kind == "training" else f"batch {index}"
        get_logger().info(
            f"Skipped {self.kind} batch {self.skipped} of at most {self.policy.max_skipped} "
            f"({where}): {reason}"
        )

    def synchronises(self, model: torch.nn.Module) -> bool:
        """Whether the loop, not DDP, synchronises ``model``'s replicas (see the module)."""
        return self._any_failed is not None and isinstance(
            model, torch.nn.parallel.DistributedDataParallel
        )

    def end_window(self) -> bool:
        """Whether a batch of the window that ends here was not skipped (it has gradients)."""
        contributed, self._window_contributed = self._window_contributed, False
        return contributed

    def refuse_all_skipped(self, skipped: int, batches: int) -> None:
        """Raise if an epoch skipped every one of its ``batches`` (it has no loss to record).

        Both counts are agreed across processes, so every process raises at the same point.
        """
        if batches == 0 or skipped < batches:
            return
        raise RuntimeError(
            f"{self.where}: every {self.kind} batch of the epoch failed and was skipped "
            f"({skipped} of {batches}; skip_failing_batches allows {self.policy.max_skipped}), "
            f"so it has no loss to record; the last: {self.last_skip_reason}. Fix what makes "
            "the batches fail (or run without skip_failing_batches to see its traceback)."
        )

    def finish_epoch(self, trainer: Trainer) -> None:
        """Record the epoch's skipped batches in the run history and start counting afresh."""
        trainer.run_history.update_metric(SKIPPED_METRIC, self.skipped_in_epoch)
        self.skipped_in_epoch = 0


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


def record_eval_epoch(guard: FailingBatchGuard, history: Any, loss_name: str) -> None:
    """Record a guarded eval epoch's skipped batches next to its loss ``loss_name``.

    ``eval_loss_epoch`` (in ``train()``): ``eval_skipped_batches``; ``loss`` (``evaluate()``,
    then prefixed ``evaluation_``): ``skipped_batches``.
    """
    history.update_metric(f"{loss_name.partition('loss')[0]}skipped_batches", guard.skipped)


def eval_epoch_guard(guard: FailingBatchGuard, model: torch.nn.Module) -> FailingBatchGuard:
    """The guard of one eval epoch: ``guard``'s policy and agreement, counting afresh, started."""
    scoped = FailingBatchGuard(
        guard.policy, guard._num_processes, guard.where, "evaluation", guard._any_failed
    )
    scoped.start(model)
    return scoped


@contextlib.contextmanager
def guarding(state: TrainerState, policy: object, trainer: Trainer, kind: str) -> Iterator[None]:
    """Guard an ``evaluate()`` or ``predict()`` call (``kind``) with ``policy`` (``None``: not).

    The guard replaces ``state.failing_batches`` meanwhile (the training guard of a
    ``train()`` that a callback evaluates from is put back after it). A prediction records
    the batches it skipped when it ends.
    """
    where = "Trainer.evaluate" if kind == "evaluation" else "Trainer.predict"
    checked = skip_policy(where, policy)
    processes = trainer.accelerator.num_processes
    guard = None if checked is None else FailingBatchGuard(checked, processes, where, kind)
    saved, state.failing_batches = state.failing_batches, guard
    try:
        if guard is not None and kind == "prediction":
            guard.start(trainer.model)
        yield
        if guard is not None and kind == "prediction":
            skipped = list(guard.skipped_indices)
            trainer.run_history.update_metric(PREDICT_SKIPPED_METRIC, skipped)
            if skipped:
                get_logger().warning(
                    f"Trainer.predict: skipped batches {skipped} (0-based): the outputs lack "
                    "their samples (see predict_skipped_batches in the run history)."
                )
    finally:
        state.failing_batches = saved

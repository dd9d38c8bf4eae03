"""The guard of ``skip_failing_batches``: skips a batch whose step method fails, on every process.

A ``FailingBatchGuard`` runs the step method of each batch, catching the policy's exceptions
(``pytorch_accel.failing_batches.SkipFailingBatches``; out-of-memory by default). With
several processes they agree on what happened on any of them (one blocking ``AgreedFlag``
exchange per step, only when the policy is on): a skip, a ``StopTrainingError`` (never
skipped: every process stops) or another error (every process raises), so none waits in a
collective for one that did something else. In training it is the loop's step hook
(``run_step``, see ``pytorch_accel.plugins``); each eval epoch of ``train()`` has a guard of
its own (``for_eval_epoch``): the limit counts per eval epoch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pytorch_accel._checks import check_batch_output
from pytorch_accel.distributed import AgreedFlag, broadcast_buffers
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.failing_batches import (
    PREDICT_SKIPPED_METRIC,
    SKIPPED,
    SKIPPED_METRIC,
    SKIPPED_OUTPUT,
    SkipFailingBatches,
    is_empty_batch,
    skip_policy,
)
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.plugins import TrainStep
    from pytorch_accel.tracking import RunHistory

__all__ = ["FailingBatchGuard", "GuardSlot", "guarding"]

_OK, _SKIP, _STOP, _FAIL = 0, 1, 2, 3
"""What a guarded step did, agreed as the maximum over the processes: an error beats a stop,
a stop beats a skip."""

_STEP_METHODS = {
    "training": "calculate_train_batch_loss",
    "evaluation": "calculate_eval_batch_loss",
    "prediction": "calculate_predict_batch",
}


class GuardSlot(Protocol):
    """Where the loop keeps the guard of the current call (a ``TrainerState``)."""

    failing_batches: FailingBatchGuard | None


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

    def run_step(self, step: TrainStep, batch: Any, scale: float) -> dict[str, Any]:
        """Run the training step of ``batch`` (the loop's step hook); skipped: ``SKIPPED_OUTPUT``.

        The step method runs guarded; then the loss is weighted, tracked and back-propagated.
        """
        output = self.attempt(lambda: step.forward(batch), batch, step.num_updates)
        if output is SKIPPED:
            return dict(SKIPPED_OUTPUT)
        self._window_contributed = True
        batch_output = check_batch_output(output, "calculate_train_batch_loss")
        scaled = step.scaled_loss(batch_output, scale)
        step.track(batch_output)
        step.backward(batch_output, scaled, batch)
        return batch_output

    def attempt(self, compute: Callable[[], Any], batch: Any, num_updates: int = 0) -> Any:
        """Return ``compute()``'s result, or ``SKIPPED`` when every process skips this batch.

        What happened on any process happens on all: a skip, a ``StopTrainingError`` (never
        skipped), or an error (a ``RuntimeError`` on the others); more than ``max_skipped``
        skips raise a ``RuntimeError`` from the last error. ``num_updates``: the updates done
        (training), for the message of a skip.
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
            self._skip(error, index, num_updates)
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

    def _skip(self, error: BaseException | None, index: int, num_updates: int) -> None:
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
        where = f"update {num_updates}" if self.kind == "training" else f"batch {index}"
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

    def finish_epoch(self, history: RunHistory) -> None:
        """Record the epoch's skipped batches in the run history and start counting afresh."""
        history.update_metric(SKIPPED_METRIC, self.skipped_in_epoch)
        self.skipped_in_epoch = 0

    def for_eval_epoch(self, model: torch.nn.Module) -> FailingBatchGuard:
        """The guard of one eval epoch: this policy and agreement, counting afresh, started."""
        scoped = FailingBatchGuard(
            self.policy, self._num_processes, self.where, "evaluation", self._any_failed
        )
        scoped.start(model)
        return scoped

    def record_eval_epoch(self, history: RunHistory, loss_name: str) -> None:
        """Record a guarded eval epoch's skipped batches next to its loss ``loss_name``.

        ``eval_loss_epoch`` (in ``train()``): ``eval_skipped_batches``; ``loss``
        (``evaluate()``, then prefixed ``evaluation_``): ``skipped_batches``.
        """
        history.update_metric(f"{loss_name.partition('loss')[0]}skipped_batches", self.skipped)


@contextlib.contextmanager
def guarding(
    slot: GuardSlot,
    policy: object,
    kind: str,
    num_processes: int,
    model: torch.nn.Module,
    history: RunHistory,
) -> Iterator[None]:
    """Guard an ``evaluate()`` or ``predict()`` call (``kind``) with ``policy`` (``None``: not).

    The guard replaces ``slot.failing_batches`` meanwhile (the training guard of a
    ``train()`` that a callback evaluates from is put back after it). A prediction records
    the batches it skipped when it ends.
    """
    where = "Trainer.evaluate" if kind == "evaluation" else "Trainer.predict"
    checked = skip_policy(where, policy)
    guard = None if checked is None else FailingBatchGuard(checked, num_processes, where, kind)
    saved, slot.failing_batches = slot.failing_batches, guard
    try:
        if guard is not None and kind == "prediction":
            guard.start(model)
        yield
        if guard is not None and kind == "prediction":
            skipped = list(guard.skipped_indices)
            history.update_metric(PREDICT_SKIPPED_METRIC, skipped)
            if skipped:
                get_logger().warning(
                    f"Trainer.predict: skipped batches {skipped} (0-based): the outputs lack "
                    "their samples (see predict_skipped_batches in the run history)."
                )
    finally:
        slot.failing_batches = saved

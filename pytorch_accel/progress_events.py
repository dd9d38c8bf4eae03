"""Progress events: an epoch's step count, reported often enough to watch, never every step.

A progress bar or a live display needs the number of steps done, but not after every step:
firing ``on_train_step_end`` for it costs a dispatch and a listener call on every step, which
on a small model is several microseconds per step. ``ProgressEvents`` fires an epoch's
progress event (``on_train_progress`` or ``on_eval_progress``) after the epoch's first step,
then at strides of steps that double while the events come less than ``interval`` seconds
apart and halve once they come slower, and once more after the epoch's last step. Between
two events a step costs the loop one integer comparison; an event nobody listens to is never
fired.
"""

from __future__ import annotations

import sys
import time

from pytorch_accel.handler import CallbackHandler

__all__ = ["ProgressEvents"]


class ProgressEvents:
    """Fires one epoch's progress event with ``steps_done``, at strides that follow the speed.

    Each step sets ``done`` (the steps of the epoch done, before the step's end event, so that
    a stop raised there still counts the step); the loop calls ``report`` once the step's
    0-based index reaches ``next_step``; ``finish`` reports the last count when the epoch
    ends, also when it ends early. Because the strides depend on the clock, processes fire
    progress events at different steps: a listener must not stop training
    (``StopTrainingError`` becomes a ``RuntimeError`` here) nor call collectives.

    Args:
        handler: The callback handler whose listeners get the event.
        trainer: Passed to the listeners first.
        event: ``"on_train_progress"`` or ``"on_eval_progress"``.
        interval: The time in seconds below which consecutive events double their stride;
            0 fires the event after every step.
    """

    __slots__ = (
        "_event",
        "_handler",
        "_interval",
        "_listened",
        "_reported",
        "_reported_at",
        "_stride",
        "_trainer",
        "done",
        "next_step",
    )

    def __init__(
        self, handler: CallbackHandler, trainer: object, event: str, interval: float
    ) -> None:
        self._handler, self._trainer, self._event = handler, trainer, event
        self._interval = interval
        self._listened = event in handler.active_events
        self._reported_at: float | None = None  # the first event only starts the clock
        self._stride = 1
        self._reported = self.done = 0
        self.next_step = 0 if self._listened else sys.maxsize

    def start_at(self, steps_done: int) -> None:
        """Count from ``steps_done`` (a resumed epoch's skipped batches); report the next step."""
        self._reported = self.done = steps_done
        if self._listened:
            self.next_step = steps_done

    def report(self) -> None:
        """Fire the event with ``done``, then choose the step after which the next one fires."""
        now = time.monotonic()
        if self._reported_at is not None:
            fast = now - self._reported_at < self._interval
            self._stride = self._stride * 2 if fast else max(1, self._stride // 2)
        self._reported_at = now
        self.next_step = self.done - 1 + self._stride
        self._fire()

    def finish(self) -> None:
        """Fire the event once more if steps were done since the last one."""
        if self._listened and self.done > self._reported:
            self._fire()

    def _fire(self) -> None:
        self._reported = self.done
        stop = self._handler.dispatch(self._event, (self._trainer,), {"steps_done": self.done})
        if stop is not None:
            raise RuntimeError(
                f"{self._event} may not stop training: processes fire it at different steps, "
                f"so they could not stop together. Raise StopTrainingError from "
                f"{self._event.replace('progress', 'step_end')} instead."
            ) from stop

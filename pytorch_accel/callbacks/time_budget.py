"""Stop training cleanly after a wall-clock budget, on every process at the same step."""

from __future__ import annotations

import datetime
import math
import numbers
import time
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks.save_state import SaveTrainingStateCallback
from pytorch_accel.checks import check_positive_int, fail
from pytorch_accel.distributed import AgreedFlag, agreement_group
from pytorch_accel.errors import StopTrainingError

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["TimeBudgetCallback"]


class TimeBudgetCallback(TrainerCallback):
    """Stop ``train()`` once ``max_time`` has passed since it started (Lightning's ``max_time``).

    The clock starts at ``on_training_run_start`` of every ``train()`` call (a resumed run
    gets a fresh budget, that of one job) and is read after every ``check_every_n_steps``-th
    step and every epoch (with its evaluation); once over, the run stops there through the
    usual stop events (``trainer.stopped_by`` says why). The step or evaluation in progress is
    finished first: leave a margin of one step (or eval epoch) below a cluster's limit.

    With several processes, they agree at each check whether any is over, so all stop after
    the same step. No step waits for that: the clock is read one step before each check and a
    small asynchronous all-reduce over gloo started, which the check reads; at an epoch's end
    they agree at once. Such a run may overrun the budget by one more step.

    With a ``SaveTrainingStateCallback`` among the trainer's callbacks, a training state
    ``time-limit-<updates>`` is saved in its ``save_dir`` before stopping (and no ``final``),
    so ``train(..., resume_from="latest")`` continues the run. Order ``1001``: after the other
    callbacks (and ``SaveTrainingStateCallback``), so the state includes what they did.

    Args:
        max_time: The budget: seconds, or a ``datetime.timedelta``.
        check_every_n_steps: Read the clock (and agree across processes) every n-th step.

    Attributes:
        elapsed: Seconds since the current (or last) ``train()`` started, at the last check.
        stopped: Whether the budget stopped the last run.
    """

    order = 1001
    agreed_stop_events = frozenset({"on_train_step_end", "on_training_run_epoch_end"})

    def __init__(self, max_time: float | datetime.timedelta, check_every_n_steps: int = 1) -> None:
        where = "TimeBudgetCallback"
        self.max_time = _seconds(where, max_time)
        check_positive_int(where, "check_every_n_steps", check_every_n_steps)
        self.check_every_n_steps = check_every_n_steps
        self.elapsed = 0.0
        self.stopped = False
        self._started = 0.0
        self._steps = 0
        self._group: Any = None
        self._over: AgreedFlag | None = None

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the clock (and, with several processes, the group that agrees on it)."""
        self._steps, self.elapsed, self.stopped = 0, 0.0, False
        self._over = None
        if trainer.accelerator.num_processes > 1:
            if self._group is None:
                self._group = agreement_group()
            self._over = AgreedFlag(self._group)
        self._started = time.monotonic()

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Stop if the budget is over, every ``check_every_n_steps`` steps."""
        self._steps += 1
        every, flag = self.check_every_n_steps, self._over
        if self._steps % every == 0:  # several processes: read one step before, on every one
            self._stop_if(trainer, self._read_clock() if flag is None else bool(flag.finish()))
        if flag is not None and (self._steps + 1) % every == 0:
            flag.start(int(self._read_clock()))

    def on_training_run_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Stop if the budget is over (the epoch and its evaluation are done)."""
        over = self._read_clock()
        if self._over is not None:
            over = bool(self._over.settle(int(over)))
        self._stop_if(trainer, over)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Finish an exchange a stop left open (it was started on every process)."""
        if self._over is not None:
            self._over.finish()
            self._over = None

    def _read_clock(self) -> bool:
        self.elapsed = time.monotonic() - self._started
        return self.elapsed >= self.max_time

    def _stop_if(self, trainer: TrainerLike, over: bool) -> None:
        if not over:
            return
        self.stopped = True
        saved = ""
        saver = _saver(trainer)
        if saver is not None:
            path = saver.save_to_resume(trainer, "time-limit")
            saved = f"; the training state was saved to {str(path)!r}"
        raise StopTrainingError(
            f"Time budget of {self.max_time:g} s reached after {trainer.num_updates} updates"
            f"{saved}."
        )


def _saver(trainer: TrainerLike) -> SaveTrainingStateCallback | None:
    """The trainer's ``SaveTrainingStateCallback``, unless it is already saving a preemption."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, SaveTrainingStateCallback):
            return callback if callback.preempted_by is None else None
    return None


def _seconds(where: str, max_time: object) -> float:
    """``max_time`` in seconds, checked to be a finite positive duration."""
    if isinstance(max_time, datetime.timedelta):
        seconds = max_time.total_seconds()
    else:
        if isinstance(max_time, bool) or not isinstance(max_time, numbers.Real):
            fail(
                TypeError,
                where,
                "max_time",
                max_time,
                "seconds or a datetime.timedelta",
                "Pass e.g. max_time=datetime.timedelta(hours=23, minutes=30), or 3600.",
            )
        seconds = float(max_time)
    if not (math.isfinite(seconds) and seconds > 0):
        fail(
            ValueError,
            where,
            "max_time",
            max_time,
            "a finite duration > 0",
            "Pass the wall-clock time the run may take, e.g. 3600 for an hour.",
        )
    return seconds

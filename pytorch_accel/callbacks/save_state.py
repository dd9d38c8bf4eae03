"""Save resumable training states periodically, keep the last few, and save on preemption."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytorch_accel._checkpointing.store import (
    find_training_states,
    prepare_saving,
    refuse_fsdp1,
    remove_training_state,
    tidy_save_dir,
)
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_number, check_path, check_positive_int, fail
from pytorch_accel.distributed import AgreedFlag, agreement_group
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = ["SaveTrainingStateCallback"]

_MAX_STEPS_BETWEEN_CHECKS = 10_000
_SAME_SIGNAL_SECONDS = 1.0
"""A signal this soon after the first is the same one, forwarded (torchrun forwards the
SIGINT or SIGTERM the whole process group got to its workers)."""
_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


class SaveTrainingStateCallback(TrainerCallback):
    """Save training states to ``save_dir`` to resume from, and on a preemption signal.

    Each state is a directory written by ``Trainer.save_training_state`` (atomic, complete
    only with its manifest). ``trainer.train(..., resume_from="latest")``, with this callback
    among the trainer's callbacks, resumes the newest or starts afresh when there is none, so
    the same command serves the first launch and every requeue.

    Names: ``updates-<n>`` (``n``: ``trainer.global_num_updates``, counted over the run, so
    a later ``train()`` never replaces an earlier call's states), ``epoch-<n>``,
    ``preempted-<n>``, ``interrupted-<n>``, ``time-limit-<n>`` (``TimeBudgetCallback``, through
    ``save_to_resume``) and ``final`` (unless preempted or interrupted).

    On a preemption signal the current step is finished, a state is saved, the run stops
    through the usual stop events, and the process exits with status 0 (``SystemExit(0)``
    after ``on_training_run_end``) unless ``exit_on_preemption=False``. A second signal ends
    the process at once; one within 1 s of the first is the same (forwarded by torchrun).
    With ``save_on_interrupt=True``, Ctrl-C is handled the same way, and then
    ``KeyboardInterrupt`` propagates from ``train()``; a second Ctrl-C interrupts at once.
    With several processes, they agree whether any received the signal without blocking a
    step (a small asynchronous all-reduce over gloo about every ``preemption_check_interval``
    seconds, read at a later step; at once at an epoch's end), so all save the same step, at
    most about twice the interval (and a step) after the signal.

    With ``async_save=True`` the periodic saves stall training only while the state is copied
    to host memory: it is written in a background thread and published at a later step
    boundary once every process has written its part. At most one save is in flight; the
    others wait for it, and ``train()`` returns once every save is complete. A background
    write's error is raised at the next step boundary or at the run's end. With
    ``max_checkpoints``, one more state may exist while a save is in flight.

    Order ``1000``: after the other callbacks of each event, so a state includes what they
    did in that event.

    Args:
        save_dir: The directory that holds the states (in ``trainer.run_dir`` when left out
            and the trainer has an ``output_dir``).
        save_every_n_epochs: Save after every n-th epoch (with its evaluation).
        save_every_n_steps: Save after every n-th optimizer update.
        save_at_end: Save ``final`` when ``train()`` ends (not after a preemption).
        max_checkpoints: Keep only the newest this many states (deleted by the main process).
        preemption_signals: Signals that save a state and stop (add ``signal.SIGUSR1`` for
            SLURM's ``--signal=USR1@90``); ``()`` installs no handler.
        exit_on_preemption: Exit the process with status 0 after a preemption.
        preemption_check_interval: With several processes, about how many seconds pass
            between two agreements on a signal (at least one step; ``0``: after every step).
        save_on_interrupt: On Ctrl-C, save ``interrupted-<n>`` at the end of the current step
            (a state that resumes exactly), then raise ``KeyboardInterrupt``.
        async_save: Write the periodic saves (``updates-<n>``, ``epoch-<n>``) in the
            background.
    """

    order = 1000
    # it stops only after agreeing on a signal, and never at a run's start or end
    agreed_stop_events = frozenset(
        {
            "on_training_run_start",
            "on_train_step_end",
            "on_training_run_epoch_end",
            "on_training_run_end",
        }
    )

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = DefaultPath("training_states"),
        save_every_n_epochs: int | None = None,
        save_every_n_steps: int | None = None,
        save_at_end: bool = True,
        max_checkpoints: int | None = None,
        preemption_signals: Iterable[int] = (signal.SIGTERM,),
        exit_on_preemption: bool = True,
        preemption_check_interval: float = 0.25,
        save_on_interrupt: bool = False,
        async_save: bool = False,
    ) -> None:
        where = "SaveTrainingStateCallback"
        check_path(where, "save_dir", save_dir, directory=True)
        check_positive_int(where, "save_every_n_epochs", save_every_n_epochs, allow_none=True)
        check_positive_int(where, "save_every_n_steps", save_every_n_steps, allow_none=True)
        check_bool(where, "save_at_end", save_at_end)
        check_positive_int(where, "max_checkpoints", max_checkpoints, allow_none=True)
        check_bool(where, "exit_on_preemption", exit_on_preemption)
        check_bool(where, "save_on_interrupt", save_on_interrupt)
        self.save_on_interrupt = save_on_interrupt
        check_bool(where, "async_save", async_save)
        self.async_save = async_save
        check_number(where, "preemption_check_interval", preemption_check_interval, finite=True)
        self.preemption_check_interval = float(preemption_check_interval)
        self.save_dir = Path(save_dir)
        self._run_paths = RunPaths(save_dir=save_dir)
        self.save_every_n_epochs = save_every_n_epochs
        self.save_every_n_steps = save_every_n_steps
        self.save_at_end = save_at_end
        self.max_checkpoints = max_checkpoints
        self.preemption_signals = _check_signals(where, preemption_signals)
        self.exit_on_preemption = exit_on_preemption
        self.preempted_by: signal.Signals | None = None
        self._received: int | None = None
        self._received_at = 0.0
        self._previous: dict[int, Any] = {}  # what signal.signal returned
        self._updates_seen = 0
        self._group: Any = None
        self._signal_flag: AgreedFlag | None = None
        self._pace = _Pace()
        self._interrupted = False

    def training_states_dir(self) -> Path:
        """``save_dir``, where ``train(resume_from="latest")`` finds the newest state."""
        return self.save_dir

    def redirect_outputs(self, directory: Path) -> AbstractContextManager[None]:
        """Write the training states under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "save_dir")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the training states under ``run_dir`` if ``save_dir`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Refuse FSDP1; repair and clear what killed saves left; install the signal handlers."""
        refuse_fsdp1(trainer.accelerator, "SaveTrainingStateCallback")  # before any epoch
        prepare_saving()
        self.preempted_by, self._received, self._interrupted = None, None, False
        self._updates_seen = trainer.global_num_updates
        if trainer.resumed_from is not None:  # (a run that resumed nothing reads nothing here)
            trainer.accelerator.wait_for_everyone()  # every process loaded what it resumed from
        if trainer.accelerator.is_main_process:
            tidy_save_dir(self.save_dir, _is_state_name)
        self._signal_flag = None
        if self._signals() and trainer.accelerator.num_processes > 1:
            if self._group is None:
                self._group = agreement_group()
            self._signal_flag = AgreedFlag(self._group)
            self._pace = _Pace()
        self._install_handlers()

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Save on a preemption signal, or every ``save_every_n_steps`` updates."""
        self._handle_preemption(trainer, at_epoch_end=False)
        updates = trainer.global_num_updates
        every = self.save_every_n_steps
        if every is not None and updates != self._updates_seen and updates % every == 0:
            self._save(trainer, f"updates-{updates:08d}", blocking=not self.async_save)
        self._updates_seen = updates

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Save on a preemption signal, or every ``save_every_n_epochs`` epochs."""
        self._handle_preemption(trainer, at_epoch_end=True)
        epoch = trainer.run_history.current_epoch
        every = self.save_every_n_epochs
        if every is not None and epoch % every == 0:
            self._save(trainer, f"epoch-{epoch:04d}", blocking=not self.async_save)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Restore the signal handlers; save ``final``; exit after a preemption if asked to."""
        self._restore_handlers()
        if self._signal_flag is not None:
            self._signal_flag.finish()  # an exchange a stop left open, started on every process
            self._signal_flag = None
        if self.preempted_by is None:
            if self.save_at_end and not self._interrupted:
                self._save(trainer, "final")
            return
        if self.preempted_by == signal.SIGINT:
            raise KeyboardInterrupt  # as an interrupt without a save would: the state is saved
        if self.exit_on_preemption:
            get_logger().info(
                f"Exiting after {self.preempted_by.name}: resume with the saved state."
            )
            raise SystemExit(0)

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """Put back the signal handlers a failed or interrupted run left installed."""
        self._restore_handlers()
        self._signal_flag = None  # an exchange left open: the other processes may be gone

    def save_to_resume(self, trainer: Trainer, prefix: str) -> Path:
        """Save ``<prefix>-<updates>`` for a run that stops to be resumed; skip ``final``.

        For callbacks that stop a run that is not finished (``TimeBudgetCallback``): the state
        they save here is the newest, so ``resume_from="latest"`` continues from it. Call it on
        every process, from ``on_train_step_end`` or ``on_training_run_epoch_end``. ``prefix``
        is the name before the update count, e.g. ``"time-limit"``; returns the state's directory.
        """
        self._interrupted = True
        return self._save(trainer, f"{prefix}-{trainer.global_num_updates:08d}")

    def _save(self, trainer: Trainer, name: str, blocking: bool = True) -> Path:
        path = trainer.save_training_state(self.save_dir / name, blocking=blocking)
        if self.max_checkpoints is not None and trainer.accelerator.is_main_process:
            for old in find_training_states(self.save_dir)[: -self.max_checkpoints]:
                remove_training_state(old)
        trainer.accelerator.wait_for_everyone()
        return path

    def _handle_preemption(self, trainer: Trainer, at_epoch_end: bool) -> None:
        """If any process received a preemption signal, save and stop (on every process)."""
        if not self._signals():
            return
        received = self._received
        if self._signal_flag is not None:
            received = self._agreed_signal(self._signal_flag, received or 0, at_epoch_end)
        if received is None:
            return
        self.preempted_by = signal.Signals(received)
        interrupted = self.preempted_by == signal.SIGINT
        name = "interrupted" if interrupted else "preempted"
        path = self._save(trainer, f"{name}-{trainer.global_num_updates:08d}")
        what = "Interrupted (Ctrl-C)" if interrupted else f"Preempted by {self.preempted_by.name}"
        stop = StopTrainingError(
            f"{what}: the training state was saved to {str(path)!r}; resume with "
            "train(..., resume_from='latest')."
        )
        if interrupted:  # the stop's cause: the run record says "interrupted"
            raise stop from KeyboardInterrupt()
        raise stop

    def _agreed_signal(self, flag: AgreedFlag, received: int, at_epoch_end: bool) -> int | None:
        """The signal any process received, as agreed by all (the same on every process).

        At an exchange point (every ``_Pace.every`` steps, a number all processes agreed on):
        what the exchange started at the point before says, then a new exchange starts, with
        this process's proposal for the next number of steps, unless that one ends the run.
        At an epoch's end: agreed at once.
        """
        if at_epoch_end:
            return flag.settle(received) or None
        proposal = self._pace.step(self.preemption_check_interval)
        if proposal is None:
            return None
        agreed = flag.finish()
        self._pace.every = max(1, flag.agreed_pace)
        if not agreed:
            flag.start(received, proposal)
        return agreed or None

    def _signals(self) -> tuple[int, ...]:
        """The signals handled: the preemption signals, and SIGINT with ``save_on_interrupt``."""
        interrupt = (int(signal.SIGINT),) if self.save_on_interrupt else ()
        return tuple(dict.fromkeys((*self.preemption_signals, *interrupt)))

    def _install_handlers(self) -> None:
        if not self._signals():
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "SaveTrainingStateCallback: train() runs outside the main thread, where signal "
                "handlers cannot be installed; preemption signals are not handled.",
                stacklevel=2,
            )
            return
        for signum in self._signals():
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._received is not None:
            if now - self._received_at < _SAME_SIGNAL_SECONDS:  # forwarded by a launcher
                return
            self._restore_handlers()  # a second signal: stop waiting for the step to end
            signal.raise_signal(signum)
            return
        self._received, self._received_at = signum, now


class _Pace:
    """Counts steps to the next exchange point; proposes how many steps make ``seconds``.

    ``every`` is only ever set to a number all processes agreed on, and every process counts
    the same steps, so all reach each exchange point at the same step.
    """

    def __init__(self) -> None:
        self.every = 1
        self._steps = 0
        self._since = time.monotonic()

    def step(self, seconds: float) -> int | None:
        """Count a step; at an exchange point, return the proposal for the next, else None."""
        self._steps += 1
        if self._steps < self.every:
            return None
        now = time.monotonic()
        step_seconds = (now - self._since) / self._steps
        self._steps, self._since = 0, now
        if seconds <= 0:
            return 1
        return max(1, min(_MAX_STEPS_BETWEEN_CHECKS, int(seconds / max(step_seconds, 1e-9))))


def _check_signals(where: str, signals: Iterable[int]) -> tuple[int, ...]:
    try:
        checked = tuple(signal.Signals(signum) for signum in signals)
    except (TypeError, ValueError):
        fail(
            ValueError,
            where,
            "preemption_signals",
            signals,
            "signal numbers",
            "Pass e.g. (signal.SIGTERM, signal.SIGUSR1), or () to handle none.",
        )
    uncatchable = [signum.name for signum in checked if signum in _UNCATCHABLE]
    if uncatchable:
        fail(
            ValueError,
            where,
            "preemption_signals",
            uncatchable,
            "signals a process can catch",
            "SIGKILL and SIGSTOP cannot be handled, so nothing could be saved on them; Slurm "
            "and Kubernetes send SIGTERM (or a signal you choose, e.g. SIGUSR1) first.",
        )
    return tuple(int(signum) for signum in checked)


def _is_state_name(name: str) -> bool:
    """Whether ``name`` is one this callback gives the states it saves."""
    pattern = r"(updates|epoch|preempted|interrupted|time-limit)-\d+|final"
    return re.fullmatch(pattern, name) is not None

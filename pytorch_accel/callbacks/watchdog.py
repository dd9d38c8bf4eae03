"""Name the process that holds a run up: a hang watchdog, and per-process step times."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_count, check_number, check_path, fail
from pytorch_accel.distributed import gather_rows, main_process_object
from pytorch_accel.files import atomic_write
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["WatchdogCallback"]

REPORT_FILE = "hang-report.txt"
"""The report naming the processes that are behind, with every process's stacks."""

_VERDICT_FILE = "hang-report.json"
_CLAIM_FILE = "hang-report.claim"
_HEARTBEAT = "heartbeat-rank{}.json"
_SILENT = 4
"""Heartbeats after which a process whose heartbeat did not change is not responding."""
_STACKS = "stacks-rank{}.txt"

# where a process is: (phase, what it is doing); {epoch}, {done} and {index} are filled in
_STAGES = (
    ("run", "starting the run"),
    ("train", "waiting for the epoch's first batch"),
    ("train", "batch {index}: computing the loss (forward)"),
    ("train", "batch {index}: backward (DDP all-reduces the gradients with the other processes)"),
    ("train", "batch {index}: after backward (the update, the step's end)"),
    ("train", "after batch {last}: in the step's end events, or fetching the next batch"),
    ("train", "the train epoch's end (its loss and metrics)"),
    ("eval", "waiting for the first eval batch"),
    ("eval", "eval batch {eval_index}: computing the loss"),
    ("eval", "after eval batch {eval_last}: fetching the next batch"),
    ("eval", "the eval epoch's end (its loss and metrics)"),
    ("run", "the epoch's end events (saving, logging)"),
)
(
    _RUN_START,
    _EPOCH_START,
    _FORWARD,
    _BACKWARD,
    _AFTER_BACKWARD,
    _AFTER_STEP,
    _EPOCH_END,
    _EVAL_START,
    _EVAL_STEP,
    _AFTER_EVAL_STEP,
    _EVAL_END,
    _RUN_EPOCH_END,
) = range(len(_STAGES))


class WatchdogCallback(TrainerCallback):
    """Name the process that holds a run up, with every process's stacks, then end the job.

    It watches ``train()`` and ``evaluate()``. When no step (training or evaluation) and no
    epoch boundary has passed on a process for ``timeout_s`` seconds, the watchdog writes a
    report naming the processes that are behind (their last completed batch, what they were
    doing, their Python stacks) to ``<directory>/hang-report.txt`` and to the log and standard
    error, and every process exits with ``exit_code`` (75 by default,
    ``WatchdogCallback.EXIT_CODE``). A hung collective cannot be left cleanly, so each process
    ends with ``os._exit`` once its report is written and flushed (its ``multiprocessing``
    children, the data-loader workers, are killed first): no ``finally`` block, ``atexit``
    function or ``on_exception`` runs. Resume from the last saved training state.

    The steps pay for it with a few attribute assignments and a ``time.monotonic()`` per event:
    no collective, no host read. A monitor thread per process writes a small heartbeat file
    (``heartbeat-rank<N>.json``, atomically) every ``heartbeat_s`` seconds, saying how far the
    process got; the processes agree on the directory once, when the run starts. When a
    process's own progress stalls past ``timeout_s``, its monitor compares the heartbeats
    (read from a third of the timeout on; a process making progress reads none): a process
    whose heartbeat stopped changing (``SIGSTOP``, a frozen node, a C call holding the GIL) is
    named from its last heartbeat; a process that went through fewer of the loop's events
    than another is behind (it is still in a step the others finished, or waiting for a
    batch); the processes that are ahead are waiting for it in a collective, which their
    stacks show. The first monitor to decide writes the report; every other process that can
    still run sees it at its next heartbeat, writes its own stacks (``stacks-rank<N>.txt``),
    and they exit together. A process that cannot run (stopped, frozen) is ended by the
    launcher once the others have exited (torchrun: ``SIGTERM``, then ``SIGKILL`` 30 s later).

    At each training epoch's end every process's mean step time is gathered (one small
    collective per epoch, where all processes meet anyway) and recorded:
    ``train_step_seconds`` (the mean time per step, data loading included),
    ``train_slowest_process`` and ``train_step_skew`` (the slowest process's time over the
    median process's), and a log line gives every process's time. For the comparison a
    process's step time is its time outside the backward pass: DDP's gradient all-reduce
    makes every process wait there for the slowest one, which would hide it.

    Set ``timeout_s`` above the longest legitimate pause between two steps: the first step
    (data-loader workers starting, ``torch.compile``), a save or an evaluation set-up at an
    epoch's end. Evaluation steps count as progress. The directory must be shared by the
    processes (on several machines, a shared file system); a process that cannot see the
    others' heartbeats warns when ``train()`` starts, and its report lists them as unseen.
    Order ``-1000``: first in each event.

    Args:
        timeout_s: Seconds without progress after which the run is declared hung.
        directory: Where heartbeats and reports go: ``watchdog`` under the run directory with
            ``Trainer(output_dir=...)``, else under the working directory.
        heartbeat_s: Seconds between heartbeats and checks; ``None``: ``timeout_s / 6``, at
            most 10. A heartbeat unchanged for four intervals is a process not responding.
        exit_code: The exit code of the processes the watchdog ends.
        step_times: Gather and record the per-process step times at each epoch's end.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If ``timeout_s`` is not > 0, ``heartbeat_s`` not below ``timeout_s``, or
            ``exit_code`` not in 1..255.

    Example:
        ```python
        watchdog = WatchdogCallback(timeout_s=300)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, watchdog))
        ```
    """

    order = -1000
    may_stop_training = False
    EXIT_CODE: ClassVar[int] = 75
    """The default ``exit_code``: ``EX_TEMPFAIL`` of ``sysexits.h`` (try again: resume)."""

    def __init__(
        self,
        timeout_s: float = 600.0,
        *,
        directory: str | os.PathLike[str] = DefaultPath("watchdog"),
        heartbeat_s: float | None = None,
        exit_code: int = EXIT_CODE,
        step_times: bool = True,
    ) -> None:
        where = "WatchdogCallback"
        fix = "Pass the seconds a step may take at most, e.g. timeout_s=600."
        check_number(where, "timeout_s", timeout_s, strict=True, finite=True, fix=fix)
        check_path(where, "directory", directory, directory=True)
        fix = "Pass heartbeat_s=None (timeout_s / 6), or a few seconds below timeout_s."
        check_number(where, "heartbeat_s", heartbeat_s, strict=True, allow_none=True, fix=fix)
        if heartbeat_s is not None and not heartbeat_s < timeout_s:
            expected = f"a number below timeout_s ({timeout_s})"
            fail(ValueError, where, "heartbeat_s", heartbeat_s, expected, fix)
        check_count(where, "exit_code", exit_code, minimum=1)
        if exit_code > 255:
            fix = f"Pass a code in 1..255, e.g. the default {self.EXIT_CODE}."
            fail(ValueError, where, "exit_code", exit_code, "an int in 1..255", fix)
        check_bool(where, "step_times", step_times)
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = min(self.timeout_s / 6, 10.0) if heartbeat_s is None else heartbeat_s
        self.directory = Path(directory)
        self._run_paths = RunPaths(directory=directory)
        self.exit_code = exit_code
        self.step_times = step_times
        self._monitor: _Monitor | None = None
        self._watching: str | None = None  # "train" or "evaluate": the run that started it
        # the training thread's marks: assignments only, read by the monitor thread
        self._ticks = 0
        self._moved = time.monotonic()
        self._stage = _RUN_START
        self._epoch = 0
        self._done = 0
        self._eval_done = 0
        # the step times of the current epoch
        self._cycle_start = self._backward_start = self._paused_at = 0.0
        self._cycles = self._backwards = 0.0
        self._steps = 0

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write heartbeats and reports under ``directory`` meanwhile (``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "directory")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the default ``watchdog`` directory under the run directory."""
        self._run_paths.place(self, run_dir)

    # -------------------------------------------------------------- the training thread

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Agree on the directory, write the first heartbeat and start the monitor thread."""
        self._stop_monitor()
        self._start(trainer, "train")

    def on_evaluation_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Watch ``evaluate()`` too (unless a training run is watched already)."""
        if self._monitor is None:
            self._start(trainer, "evaluate")

    def on_evaluation_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Stop the monitor thread ``on_evaluation_run_start`` started."""
        if self._watching == "evaluate":
            self._stop_monitor()

    def _start(self, trainer: TrainerLike, watching: str) -> None:
        self._watching = watching
        self._ticks, self._stage, self._moved = 0, _RUN_START, time.monotonic()
        accelerator = trainer.accelerator
        rank, size = accelerator.process_index, accelerator.num_processes
        directory, token = self.directory, f"{os.getpid()}-{time.time_ns()}"
        if rank == 0:
            _clear(directory)
        if size > 1:  # the main process's directory and run token, on every process
            shared = main_process_object((os.fspath(directory), token))
            directory, token = Path(shared[0]), str(shared[1])
        monitor = _Monitor(self, directory, token, rank, size)
        monitor.beat()
        if size > 1:
            accelerator.wait_for_everyone()  # every first heartbeat is written
            monitor.check_visible()
        self._monitor = monitor
        monitor.start()

    def on_train_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the epoch's start; start its step clock."""
        self._epoch = trainer.run_history.current_epoch
        self._done = 0
        self._ticks += 1
        self._stage = _EPOCH_START
        self._moved = self._cycle_start = time.monotonic()
        self._cycles = self._backwards = 0.0
        self._steps = 0
        self._paused_at = 0.0

    def on_train_step_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the step's start."""
        self._ticks += 1
        self._stage = _FORWARD
        self._moved = time.monotonic()

    def on_backward_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the backward pass's start."""
        self._ticks += 1
        self._stage = _BACKWARD
        self._moved = self._backward_start = time.monotonic()

    def on_backward_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the backward pass's end; count its time."""
        self._ticks += 1
        self._stage = _AFTER_BACKWARD
        self._moved = now = time.monotonic()
        self._backwards += now - self._backward_start

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Mark the step done; count its time (from the previous step's end)."""
        self._ticks += 1
        self._stage = _AFTER_STEP
        self._done = kwargs.get("step", self._done) + 1
        self._moved = now = time.monotonic()
        self._cycles += now - self._cycle_start
        self._cycle_start = now
        self._steps += 1

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the epoch's end; gather and record the processes' step times."""
        self._ticks += 1
        self._stage = _EPOCH_END
        self._moved = time.monotonic()
        if self.step_times:
            self._record_step_times(trainer)

    def on_eval_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the evaluation's start; pause the step clock inside a training epoch."""
        self._eval_done = 0
        self._ticks += 1
        self._stage = _EVAL_START
        self._moved = self._paused_at = time.monotonic()

    def on_eval_step_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the eval step's start."""
        self._ticks += 1
        self._stage = _EVAL_STEP
        self._moved = time.monotonic()

    def on_eval_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Mark the eval step done."""
        self._ticks += 1
        self._stage = _AFTER_EVAL_STEP
        self._eval_done += 1
        self._moved = time.monotonic()

    def on_eval_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the evaluation's end; resume the step clock."""
        self._ticks += 1
        self._stage = _EVAL_END
        self._moved = now = time.monotonic()
        if self._paused_at:
            self._cycle_start += now - self._paused_at
            self._paused_at = 0.0

    def on_training_run_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark the epoch's end events."""
        self._ticks += 1
        self._stage = _RUN_EPOCH_END
        self._moved = time.monotonic()

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Stop the monitor thread (the run's last events are not watched)."""
        self._stop_monitor()

    def on_exception(self, trainer: TrainerLike, exception: BaseException, **kwargs: Any) -> None:
        """Stop the monitor thread."""
        self._stop_monitor()

    def _stop_monitor(self) -> None:
        self._watching = None
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            monitor.stop()

    def _record_step_times(self, trainer: TrainerLike) -> None:
        """Gather each process's mean step times (one collective) and record them."""
        steps = self._steps
        cycle = self._cycles / steps if steps else 0.0
        own = (self._cycles - self._backwards) / steps if steps else 0.0
        row = torch.tensor([cycle, own, float(steps)], dtype=torch.float64)
        if trainer.accelerator.num_processes > 1:
            device = trainer.device
            dtype = torch.float64 if device.type == "cpu" else torch.float32
            rows = gather_rows(row.to(device, dtype))
        else:
            rows = [row.tolist()]
        if any(counted == 0 for _, _, counted in rows):
            return  # an epoch stopped before its first step
        owns = [own for _, own, _ in rows]
        slowest = max(range(len(owns)), key=owns.__getitem__)
        median = statistics.median(owns)
        skew = owns[slowest] / median if median > 0 else 1.0
        history = trainer.run_history
        history.update_metric("train_step_seconds", statistics.fmean(c for c, _, _ in rows))
        history.update_metric("train_slowest_process", slowest)
        history.update_metric("train_step_skew", skew)
        each = ", ".join(f"{rank}: {own:.4g} s" for rank, own in enumerate(owns))
        get_logger().info(
            "step times, epoch %d: slowest process %d (%.4g s per step outside backward; "
            "median %.4g s; skew %.3g); per process: %s",
            self._epoch,
            slowest,
            owns[slowest],
            median,
            skew,
            each,
        )

    # -------------------------------------------------------------- for the monitor thread

    @property
    def last_progress(self) -> float:
        """The ``time.monotonic()`` of the training thread's last event."""
        return self._moved

    def position(self) -> dict[str, Any]:
        """Where the training thread is, as of its last event (read from the monitor thread)."""
        stage, done, eval_done = self._stage, self._done, self._eval_done
        phase, doing = _STAGES[stage]
        fields = {
            "index": done,
            "last": done - 1,
            "eval_index": eval_done,
            "eval_last": eval_done - 1,
        }
        return {
            "ticks": self._ticks,
            "idle_s": round(time.monotonic() - self._moved, 3),
            "phase": phase,
            "epoch": self._epoch,
            "batches_done": done,
            "eval_batches_done": eval_done,
            "doing": doing.format(**fields),
        }


class _Monitor(threading.Thread):
    """A process's monitor: writes its heartbeat, watches its progress, ends a hung job."""

    def __init__(
        self, owner: WatchdogCallback, directory: Path, token: str, rank: int, size: int
    ) -> None:
        super().__init__(name=f"pytorch_accel-watchdog-{rank}", daemon=True)
        self.owner, self.directory, self.token = owner, directory, token
        self.rank, self.size = rank, size
        self.state = "running"
        self._halt = threading.Event()
        self._beats = 0
        self._heard: dict[int, tuple[int, float]] = {}  # rank: (beat, when it last changed)
        self._host = socket.gethostname()
        self._warned = False

    def run(self) -> None:
        """Beat, check, and end the job once a hang is declared."""
        interval = self.owner.heartbeat_s
        try:
            while not self._halt.wait(interval):
                self.beat()
                verdict = self._check()
                if verdict is not None and not self._halt.is_set():
                    self._end(verdict)
        except Exception:  # the watchdog never ends a run for a fault of its own
            get_logger().exception("WatchdogCallback: the monitor thread failed; not watching")

    def stop(self) -> None:
        """Stop watching; remove this process's heartbeat."""
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=self.owner.heartbeat_s + 5)
        with contextlib.suppress(OSError):
            self._path(_HEARTBEAT.format(self.rank)).unlink(missing_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / name

    def beat(self) -> None:
        """Write this process's heartbeat (atomically)."""
        self._beats += 1
        beat = {
            "token": self.token,
            "rank": self.rank,
            "pid": os.getpid(),
            "host": self._host,
            "beat": self._beats,
            "state": self.state,
            **self.owner.position(),
        }
        try:
            atomic_write(self._path(_HEARTBEAT.format(self.rank)), json.dumps(beat))
        except OSError as error:
            if not self._warned:
                self._warned = True
                get_logger().warning("WatchdogCallback: cannot write its heartbeat: %s", error)

    def check_visible(self) -> None:
        """Warn if another process's first heartbeat is not visible (no shared directory)."""
        missing = [rank for rank in range(self.size) if self._read(rank) is None]
        if missing:
            sys.stderr.write(
                f"WatchdogCallback: process {self.rank} cannot see the heartbeats of processes "
                f"{missing} in {str(self.directory)!r}: give the watchdog a directory all "
                "processes share (a shared file system on several machines). If the run "
                "hangs, its report cannot say where they are.\n"
            )

    def _read(self, rank: int) -> dict[str, Any] | None:
        """Another process's heartbeat of this run, or ``None``."""
        path = self._path(_HEARTBEAT.format(rank))
        try:
            if path.is_symlink():
                return None
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return beat if isinstance(beat, dict) and beat.get("token") == self.token else None

    def _peers(self) -> dict[int, dict[str, Any]]:
        """Every process's latest heartbeat (this one's fresh), with ``silent_s``."""
        now = time.monotonic()
        beats: dict[int, dict[str, Any]] = {}
        for rank in range(self.size):
            if rank == self.rank:
                own = {"rank": rank, "pid": os.getpid(), "host": self._host, "state": self.state}
                beats[rank] = {**own, **self.owner.position(), "silent_s": 0.0}
                continue
            beat = self._read(rank)
            if beat is None:
                continue
            number = int(beat.get("beat", 0))
            seen = self._heard.get(rank)
            if seen is None or seen[0] != number:
                self._heard[rank] = seen = (number, now)
            beats[rank] = {**beat, "silent_s": round(now - seen[1], 3)}
        return beats

    def _check(self) -> dict[str, Any] | None:
        """The verdict, once this process stalled past the timeout or another declared a hang.

        The others' heartbeats are read only once this process has stalled for a third of the
        timeout, so that by the timeout a silent one has been watched for four heartbeats
        (until then one file is read per heartbeat: a shared file system is spared).
        """
        verdict = self._read_verdict()
        if verdict is not None:
            return verdict
        idle = time.monotonic() - self.owner.last_progress
        if idle < self.owner.timeout_s / 3:
            return None
        beats = self._peers()
        if idle < self.owner.timeout_s:
            return None
        interval = self.owner.heartbeat_s
        if any(2 * interval < beat["silent_s"] <= _SILENT * interval for beat in beats.values()):
            return None  # a slow write or a silent process: clear within two heartbeats
        verdict = self._decide(beats)
        try:
            with open(self._path(_CLAIM_FILE), "x") as claim:  # the first to decide reports
                claim.write(self.token)
        except FileExistsError:
            deadline = time.monotonic() + 3 * self.owner.heartbeat_s + 1
            while time.monotonic() < deadline:  # another process is writing its verdict
                time.sleep(0.05)
                if (written := self._read_verdict()) is not None:
                    return written
            return verdict
        except OSError:  # no file to claim with: report on standard error, and end
            return verdict
        with contextlib.suppress(OSError):  # a full disk: the report still goes to stderr
            atomic_write(self._path(REPORT_FILE), _report(verdict, {}))
            atomic_write(self._path(_VERDICT_FILE), json.dumps(verdict, indent=2))  # the others'
        return verdict

    def _read_verdict(self) -> dict[str, Any] | None:
        path = self._path(_VERDICT_FILE)
        try:
            if path.is_symlink():
                return None
            verdict = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return verdict if isinstance(verdict, dict) and verdict.get("token") == self.token else None

    def _decide(self, beats: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Name the processes behind: silent ones, and those through fewer events."""
        stale_after = _SILENT * self.owner.heartbeat_s
        silent = {rank for rank, beat in beats.items() if beat["silent_s"] > stale_after}
        unseen = sorted(set(range(self.size)) - set(beats))
        ahead = max(int(beat["ticks"]) for beat in beats.values())
        behind = sorted(
            {rank for rank, beat in beats.items() if int(beat["ticks"]) < ahead} | silent
        )
        same_point = not behind
        if same_point:  # all stopped at one point (one process alone, or all at once)
            behind = sorted(beats)
        for rank, beat in beats.items():
            beat["behind"] = rank in behind
            beat["responding"] = rank not in silent
        return {
            "token": self.token,
            "decided_by": self.rank,
            "timeout_s": self.owner.timeout_s,
            "exit_code": self.owner.exit_code,
            "time": time.time(),
            "behind": behind,
            "same_point": same_point,
            "unseen": unseen,
            "processes": {str(rank): beat for rank, beat in sorted(beats.items())},
        }

    def _end(self, verdict: dict[str, Any]) -> None:
        """Write this process's stacks and the report, wait for the others, exit."""
        stacks = _stacks(self.ident)
        position = self.owner.position()
        header = (
            f"process {self.rank} (pid {os.getpid()}, {self._host}): {position['phase']}, "
            f"epoch {position['epoch']}, {position['batches_done']} batches done: "
            f"{position['doing']}; no progress for {position['idle_s']:.1f} s"
        )
        with contextlib.suppress(OSError):
            atomic_write(self._path(_STACKS.format(self.rank)), f"{header}\n\n{stacks}")
        summary = _summary(verdict)
        text = f"{summary}\n[process {self.rank}] {header}\n{stacks}\n"
        with contextlib.suppress(Exception):
            get_logger().error("%s (report: %s)", summary, self._path(REPORT_FILE))
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)
            sys.stderr.flush()
        self.state = "reported"
        self.beat()
        self._wait_for_others(verdict)
        if verdict.get("decided_by") == self.rank:
            collected = {}
            for rank in range(self.size):
                with contextlib.suppress(OSError):
                    collected[rank] = self._path(_STACKS.format(rank)).read_text()
            with contextlib.suppress(OSError):
                atomic_write(self._path(REPORT_FILE), _report(verdict, collected))
        for child in multiprocessing.active_children():  # data-loader workers, stuck or not
            with contextlib.suppress(Exception):
                child.kill()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(self.owner.exit_code)

    def _wait_for_others(self, verdict: dict[str, Any]) -> None:
        """Wait until every process that responds has reported (a few heartbeats at most)."""
        silent = {
            int(rank)
            for rank, beat in verdict["processes"].items()
            if not beat.get("responding", True)
        }
        waiting = set(range(self.size)) - silent - {self.rank} - set(verdict["unseen"])
        deadline = time.monotonic() + 4 * self.owner.heartbeat_s + 2
        while waiting and time.monotonic() < deadline:
            for rank in list(waiting):
                beat = self._read(rank)
                if beat is None or beat.get("state") == "reported":
                    waiting.discard(rank)
            time.sleep(0.05)


def _clear(directory: Path) -> None:
    """Remove an earlier run's heartbeats and reports (the main process, at a run's start)."""
    names = (_HEARTBEAT.format("*"), _STACKS.format("*"), _VERDICT_FILE, _CLAIM_FILE, REPORT_FILE)
    for name in names:
        for path in directory.glob(name):
            with contextlib.suppress(OSError):
                path.unlink()


def _stacks(monitor: int | None) -> str:
    """This process's Python stacks, every thread but the monitor's, the main thread first."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main, names.get(ident, "")))
    parts = []
    for ident in order:
        if ident == monitor:
            continue
        name = names.get(ident, f"thread {ident}")
        parts.append(f'Thread "{name}":\n' + "".join(traceback.format_stack(frames[ident])))
    return "\n".join(parts) + "\n"


def _where(rank: str, beat: dict[str, Any]) -> str:
    """One process's line of the report."""
    silent = ""
    if not beat.get("responding", True):
        silent = (
            f"NOT RESPONDING, heartbeat unchanged for {beat['silent_s']:.1f} s (stopped, "
            "frozen, or holding the GIL); last heard: "
        )
    return (
        f"process {rank} (pid {beat.get('pid')}, {beat.get('host')}): {silent}"
        f"{beat.get('phase')}, epoch {beat.get('epoch')}, {beat.get('batches_done')} batches "
        f"done: {beat.get('doing')}; no progress for {float(beat.get('idle_s', 0)):.1f} s"
    )


def _summary(verdict: dict[str, Any]) -> str:
    """The report's first line: which processes are behind."""
    behind = verdict["behind"]
    named = ", ".join(str(rank) for rank in behind)
    timeout = verdict["timeout_s"]
    if verdict["same_point"] and len(verdict["processes"]) == 1:
        lead = f"process {named} made no progress for {timeout:g} s"
    elif verdict["same_point"]:
        lead = f"no progress for {timeout:g} s on processes {named}, all at the same point"
    else:
        plural = "es" if len(behind) > 1 else ""
        lead = f"process{plural} {named} behind, no progress for {timeout:g} s"
    code = verdict["exit_code"]
    lines = [f"WatchdogCallback: {lead}; ending the job (every process exits with code {code})."]
    for rank, beat in verdict["processes"].items():
        mark = "BEHIND " if beat.get("behind") else "waiting"
        lines.append(f"  {mark} {_where(rank, beat)}")
    for rank in verdict["unseen"]:
        lines.append(
            f"  unseen  process {rank}: no heartbeat of this run (the directory is not shared "
            "with it, or it never started the run)"
        )
    return "\n".join(lines)


def _report(verdict: dict[str, Any], stacks: dict[int, str]) -> str:
    """The report file: the summary, then each process's stacks (or why there are none)."""
    parts = [_summary(verdict), ""]
    for rank_text, beat in verdict["processes"].items():
        rank = int(rank_text)
        if rank in stacks:
            parts.append(f"=== process {rank} ===\n{stacks[rank]}")
        elif not beat.get("responding", True):
            parts.append(
                f"=== process {rank} ===\nno stacks: the process did not respond (it cannot "
                "write them); its last heartbeat is above.\n"
            )
    if not stacks:
        parts.append("(each process's stacks follow in stacks-rank<N>.txt as it reports)\n")
    return "\n".join(parts)

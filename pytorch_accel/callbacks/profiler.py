"""Profile a window of training steps with ``torch.profiler``: one trace per process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import ProfileKwargs

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_count, check_path, check_positive_int, fail
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["ProfilerCallback"]

_ACTIVITIES = ("cpu", "cuda")


class ProfilerCallback(TrainerCallback):
    """Profile a scheduled window of training steps; write one trace per process.

    A ``torch.profiler.profile`` starts with each training run and stops at its end (also
    after a ``StopTrainingError``, an exception or Ctrl-C: the steps recorded so far are
    written). It steps at each ``on_train_step_end``, following ``torch.profiler.schedule``:
    after ``skip_first`` steps, ``wait`` steps unrecorded, ``warmup`` recorded and thrown
    away, ``active`` recorded; that cycle ``repeat`` times (``0``: until the run ends). Every
    process writes each recorded cycle as a Chrome trace,
    ``<directory>/rank<N>.<cycle>.pt.trace.json`` (``tensorboard_trace_handler``'s layout):
    open it in https://ui.perfetto.dev or point TensorBoard's profiler plugin at
    ``directory``. The steps appear as ``ProfilerStep#<i>`` (0-based steps of the run); a
    step's span runs from the end of the one before, so it holds the wait for its batch.

    With ``summary_rows=N``, the main process logs the ``N`` most expensive operators of the
    last recorded cycle when the run ends. The last run's profiler stays in ``profiler``, the
    files this process wrote in ``trace_files``. It is built with accelerate's
    ``ProfileKwargs``: ``Accelerator.profile`` wraps a block of code and ends with a barrier,
    where a callback needs start and stop. Outside the window a step costs the profiler's
    ``step()`` (a few microseconds).

    Args:
        directory: Where the traces are written (created when the first is); left at its
            default, under the trainer's run directory when it has one
            (``Trainer(output_dir=...)``).
        wait: Steps not recorded at the start of each cycle.
        warmup: Steps recorded then thrown away (the profiler's own start-up) before ``active``.
        active: Steps recorded in each cycle.
        repeat: How many cycles; ``0`` repeats until the run ends.
        skip_first: Steps skipped once, before the first cycle.
        activities: What to record, among ``"cpu"`` and ``"cuda"``; by default the CPU and,
            when CUDA is available, CUDA.
        record_shapes: Record the shapes of the operators' inputs.
        profile_memory: Record the memory the operators allocate and free.
        with_stack: Record the Python source lines of the operators.
        summary_rows: Log this many rows of the operator summary at the end of the run, on the
            main process; ``None`` logs none.

    Raises:
        TypeError, ValueError: For an argument of the wrong type or out of range.

    Example:
        ```python
        profiler = ProfilerCallback("profiles", wait=5, warmup=2, active=5, summary_rows=15)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, profiler))
        trainer.train(train_dataset, num_epochs=1, per_device_batch_size=32)
        # tensorboard --logdir profiles   (or open profiles/rank0.*.pt.trace.json in Perfetto)
        ```
    """

    order = 2000  # steps last: a step's span holds every callback's work at the step's end
    may_stop_training = False

    def __init__(
        self,
        directory: str | os.PathLike[str] = DefaultPath("profiles"),
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        activities: Sequence[str] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        summary_rows: int | None = None,
    ) -> None:
        where = "ProfilerCallback"
        check_path(where, "directory", directory, directory=True)
        self.schedule = {
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": repeat,
            "skip_first": skip_first,
        }
        for name, value in self.schedule.items():
            check_count(where, name, value, minimum=int(name == "active"), resolved=True)
        check_bool(where, "record_shapes", record_shapes)
        check_bool(where, "profile_memory", profile_memory)
        check_bool(where, "with_stack", with_stack)
        check_positive_int(where, "summary_rows", summary_rows, allow_none=True)
        self.directory = Path(directory)
        self._run_paths = RunPaths(directory=directory)
        self.activities = None if activities is None else _checked_activities(activities)
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.with_stack, self.summary_rows = with_stack, summary_rows
        self.profiler: torch.profiler.profile | None = None
        self.trace_files: list[Path] = []
        self._running = False
        self._steps = 0
        self._recorded: list[str] = []

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write the traces under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "directory")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the traces under ``run_dir`` if ``directory`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start a new profiler for this run."""
        self.stop_profiler()
        available = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        self._recorded = list(self.activities or available)
        settings = ProfileKwargs(
            activities=list(self._recorded),
            schedule_option=dict(self.schedule),
            on_trace_ready=self._trace_handler(trainer.accelerator.process_index),
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self.trace_files, self._steps = [], 0
        self.profiler = settings.build()
        self.profiler.start()
        self._running = True

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Advance the profiler's schedule by one step."""
        if self._running and self.profiler is not None:
            self.profiler.step()
            self._steps += 1

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Stop the profiler (a cycle still recording is written), then log the summary."""
        was_running = self._running
        self.stop_profiler()
        if not was_running:
            return
        first = self.schedule["skip_first"] + self.schedule["wait"] + self.schedule["warmup"]
        if not self.trace_files and self._steps <= first:
            get_logger().info(
                "ProfilerCallback: the run ended after %d steps, before the first recorded "
                "step (%d): no trace was written. Lower skip_first, wait or warmup.",
                self._steps,
                first,
            )
            return
        if self.summary_rows is not None and trainer.accelerator.is_main_process:
            get_logger().info(
                "ProfilerCallback: operators of the last recorded steps\n%s", self.summary()
            )

    def on_exception(self, trainer: TrainerLike, exception: BaseException, **kwargs: Any) -> None:
        """Stop the profiler of a run that failed (or was interrupted); the trace is written."""
        self.stop_profiler()

    def stop_profiler(self) -> None:
        """Stop the profiler if it runs; a cycle still recording is written."""
        if self._running and self.profiler is not None:
            self._running = False
            self.profiler.stop()

    def summary(self, rows: int | None = None) -> str:
        """The operators of the last recorded cycle, most expensive first, as a table.

        Args:
            rows: How many operators; ``summary_rows`` (or 20) by default.

        Returns:
            ``key_averages().table(...)``, by self device time when CUDA was recorded, else by
            self CPU time.
        """
        if self.profiler is None:
            return ""
        sort_by = "self_device_time_total" if "cuda" in self._recorded else "self_cpu_time_total"
        limit = rows or self.summary_rows or 20
        return str(self.profiler.key_averages().table(sort_by=sort_by, row_limit=limit))

    def _trace_handler(self, rank: int) -> Callable[[torch.profiler.profile], None]:
        def write(profiler: torch.profiler.profile) -> None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"rank{rank}.{len(self.trace_files) + 1}.pt.trace.json"
            profiler.export_chrome_trace(str(path))
            self.trace_files.append(path)

        return write


def _checked_activities(activities: Sequence[str]) -> list[str]:
    names = [activities] if isinstance(activities, str) else list(activities)
    if not names or any(name not in _ACTIVITIES for name in names):
        fail(
            ValueError,
            "ProfilerCallback",
            "activities",
            activities,
            'a non-empty list of "cpu" and "cuda"',
            'Pass e.g. activities=["cpu", "cuda"], or leave it out to record the CPU and, '
            "when available, CUDA.",
        )
    if "cuda" in names and not torch.cuda.is_available():
        fail(
            ValueError,
            "ProfilerCallback",
            "activities",
            activities,
            '"cpu" only on a machine without CUDA',
            'Pass activities=["cpu"], or leave it out to choose by what is available.',
        )
    return names

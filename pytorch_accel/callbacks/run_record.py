"""A record of every run: one directory with its config, environment, model, log and metrics."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callbacks._run_info import (
    environment,
    jsonable,
    model_summary,
    model_summary_text,
    run_configuration,
)
from pytorch_accel.callbacks.step_logging import DEFAULT_LOG_EVERY_N_UPDATES
from pytorch_accel.callbacks.trackers import TrackingCallback, available_trackers
from pytorch_accel.checks import check_bool, check_mapping, fail
from pytorch_accel.files import atomic_write
from pytorch_accel.outputs import DefaultPath, RunPaths
from pytorch_accel.tracking import get_logger, setup_logging

if TYPE_CHECKING:
    from accelerate.tracking import GeneralTracker

    from pytorch_accel.protocols import TrainerLike

__all__ = ["RUN_RECORD_FILES", "RunRecordCallback"]

RUN_RECORD_FILES = {
    "config": "config.json",
    "hyperparameters": "hyperparameters.json",
    "environment": "environment.json",
    "model_summary": "model_summary.json",
    "model_summary_text": "model_summary.txt",
    "log": "train.log",
    "metrics": "metrics.csv",
    "step_metrics": "metrics_steps.csv",
    "plot": "metrics.png",
    "step_plot": "metrics_steps.png",
    "outcome": "outcome.json",
}
"""The files of a run record, by role (``tensorboard/`` holds the TensorBoard run)."""

_LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


class RunRecordCallback(TrackingCallback):
    """Keep a record of each training run in ``directory``: what ran, where, and how it went.

    When ``train()`` starts, the main process writes (each file replaced atomically):

    - ``config.json``: the run config (``train()``'s arguments as the trainer holds them),
      what else the trainer exposes (scheduler factory, collate function, resume point, data
      set sizes) and its parts (model, loss, optimizer and its parameter groups' settings,
      scheduler, callbacks);
    - ``hyperparameters.json``: ``hyperparameters``, as given;
    - ``environment.json``: Python, platform, torch / accelerate / pytorch_accel versions,
      devices and processes, the ``accelerate config`` file and ``ACCELERATE_*`` variables,
      the script's git commit (and whether it was modified), the command line;
    - ``model_summary.json`` and ``model_summary.txt``: parameters per top-level module,
      trainable and frozen, and the model's ``repr``.

    During the run: ``train.log`` receives the ``pytorch_accel`` logger's lines, time-stamped
    (appended to by later runs); ``metrics.csv`` and ``metrics_steps.csv`` grow as in
    ``TrackingCallback``, which this callback is; ``metrics.png`` and ``metrics_steps.png``
    are redrawn at each epoch end when matplotlib is installed; the trackers
    (``tensorboard/`` by default, when installed) receive the run config and the
    hyper-parameters, as hyper-parameters, and the metrics.

    When the run ends, ``outcome.json`` says how: ``{"status": ..., "epochs": ...,
    "updates": ..., "error": ...}`` (the epochs completed and the run's updates), with
    ``status`` ``"completed"``, ``"stopped"`` (a ``StopTrainingError``; ``error`` is its
    message), ``"interrupted"`` (a ``KeyboardInterrupt``, or the stop after the save of
    ``SaveTrainingStateCallback(save_on_interrupt=True)``) or ``"failed"`` (any other
    exception; ``error`` is ``"<type>: <message>"``); ``train.log`` gets a last line saying the
    same, and the trackers and the log file are closed also after an exception.

    Nothing is written by the other processes. Continuing and resumed runs continue the
    metric files and the tracker run as in ``TrackingCallback``; a new run rewrites the
    record's files (the log is appended to): give each run its own directory to keep
    several. A file that cannot be written (a full disk) raises an ``OSError`` naming it,
    once the trackers are finished and the log file closed. Order ``110``: after the
    console's epoch line, which the log file then holds.

    Args:
        directory: The record's directory (created if needed); ``None`` (the default): the
            run directory itself, ``trainer.run_dir``, which needs ``Trainer(output_dir=...)``.
        hyperparameters: The user's hyper-parameters (any JSON-like mapping).
        log_with: Trackers as in ``TrackingCallback``; ``None`` (the default): TensorBoard if
            it is installed, else none.
        log_every_n_updates: The step-level logging interval (default 50); ``None``: none.
        log_grad_norm: Also log the gradient norm at each step-level logging point.
        plot: Draw the metric curves at each epoch end; ``None`` (the default): if matplotlib
            is installed.

    Raises:
        TypeError: If ``directory`` is not a path or ``hyperparameters`` not a mapping.
        ImportError: If ``plot=True`` and matplotlib is not installed.

    Example:
        ```python
        record = RunRecordCallback(f"runs/{time.strftime('%Y%m%d-%H%M%S')}",
                                   hyperparameters={"lr": lr, "batch_size": 32})
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, record))
        ```
    """

    order = 110

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        hyperparameters: Mapping[str, Any] | None = None,
        *,
        log_with: str | GeneralTracker | Iterable[str | GeneralTracker] | None = None,
        log_every_n_updates: int | None = DEFAULT_LOG_EVERY_N_UPDATES,
        log_grad_norm: bool = False,
        plot: bool | None = None,
    ) -> None:
        if directory is None:
            directory = DefaultPath(".")  # the run directory itself
        elif not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            expected = "a path or None"
            fail(TypeError, "RunRecordCallback", "directory", directory, expected, "Pass 'runs/1'.")
        check_mapping("RunRecordCallback", "hyperparameters", hyperparameters)
        self.directory = Path(directory)
        self._record_paths = RunPaths(directory=directory)
        self.hyperparameters = dict(hyperparameters or {})
        if log_with is None:  # TensorBoard where it is installed
            log_with = ("tensorboard",) if "tensorboard" in available_trackers() else ()
        super().__init__(
            log_with,
            project_name="tensorboard",
            logging_dir=self.directory,
            csv_path=self.directory / RUN_RECORD_FILES["metrics"],
            config=self.hyperparameters,
            log_every_n_updates=log_every_n_updates,
            log_grad_norm=log_grad_norm,
        )
        self.plot = _check_plot(plot)
        self._log_handler: _RunLogHandler | None = None
        self._in_run = False

    @contextlib.contextmanager
    def redirect_outputs(self, directory: Path) -> Iterator[None]:
        """Keep the whole record under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        saved = self.directory, self.logging_dir, self.csv_path
        self.directory = directory / self.directory.name
        self.logging_dir, self.csv_path = os.fspath(self.directory), self.path("metrics")
        try:
            with self._set_aside():
                yield
        finally:
            self.directory, self.logging_dir, self.csv_path = saved

    def place_outputs(self, run_dir: Path) -> None:
        """Keep the record in ``run_dir`` itself if ``directory`` was left out."""
        before = self.directory
        self._record_paths.place(self, run_dir)
        if self.directory != before:
            self.logging_dir, self.csv_path = os.fspath(self.directory), self.path("metrics")

    def path(self, role: str) -> Path:
        """The path of one of the record's files (a key of ``RUN_RECORD_FILES``)."""
        return self.directory / RUN_RECORD_FILES[role]

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Write the record's description of the run; open the log file."""
        self._check_directory(trainer)
        if trainer.accelerator.is_main_process:
            with self._writing(self.directory, "directory"):
                self.directory.mkdir(parents=True, exist_ok=True)
            self._open_log(trainer)
            self._write_description(trainer)
        self._in_run = True
        super().on_training_run_start(trainer)

    def on_evaluation_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Continue the run's trackers, or start them and store the run config."""
        self._check_directory(trainer)
        super().on_evaluation_run_start(trainer)

    def _check_directory(self, trainer: TrainerLike) -> None:
        """Raise if ``directory`` was left out and the trainer has no run directory."""
        if self._record_paths.follows_run_dir("directory") and trainer.run_dir is None:
            fail(
                ValueError,
                "RunRecordCallback",
                "directory",
                None,
                "a path, or None with Trainer(output_dir=...)",
                "Pass RunRecordCallback('runs/1'), or create the trainer with "
                "Trainer(..., output_dir='runs') to keep the record in the run's directory.",
            )

    def on_training_run_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Send the epoch's metrics; redraw the curves."""
        self._check_log()
        super().on_training_run_epoch_end(trainer)
        self._draw(trainer)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Send the last metrics, redraw the curves and close the log file."""
        self._check_log()
        super().on_training_run_end(trainer)
        self._draw(trainer)
        self._in_run = False
        stop = trainer.stopped_by
        if stop is None:
            self._write_outcome(trainer, "completed", None)
        else:  # a stop caused by Ctrl-C (SaveTrainingStateCallback(save_on_interrupt=True))
            status = "interrupted" if isinstance(stop.__cause__, KeyboardInterrupt) else "stopped"
            self._write_outcome(trainer, status, str(stop) or type(stop).__name__)
        with self._writing(self.path("log"), "directory"):
            self._close_log()

    def on_exception(self, trainer: TrainerLike, exception: BaseException, **kwargs: Any) -> None:
        """Record the run as interrupted (Ctrl-C) or failed; close the trackers and the log."""
        try:
            if self._in_run and trainer.accelerator.is_main_process:
                interrupted = isinstance(exception, KeyboardInterrupt)
                error = type(exception).__name__
                error += f": {exception}" if str(exception) else ""
                status = "interrupted" if interrupted else "failed"
                self._write_outcome(trainer, status, error)
        finally:
            self._in_run = False
            with contextlib.suppress(OSError):  # its last lines may not reach a full disk
                self._close_log()
            super().on_exception(trainer, exception, **kwargs)

    def log_steps(self, trainer: TrainerLike, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        """Send step-level logging points (see ``TrackingCallback.log_steps``)."""
        self._check_log()
        super().log_steps(trainer, rows)

    def _write_description(self, trainer: TrainerLike) -> None:
        model = trainer.get_model()
        summary = model_summary(model)
        self._write_json("config", run_configuration(trainer))
        self._write_json("hyperparameters", jsonable(self.hyperparameters))
        self._write_json("environment", environment(trainer))
        self._write_json("model_summary", summary)
        with self._writing(self.path("model_summary_text"), "directory"):
            atomic_write(self.path("model_summary_text"), model_summary_text(summary, model))
        get_logger().info("run record: %s", self.directory)

    def _write_json(self, role: str, value: Any) -> None:
        with self._writing(self.path(role), "directory"):
            atomic_write(self.path(role), json.dumps(value, indent=2, sort_keys=False) + "\n")

    def _write_outcome(self, trainer: TrainerLike, status: str, error: str | None) -> None:
        """Write ``outcome.json`` and the log's last line: how the run ended (main process)."""
        if not trainer.accelerator.is_main_process:
            return
        epochs, updates = trainer.run_history.current_epoch - 1, trainer.global_num_updates
        outcome = {"status": status, "epochs": epochs, "updates": updates, "error": error}
        self._write_json("outcome", outcome)
        if self._log_handler is not None:
            because = "" if error is None else f": {error}"
            self._log_handler.write_last(f"run {status} at update {updates}{because}")

    def _open_log(self, trainer: TrainerLike) -> None:
        self._close_log()
        logger = setup_logging()
        with self._writing(self.path("log"), "directory"):
            handler = _RunLogHandler(self.path("log"), weakref.ref(trainer))
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        logger.addHandler(handler)
        self._log_handler = handler

    def _check_log(self) -> None:
        """Raise the error that writing the log file met, if it met one (the handler cannot)."""
        handler = self._log_handler
        if handler is not None and handler.failure is not None:
            with self._writing(self.path("log"), "directory"):
                raise handler.failure

    def _close_log(self) -> None:
        handler, self._log_handler = self._log_handler, None
        if handler is not None:
            get_logger().removeHandler(handler)
            handler.close()

    def _close_outputs(self) -> None:
        """Close the trackers and the log file (quietly: after a failed write)."""
        super()._close_outputs()
        with contextlib.suppress(OSError):  # its last lines may not reach a full disk
            self._close_log()

    def _elsewhere(self, setting: str) -> str:
        return "give RunRecordCallback a directory elsewhere"

    def _draw(self, trainer: TrainerLike) -> None:
        from pytorch_accel.callbacks.plotting import plot_metrics

        if not self.plot or not trainer.accelerator.is_main_process:
            return
        for source, image in (("metrics", "plot"), ("step_metrics", "step_plot")):
            if self.path(source).exists():
                with contextlib.suppress(ValueError), self._writing(self.path(image), "directory"):
                    plot_metrics(self.path(source), self.path(image))


def _check_plot(plot: object) -> bool:
    expected, fix = "None or a bool", "Pass plot=None."
    check_bool("RunRecordCallback", "plot", plot, allow_none=True, expected=expected, fix=fix)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if plot:
            raise ImportError(
                'RunRecordCallback: plot=True needs matplotlib: pip install "pytorch-accel[plot]",'
                " or pass plot=None to draw only where it is installed."
            ) from None
        return False
    return plot is not False


class _RunLogHandler(logging.FileHandler):
    """The run's ``train.log``: it takes the run's lines only, and closes once the run is over.

    A ``train()`` that raised never reaches ``on_training_run_end``: the first line logged
    after the run closes it instead. A line it cannot write (a full disk) closes it too, and
    the error is kept in ``failure`` for the callback to raise (the code that logged never
    sees a handler's errors).
    """

    def __init__(self, path: Path, trainer: weakref.ReferenceType[TrainerLike]) -> None:
        super().__init__(path, encoding="utf-8")
        self._trainer = trainer
        self.failure: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        """Keep an ``OSError`` (a full disk) in ``failure`` and close; print anything else."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failure = error
        get_logger().removeHandler(self)
        with contextlib.suppress(OSError):  # closing flushes what could not be written
            self.close()

    def write_last(self, message: str) -> None:
        """Write the run's last line (how it ended), also once ``train()`` is leaving."""
        record = logging.LogRecord("pytorch_accel", logging.INFO, "", 0, message, None, None)
        super().emit(record)

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` while the run is going on; else detach and close."""
        trainer = self._trainer()
        if trainer is not None and trainer.is_training:
            super().emit(record)
            return
        get_logger().removeHandler(self)
        with contextlib.suppress(OSError):  # what a full disk left unwritten
            self.close()

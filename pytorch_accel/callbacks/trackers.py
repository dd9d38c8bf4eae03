"""Send the run history's metrics and the run config to experiment trackers and a CSV file."""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callbacks._metrics_csv import (
    STEP_COLUMN,
    UPDATE_COLUMN,
    append_metrics_rows,
    read_metrics_rows,
    write_metrics_csv,
)
from pytorch_accel.callbacks._run_info import described
from pytorch_accel.callbacks.defaults import format_metrics
from pytorch_accel.callbacks.step_logging import DEFAULT_LOG_EVERY_N_UPDATES, StepLoggingCallback
from pytorch_accel.checks import check_choice, check_mapping, fail
from pytorch_accel.files import write_error
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import MetricCursor, get_logger, reported_float

if TYPE_CHECKING:
    from accelerate.tracking import GeneralTracker

    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = ["TrackingCallback", "hparams_of"]

_INSTALL_HINTS = {"tensorboard": 'pip install "pytorch-accel[tracking]"'}


class TrackingCallback(StepLoggingCallback):
    """Log metrics to accelerate's experiment trackers (TensorBoard, W&B, ...) and CSV files.

    The trainer's ``Accelerator`` is created without ``log_with``, so this callback creates
    the trackers itself, on the main process only, from the names accelerate knows
    (``"tensorboard"``, ``"wandb"``, ``"mlflow"``, ``"comet_ml"``, ``"aim"``, ``"clearml"``,
    ``"dvclive"``, ``"swanlab"``, ``"trackio"``) or as ``accelerate.tracking.GeneralTracker``
    instances you built. One run of the trainer is one tracker run: the trackers are started
    by the run's first ``train()`` or ``evaluate()``, receive the run config then
    (``trainer.run_config.to_dict()`` and ``config``, flattened by ``hparams_of``), and stay
    open across the calls that continue the run (``train(reset_run_history=False)``,
    ``evaluate()``), flushed at the end of each. They are finished when a new run starts (a
    ``train()`` that resets the run history, or a resumed one), when another trainer's
    ``TrackingCallback`` starts its run (W&B and MLflow have one run at a time), by
    ``finish()``, or at exit.

    Every tracker gets one increasing step axis, the run's update count
    (``trainer.global_num_updates``), across the stages of a run and ``evaluate()``: W&B drops
    the values of a step lower than one it has seen. Epoch-level metrics are sent as in
    ``LogMetricsCallback``, each newly recorded one with its latest value, at the end of each
    training-run epoch and of each evaluation run, at step = the update count then, with the
    epoch number as the value ``epoch`` at the training epochs' ends; the CSV file has an
    ``update`` column beside its ``epoch`` one. With ``epoch_x_axis="epoch"`` they go at
    step = the epoch number instead (pytorch-accelerated's axis; not for W&B, nor with
    step-level metrics in one tracker). Trackers get the numeric values; the CSV file gets
    every value.

    Step-level metrics (a ``StepLoggingCallback``, see ``StepMetrics``) go every
    ``log_every_n_updates`` updates and at the run's end to every tracker, at step = the
    run's update count, and to ``<stem>_steps.csv`` beside ``csv_path`` (a ``step`` column,
    one row per logging point, appended to).

    The CSV file (``csv_path``, on the main process) has one row per epoch: an ``epoch``
    column, then one column per metric in alphabetical order, empty where a metric has no
    value that epoch; it is rewritten atomically after each logging point. A new run starts
    both files afresh: give each run its own ``csv_path`` and ``project_name`` to keep
    several. A resumed ``train(resume_from=...)`` keeps the rows up to the training state and
    writes the later ones again as the run redoes them, so each file stays one series; a
    ``"tensorboard"`` tracker is then created with ``purge_step`` the next update. Order
    ``100``: it sends what every other callback recorded at the same event.

    A file that cannot be written (a full disk, a read-only directory) raises an ``OSError``
    naming it, once the trackers are finished.

    Args:
        log_with: Tracker names or ``GeneralTracker`` instances; ``()`` for the CSV file only.
        project_name: The run name passed to each tracker (TensorBoard writes to
            ``<logging_dir>/<project_name>``).
        logging_dir: Where trackers that write local files put them.
        csv_path: The per-epoch CSV file, or ``None`` for none. Both are in
            ``trainer.run_dir`` when left out and the trainer has an ``output_dir``.
        init_kwargs: Keyword arguments per tracker name, e.g.
            ``{"tensorboard": {"flush_secs": 30}}``.
        config: Extra hyperparameters stored with the run config (flattened likewise).
        log_every_n_updates: The step-level logging interval, in optimizer updates; ``None``
            for epoch-level metrics only.
        log_grad_norm: Also log the gradient norm at each step-level logging point.
        epoch_x_axis: The trackers' x-axis of the epoch-level metrics: ``"update"`` (the
            run's update count at the epoch's end, the step-level metrics' axis, with the
            epoch as a value) or ``"epoch"`` (the epoch number, an axis of their own).

    Raises:
        ValueError: If a tracker name is unknown, ``log_every_n_updates`` is not a
            positive int, or ``epoch_x_axis`` is neither ``"epoch"`` nor ``"update"``
            (a ``TypeError`` if it is not a string).
        ImportError: If the package of a named tracker is not installed.

    Example:
        ```python
        tracking = TrackingCallback(log_with=("tensorboard",), logging_dir="runs",
                                    config={"lr": 1e-3})
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(*DEFAULT_CALLBACKS, tracking))
        trainer.train(train_dataset, num_epochs=3, eval_dataset=eval_dataset)
        # tensorboard --logdir runs; metrics.csv has one row per epoch
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(
        self,
        log_with: str | GeneralTracker | Iterable[str | GeneralTracker] = ("tensorboard",),
        *,
        project_name: str = "pytorch-accel",
        logging_dir: str | os.PathLike[str] = DefaultPath("runs"),
        csv_path: str | os.PathLike[str] | None = DefaultPath("metrics.csv"),
        init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        config: Mapping[str, Any] | None = None,
        log_every_n_updates: int | None = DEFAULT_LOG_EVERY_N_UPDATES,
        log_grad_norm: bool = False,
        epoch_x_axis: str = "update",
    ) -> None:
        super().__init__(log_every_n_updates, log_grad_norm)
        fix = "Leave it out to draw the epoch metrics on the step metrics' axis (the update count)."
        check_choice("TrackingCallback", "epoch_x_axis", epoch_x_axis, ("epoch", "update"), fix)
        self.epoch_x_axis = epoch_x_axis
        self.log_with = _check_trackers(log_with)
        _check_strings(project_name, logging_dir, csv_path)
        check_mapping("TrackingCallback", "init_kwargs", init_kwargs)
        check_mapping("TrackingCallback", "config", config)
        self.project_name = project_name
        self.logging_dir = os.fspath(logging_dir)
        self.csv_path = None if csv_path is None else Path(csv_path)
        self._run_paths = RunPaths(logging_dir=logging_dir, csv_path=csv_path)
        self.init_kwargs = {name: dict(kwargs) for name, kwargs in (init_kwargs or {}).items()}
        self.config = dict(config or {})
        self.trackers: list[GeneralTracker] = []
        self._rows: dict[int, dict[str, Any]] = {}
        self._step_columns: list[str] = []
        self._step_rows: dict[int, dict[str, Any]] = {}
        self._cursor = MetricCursor()
        self._purge_step: int | None = None
        self._trainer: weakref.ReferenceType[Trainer] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @contextlib.contextmanager
    def redirect_outputs(self, directory: Path) -> Iterator[None]:
        """Write the CSV files and local tracker runs under ``directory`` (for dry runs)."""
        with redirected_paths(self, directory, "logging_dir", "csv_path"), self._set_aside():
            yield

    def place_outputs(self, run_dir: Path) -> None:
        """Put the CSV files and local tracker runs left at their defaults under ``run_dir``."""
        self._run_paths.place(self, run_dir)

    @contextlib.contextmanager
    def _set_aside(self) -> Iterator[None]:
        """Keep the run's open trackers and tables out of a dry run; put them back after it."""
        kept = (self.trackers, self._finalizer, self._trainer)
        tables = (self._rows, self._step_rows, self._step_columns)
        self.trackers, self._finalizer = [], None
        try:
            yield
        finally:
            _finish_trackers(self.trackers, quietly=True)  # the dry run's
            self._drop_finalizer()
            self.trackers, self._finalizer, self._trainer = kept
            self._rows, self._step_rows, self._step_columns = tables

    @property
    def step_csv_path(self) -> Path | None:
        """The step-level CSV file: ``<stem>_steps.csv`` beside ``csv_path`` (``None`` if none)."""
        if self.csv_path is None or self.step_metrics is None:
            return None
        path = self.csv_path
        return path.with_name(f"{path.stem}_steps{path.suffix or '.csv'}")

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the trackers and store the run config; start the first step interval."""
        resumed = trainer.resumed_from is not None
        new_run = resumed or not _continues(trainer)
        purge_step = trainer.global_num_updates + 1 if resumed else None
        self._start(trainer, purge_step=purge_step, new_run=new_run)
        if new_run:
            self._step_columns, self._step_rows = [], {}
        if resumed and trainer.accelerator.is_main_process:
            self._continue_files(trainer)
        super().on_training_run_start(trainer)

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Continue the run's trackers, or start them and store the run config."""
        self._start(trainer, new_run=False)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Send the epoch's new metrics, at step = the epoch number."""
        self._log_new(trainer, trainer.run_history.current_epoch)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Send what a stopped epoch recorded and the last step interval; flush the trackers."""
        self._log_new(trainer, trainer.run_history.current_epoch)
        super().on_training_run_end(trainer)
        self._flush()

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Send the evaluation's metrics, at step = the epochs trained so far; flush."""
        self._log_new(trainer, trainer.run_history.current_epoch - 1, training=False)
        self._flush()

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """Finish the trackers (flushed and closed): a failed or interrupted run is over.

        What was sent stays; no collective is called (other processes may not have failed).
        """
        super().on_exception(trainer, exception)  # the step logging points not yet logged
        _finish_trackers(self.trackers, quietly=True)  # it may fail on the same full disk
        self._drop_finalizer()

    def finish(self) -> None:
        """Finish the trackers of the run now (else at the next run's start, or at exit).

        Call it when the run is over, to close it before the program ends (a W&B or MLflow
        run, a TensorBoard file).
        """
        _finish_trackers(self.trackers)

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        """Send one step-level logging point to the trackers and the step CSV (main process).

        A one-row ``log_steps``.
        """
        self.log_steps(trainer, [(step, metrics)])

    def log_steps(self, trainer: Trainer, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        """Send several step-level logging points, in order, to the trackers and the step CSV.

        On the main process: each row goes to every tracker, then the step CSV is opened once
        for all of them (see ``log_step``; the same rows and values as one call per row).
        """
        if not rows or not trainer.accelerator.is_main_process:
            return
        for step, metrics in rows:
            for tracker in self.trackers:
                with self._writing_tracker(tracker):
                    tracker.log(metrics, step=step)
        path = self.step_csv_path
        if path is not None:
            with self._writing(path, "csv_path"):
                self._write_step_rows(path, rows)
        logger = get_logger()
        if logger.isEnabledFor(logging.DEBUG):
            for step, metrics in rows:
                logger.debug("update %d: %s", step, format_metrics(metrics))

    def log_images(self, images: Mapping[str, Any], step: int, **kwargs: Any) -> None:
        """Send images to the trackers that take them (TensorBoard, W&B, Aim, ...).

        Call it while the trackers are open, e.g. from a callback's ``on_eval_epoch_end``; on
        processes other than the main one there are no trackers, and it does nothing.

        Args:
            images: Tag -> images, in the form the trackers take: for TensorBoard a batch
                (``(N, C, H, W)`` tensor or array, values in ``[0, 1]``, or see
                ``SummaryWriter.add_images`` and its ``dataformats``).
            step: The x-axis value, e.g. ``trainer.run_history.current_epoch``.
            **kwargs: Passed to each tracker's ``log_images``.
        """
        for tracker in self.trackers:
            if callable(getattr(tracker, "log_images", None)):
                tracker.log_images(dict(images), step=step, **kwargs)

    def _continue_files(self, trainer: Trainer) -> None:
        """Keep the CSV files' rows up to the resumed state; drop those the run does again."""
        if self.csv_path is not None:
            epoch = trainer.run_history.current_epoch
            rows = read_metrics_rows(self.csv_path) if self.csv_path.exists() else self._rows
            self._rows = {index: row for index, row in rows.items() if index < epoch}
            with self._writing(self.csv_path, "csv_path"):
                write_metrics_csv(self._rows, self.csv_path)
        path = self.step_csv_path
        if path is not None and path.exists():
            saved = read_metrics_rows(path, STEP_COLUMN)
            updates = trainer.global_num_updates
            self._step_rows = {step: row for step, row in saved.items() if step <= updates}
            self._step_columns = sorted({name for row in self._step_rows.values() for name in row})
            with self._writing(path, "csv_path"):
                write_metrics_csv(self._step_rows, path, index_column=STEP_COLUMN)

    @contextlib.contextmanager
    def _writing(self, path: Path, setting: str) -> Iterator[None]:
        """Close this callback's files if writing ``path`` fails; raise an error naming it."""
        try:
            yield
        except OSError as error:
            self._close_outputs()
            where = type(self).__name__
            raise write_error(error, path, where, self._elsewhere(setting)) from error

    @contextlib.contextmanager
    def _writing_tracker(self, tracker: GeneralTracker) -> Iterator[None]:
        """``_writing`` for a tracker that writes local files; other trackers' errors as such."""
        if getattr(tracker, "requires_logging_directory", False):
            # where the tracker writes: accelerate's set it once started (a run name joined)
            default = os.path.join(self.logging_dir, self.project_name)
            where = getattr(tracker, "logging_dir", None) or default
            with self._writing(Path(where), "logging_dir"):
                yield
            return
        try:
            yield
        except OSError:
            self._close_outputs()
            raise

    def _elsewhere(self, setting: str) -> str:
        """How to have this callback write elsewhere (the end of a failed write's message)."""
        return f"pass another {setting} to {type(self).__name__}"

    def _close_outputs(self) -> None:
        """Close every file this callback holds open (after a failed write: quietly)."""
        _finish_trackers(self.trackers, quietly=True)

    def _write_step_rows(self, path: Path, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        """Append the rows, with one open; start the file afresh at need (atomically).

        The file is written whole (replaced atomically, with every row so far) when the run
        starts or a row has a column the file has not; else the rows are appended.
        """
        columns = set(self._step_columns)
        for step, metrics in rows:
            self._step_rows[step] = metrics
        if columns and all(set(metrics) <= columns for _, metrics in rows) and path.exists():
            append_metrics_rows(path, rows, self._step_columns)
            return
        self._step_columns = sorted({name for row in self._step_rows.values() for name in row})
        write_metrics_csv(self._step_rows, path, index_column=STEP_COLUMN)

    def create_trackers(self) -> list[GeneralTracker]:
        """Create the trackers of ``log_with`` (on the main process, at each run's start).

        Returns:
            The trackers, not yet started.
        """
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        trackers = []
        for entry in self.log_with:
            if not isinstance(entry, str):
                trackers.append(entry)
                continue
            tracker_class = LOGGER_TYPE_TO_CLASS[entry]
            kwargs = dict(self.init_kwargs.get(entry, {}))
            if entry == "tensorboard" and self._purge_step is not None:
                kwargs.setdefault("purge_step", self._purge_step)
            directory = (self.logging_dir,) if tracker_class.requires_logging_directory else ()
            trackers.append(tracker_class(self.project_name, *directory, **kwargs))
        return trackers

    def _start(self, trainer: Trainer, purge_step: int | None = None, new_run: bool = True) -> None:
        """Start the trackers, unless the run continues with them open.

        A new run finishes the trackers of the last one, and those another trainer's
        ``TrackingCallback`` holds open (W&B and MLflow have one run at a time).
        """
        if not trainer.accelerator.is_main_process:
            return
        history = trainer.run_history
        names = history.get_metric_names()
        if not names:  # a fresh run history: a fresh table
            self._rows = {}
        self._cursor.skip_to_end(history)
        if self.trackers and not new_run:
            return
        self.finish()
        for other in list(_OPEN):
            if other._trainer is None or other._trainer() is not trainer:
                other.finish()
        self._purge_step = purge_step
        self.trackers = self.create_trackers()
        self._trainer = weakref.ref(trainer)
        _OPEN.add(self)
        self._drop_finalizer()
        self._finalizer = weakref.finalize(self, _finish_trackers, self.trackers, True)
        run_config = {} if trainer.run_config is None else trainer.run_config.to_dict()
        hparams = hparams_of({**run_config, **self.config})
        for tracker in self.trackers:
            with self._writing_tracker(tracker):
                tracker.start()
                tracker.store_init_configuration(hparams)

    def _drop_finalizer(self) -> None:
        """Forget the finaliser of the trackers started last (their list is empty by now)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _log_new(self, trainer: Trainer, step: int, training: bool = True) -> None:
        if not trainer.accelerator.is_main_process:
            return
        new = self._cursor.read_new(trainer.run_history)
        if not new:
            return
        row = self._rows.setdefault(step, {})
        row.update(new)
        numbers_only = {name: reported_float(value) for name, value in new.items()}
        scalars = {name: value for name, value in numbers_only.items() if value is not None}
        if self.epoch_x_axis == "update":
            if scalars and training:  # the epoch, as a value on the update axis
                scalars.setdefault("epoch", step)
            step = row[UPDATE_COLUMN] = trainer.global_num_updates
        if scalars:
            for tracker in self.trackers:
                with self._writing_tracker(tracker):
                    tracker.log(scalars, step=step)
        if self.csv_path is not None:
            with self._writing(self.csv_path, "csv_path"):
                write_metrics_csv(self._rows, self.csv_path)

    def _flush(self) -> None:
        """Write what the trackers hold to their files (TensorBoard's writer buffers it)."""
        for tracker in self.trackers:
            flush = getattr(getattr(tracker, "tracker", None), "flush", None)
            if callable(flush):
                with self._writing_tracker(tracker):
                    flush()


_OPEN: weakref.WeakSet[TrackingCallback] = weakref.WeakSet()
"""The ``TrackingCallback``s with trackers open."""


def _finish_trackers(trackers: list[GeneralTracker], quietly: bool = False) -> None:
    """Finish ``trackers`` and empty the list (in place: a finaliser holds it too)."""
    finishing = list(trackers)
    trackers.clear()
    for tracker in finishing:
        if quietly:
            with contextlib.suppress(Exception):  # it may fail to flush to the same full disk
                tracker.finish()
        else:
            tracker.finish()


def _continues(trainer: Trainer) -> bool:
    """Whether a training run continues the last one (``reset_run_history=False``)."""
    history = trainer.run_history
    return history.current_epoch > 1 or bool(history.get_metric_names())


def hparams_of(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Flatten a config into a flat dict every tracker accepts as hyperparameters.

    Nested mappings become ``parent.child`` keys; ``bool``, ``int``, ``float`` and ``str``
    are kept; ``None`` becomes ``"None"``; callables become their qualified name, other
    objects their ``str`` (or type name, where ``str`` would show a memory address).

    Args:
        config: E.g. ``trainer.run_config.to_dict()``.
        prefix: Prepended to every key.
    """
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(hparams_of(value, prefix=f"{name}."))
        else:
            flat[name] = _hparam(value)
    return flat


def _hparam(value: Any) -> bool | int | float | str:
    if isinstance(value, (bool, int, float, str)):
        return value
    return "None" if value is None else described(value)


def _check_trackers(
    log_with: str | GeneralTracker | Iterable[str | GeneralTracker],
) -> tuple[str | GeneralTracker, ...]:
    """Normalise ``log_with`` to a tuple; check the names are known and installed."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

    entries = (log_with,) if isinstance(log_with, (str, GeneralTracker)) else tuple(log_with)
    available = available_trackers()
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            continue
        if not isinstance(entry, str) or entry not in LOGGER_TYPE_TO_CLASS:
            fail(
                ValueError if isinstance(entry, str) else TypeError,
                "TrackingCallback",
                "log_with",
                entry,
                f"one of {sorted(LOGGER_TYPE_TO_CLASS)} or a GeneralTracker",
                "Pass e.g. log_with=('tensorboard',), or () for the CSV file only.",
            )
        if entry not in available:
            hint = _INSTALL_HINTS.get(entry, f"pip install {entry}")
            raise ImportError(
                f"TrackingCallback: log_with names {entry!r}, whose package is not installed. "
                f"Install it ({hint}), or leave it out of log_with."
            )
    return entries


def available_trackers() -> set[str]:
    """The names of the trackers whose packages are installed."""
    from accelerate.tracking import get_available_trackers

    return {str(getattr(kind, "value", kind)) for kind in get_available_trackers()}


def _check_strings(project_name: object, logging_dir: object, csv_path: object) -> None:
    where = "TrackingCallback"
    if not isinstance(project_name, str) or not project_name:
        fail(TypeError, where, "project_name", project_name, "a non-empty str", "Pass e.g. 'demo'.")
    for name, value in (("logging_dir", logging_dir), ("csv_path", csv_path)):
        if name == "csv_path" and value is None:
            continue
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            fail(TypeError, where, name, value, "a path", f"Pass e.g. {name}='runs'.")

"""The callbacks every trainer has, and the one place the trainer wires callbacks in.

Beside the trainer, outside the ``callbacks`` package: a plain run imports this module and
none of the catalogue's (``pytorch_accel.callbacks`` serves these names too).

``DEFAULT_CALLBACKS`` (``get_default_callbacks``): device placement of auxiliary modules,
NaN termination, one progress line per epoch, progress bars and metric logging; plus the console
formatting of metrics they share (4 significant digits, short names, one line), which
``StepLoggingCallback`` and ``TrackingCallback`` use too.

``pytorch_accel.trainer`` imports this module and nothing of the catalogue (a layer rule,
checked by ``tests/test_architecture.py``).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from pytorch_accel._checks import check_bool, check_positive_int
from pytorch_accel.callback import CallbackLike, TrainerCallback
from pytorch_accel.compat import DefaultCallbacks
from pytorch_accel.dataloaders import LIMIT_BATCHES_ENV_VAR, OLD_LIMIT_BATCHES_ENV_VAR
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.tracking import MetricCursor, get_logger, setup_logging

if TYPE_CHECKING:
    from pytorch_accel.plugins.nan_origin import RandomState
    from pytorch_accel.protocols import TrainerLike

__all__ = [
    "DEFAULT_CALLBACKS",
    "LIMIT_BATCHES_ENV_VAR",
    "LogMetricsCallback",
    "MoveModulesToDeviceCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "TerminateOnNaNCallback",
    "get_default_callbacks",
    "with_environment_callbacks",
]

# How the console shows metrics: short names, 4 significant digits, one line.
SEPARATOR = "  "
"""Between the items of a console line."""


def display_name(name: str) -> str:
    """The metric's name without the ``_epoch`` suffix (``train_loss_epoch`` -> ``train_loss``)."""
    return name.removesuffix("_epoch") or name


def format_value(value: Any) -> str | None:
    """The value with 4 significant digits (integers whole), or ``None`` if not a real number.

    A one-element tensor is read with ``.item()``: once per epoch, never in a step.
    """
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 and not value.is_complex() else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return str(number)
    return f"{number:.4g}"


def loss_first(names: Iterable[str]) -> list[str]:
    """Sort metric names alphabetically, with those that name a loss first."""
    ordered = sorted(names)
    return [name for name in ordered if "loss" in name] + [
        name for name in ordered if "loss" not in name
    ]


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """The numeric values as ``name value`` pairs, e.g. ``train_loss 0.1234  accuracy 0.9833``."""
    items = []
    for name, value in metrics.items():
        text = format_value(value)
        if text is not None:
            items.append(f"{display_name(name)} {text}")
    return SEPARATOR.join(items)


class MoveModulesToDeviceCallback(TrainerCallback):
    """Move every public ``nn.Module`` attribute of the trainer, except the model, to its device.

    The model is placed by ``accelerator.prepare``; this covers the rest, such as a loss
    function with class weights (``trainer.loss_func``) or a teacher model set as an attribute
    of a trainer subclass. Runs first (``order = -100``) at the start of each run.

    Example:
        ```python
        trainer = Trainer(model, nn.CrossEntropyLoss(weight=class_weights), optimizer)
        ```
    """

    order = -100
    may_stop_training = False

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Move the modules before the run (training or evaluation) starts."""
        for name, value in vars(trainer).items():
            public = not name.startswith("_")
            if public and isinstance(value, nn.Module) and value is not trainer.model:
                value.to(trainer.device)

    on_evaluation_run_start = on_training_run_start


class TerminateOnNaNCallback(TrainerCallback):
    """Raise ``StopTrainingError`` once the loss is NaN or infinite.

    By default it reads no loss per step: a non-finite batch loss makes the epoch's sum
    non-finite, so it checks ``train_loss_epoch``, already on the host, and stops at the end
    of the epoch that went bad, before its evaluation. With ``check_every_n_steps=N`` it also
    reads the running sum every N training steps (one host sync each). It never calls
    ``sys.exit``.

    With ``report_origin=True`` it reads each batch's loss before its backward pass (one host
    sync per step; the update that follows would spread the NaN into every weight), and on
    the first non-finite one runs the batch through the model again under forward hooks,
    without gradients, with the step's random state, and warns (a ``RuntimeWarning``, on the
    process whose batch it was) with the first module whose output was not finite, e.g.
    ``first non-finite output: encoder.1 (Linear), 3 of 64 values NaN; the batch is finite``.
    The report is kept in ``origin`` and added to the stop's message; the stop itself comes
    at the usual check.

    Args:
        check_every_n_steps: Also check the running loss every this many training steps, or
            ``None`` to check only at epoch ends.
        report_origin: Report the first module whose output was not finite, at the cost of
            one host read of the loss per step.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(TerminateOnNaNCallback(check_every_n_steps=100),))
        ```
    """

    order = -50
    # it never stops in the first three (the report waits for the usual check), and the
    # epoch's check reads train_loss_epoch, already the same on every process: no exchange
    # of their own (the per-step check reads this process's loss, and is agreed)
    agreed_stop_events = frozenset(
        {"on_training_run_start", "on_train_step_start", "on_backward_start", "on_train_epoch_end"}
    )

    def __init__(
        self, check_every_n_steps: int | None = None, *, report_origin: bool = False
    ) -> None:
        check_positive_int(
            "TerminateOnNaNCallback", "check_every_n_steps", check_every_n_steps, allow_none=True
        )
        check_bool("TerminateOnNaNCallback", "report_origin", report_origin)
        self.check_every_n_steps = check_every_n_steps
        self.report_origin = report_origin
        self.origin: str | None = None
        self._random_state: RandomState | None = None
        if check_every_n_steps is None:
            # Not listening to steps at all keeps them free of any stop agreement between
            # processes (the handler skips events an instance sets to None).
            self.on_train_step_end = None  # type: ignore[assignment]
        if not report_origin:  # the steps stay free of host reads
            self.on_train_step_start = None  # type: ignore[assignment]
            self.on_backward_start = None  # type: ignore[assignment]

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Forget the origin reported in an earlier run."""
        self.origin = None

    def on_train_step_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Keep the step's random state, for a re-run that draws the same (``report_origin``)."""
        if self.origin is None:
            from pytorch_accel.plugins.nan_origin import RandomState

            self._random_state = RandomState.capture(trainer.device)

    def on_backward_start(
        self, trainer: TrainerLike, batch: Any = None, batch_output: Any = None, **kwargs: Any
    ) -> None:
        """Report where the first non-finite loss of the run started (``report_origin``)."""
        if self.origin is not None or batch_output is None:
            return
        from pytorch_accel.plugins.nan_origin import non_finite_loss_origin

        loss = batch_output["loss"]
        self.origin = non_finite_loss_origin(trainer, batch, loss, self._random_state)
        if self.origin is not None:
            warnings.warn(f"TerminateOnNaNCallback: {self.origin}", RuntimeWarning, stacklevel=2)

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Check the running loss sum every ``check_every_n_steps`` steps."""
        every = self.check_every_n_steps
        if every is None or (kwargs.get("step", 0) + 1) % every:
            return
        total = trainer.train_loss_tracker.total_loss
        if total is not None and not bool(torch.isfinite(total)):
            raise StopTrainingError(
                f"Stopping training: the loss became NaN or infinite within the last {every} "
                f"steps (epoch {trainer.run_history.current_epoch}).{self._origin_text()}"
            )

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Check the epoch's mean training loss."""
        value = trainer.run_history.get_latest_metric("train_loss_epoch")
        if not math.isfinite(value):
            raise StopTrainingError(
                f"Stopping training: train_loss_epoch is {value} in epoch "
                f"{trainer.run_history.current_epoch}.{self._origin_text()}"
            )

    def check_for_nan_after_batch(
        self, batch_output: dict[str, Any], step: str | None = None
    ) -> None:
        """Stop if a batch's loss is NaN or infinite (pytorch-accelerated's per-batch check).

        Never called by the callback itself; one host synchronisation per call.

        Args:
            batch_output: A step method's output, with ``loss``.
            step: ``"training"`` or ``"validation"``, for the message.

        Raises:
            StopTrainingError: If the loss is not finite.
        """
        loss = batch_output["loss"]
        if not bool(torch.isfinite(torch.as_tensor(loss)).all()):
            raise StopTrainingError(f"Stopping training due to NaN loss in {step} step")

    def _origin_text(self) -> str:
        return "" if self.origin is None else f" Where it started: {self.origin}."


class PrintProgressCallback(TrainerCallback):
    """Log one compact line per epoch, through the ``pytorch_accel`` logger, on the main process.

    For example::

        training: 8 epochs, 360 updates, 32 samples per update
        epoch 1/8  train_loss 1.046  eval_loss 0.3012  accuracy 0.9083  (1.2 s)

    Each epoch's line holds every metric recorded in the run history during that epoch, the
    losses first, with 4 significant digits, names without their ``_epoch`` suffix; then the
    epoch's wall-clock time (training and evaluation). An ``evaluate()`` run logs one
    ``evaluation ...`` line; a run stopped inside an epoch logs what that epoch recorded, with
    ``(stopped)``. The lines go through the ``pytorch_accel`` logger at ``INFO`` (see
    ``pytorch_accel.tracking``): silence them with
    ``logging.getLogger("pytorch_accel").setLevel(logging.WARNING)``. Order ``100``: it reads
    the metrics after the callbacks that record them. (The name is pytorch-accelerated's,
    whose callback printed "Starting epoch N"; ported code that lists it gets this output.)

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer, callbacks=(PrintProgressCallback,))
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(self) -> None:
        self._cursor = MetricCursor()
        self._pending: dict[str, Any] = {}
        self._started = time.perf_counter()
        self._epoch_offset = 0
        self._announced = True
        self._run_started = time.perf_counter()
        self._epochs_done = 0

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start collecting metrics."""
        self._start(trainer)
        resumed = trainer.resumed_from is not None
        self._epoch_offset = 0 if resumed else trainer.run_history.current_epoch - 1
        self._announced = False

    def on_train_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the epoch's clock; before the run's first epoch, log what the run will do.

        The announcement waits for the first epoch so that handlers added when the run
        starts (``RunRecordCallback``'s log file) receive it.
        """
        config = trainer.run_config
        if not self._announced and config is not None:
            self._announced = True
            epochs = "" if config.num_epochs is None else _plural(config.num_epochs, "epoch") + ", "
            get_logger().info(
                "training: %s%s, %d samples per update (%s, %s)",
                epochs,
                _plural(config.total_num_update_steps, "update"),
                config.train_total_batch_size,
                _plural(trainer.accelerator.num_processes, "process"),
                precision_text(trainer),
            )
            self._run_started = time.perf_counter()
            self._epochs_done = 0
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Collect the training epoch's metrics."""
        self._collect(trainer)

    def on_eval_epoch_end(
        self, trainer: TrainerLike, sanity_check: bool = False, **kwargs: Any
    ) -> None:
        """Collect the evaluation epoch's metrics (a sanity evaluation's are removed again)."""
        if not sanity_check:
            self._collect(trainer)

    def on_training_run_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Log the epoch's line."""
        self._collect(trainer)
        config = trainer.run_config
        epochs = None if config is None else config.num_epochs
        total = "" if epochs is None else f"/{self._epoch_offset + epochs}"  # None: a stream
        self._epochs_done += 1
        left = (
            None
            if epochs is None
            else epochs - (trainer.run_history.current_epoch - self._epoch_offset)
        )
        eta = None
        if left:  # the run's mean epoch time so far, times the epochs left
            eta = (time.perf_counter() - self._run_started) / self._epochs_done * left
        self._emit(trainer, f"epoch {trainer.run_history.current_epoch}{total}", eta)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Log what an epoch stopped early recorded."""
        self._collect(trainer)
        if self._pending:
            epoch = trainer.run_history.current_epoch
            self._emit(trainer, f"epoch {epoch} (stopped)")

    def on_evaluation_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start collecting the evaluation's metrics."""
        self._start(trainer)

    def on_evaluation_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Log the evaluation's line."""
        self._collect(trainer)
        self._emit(trainer, "evaluation")

    def _start(self, trainer: TrainerLike) -> None:
        setup_logging()
        self._cursor.skip_to_end(trainer.run_history)
        self._pending = {}
        self._started = time.perf_counter()

    def _collect(self, trainer: TrainerLike) -> None:
        new = self._cursor.read_new(trainer.run_history)
        for name in loss_first(new):
            self._pending[name] = new[name]

    def _emit(self, trainer: TrainerLike, head: str, eta: float | None = None) -> None:
        pending, self._pending = self._pending, {}
        if not trainer.accelerator.is_main_process:
            return
        seconds = time.perf_counter() - self._started
        to_go = "" if eta is None else f", {format_duration(eta)} to go"
        parts = [head, format_metrics(pending), f"({seconds:.1f} s{to_go})"]
        get_logger().info(SEPARATOR.join(part for part in parts if part))


def _plural(count: int, noun: str) -> str:
    suffix = "es" if noun.endswith("s") else "s"
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{suffix}"


def format_duration(seconds: float) -> str:
    """A duration for the console: ``9.6 s``, ``2 min 05 s``, ``1 h 02 min 05 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s"


def precision_text(trainer: TrainerLike) -> str:
    """The precision in effect: the mixed precision accelerate applies and the weights' dtype.

    E.g. ``float32`` (no mixed precision) or ``bf16 mixed precision, float32 weights``, read
    from the prepared accelerator and model, so a setting made through ``accelerator_kwargs``
    or the ``accelerate`` config is confirmed as it is applied.
    """
    weights = next((p.dtype for p in trainer.model.parameters()), None)
    dtype = "no weights" if weights is None else f"{str(weights).removeprefix('torch.')} weights"
    mixed = str(trainer.accelerator.mixed_precision)
    if mixed == "no":
        return dtype.removesuffix(" weights")
    return f"{mixed} mixed precision, {dtype}"


class ProgressBarCallback(TrainerCallback):
    """Show a tqdm progress bar for each training and evaluation epoch, on the main process.

    The bars move on the trainer's progress events (``on_train_progress``,
    ``on_eval_progress``), which come in growing strides while steps are fast (at most about
    every 0.05 s, ``Trainer.progress_interval``, as often as tqdm redraws): the bar costs the
    loop nothing on most steps and shows the exact count when the epoch ends.

    The training bar shows the epoch's mean loss so far on the local main process (not
    reduced across processes), and the run's epoch (``train 3/10``). By default the running
    loss is read when the bar redraws (at a progress event, at most every 0.1 s, tqdm's
    ``mininterval``), so a step that does not redraw the bar reads nothing; with
    ``loss_update_interval=N`` it is read at the first progress event after each multiple of
    N steps instead; with ``running_loss=False`` only at the end of each epoch, from the
    ``train_loss_epoch`` already on the host. A read is made on CUDA without waiting (copied
    into pinned memory with ``non_blocking=True`` and shown one read later, once a CUDA event
    says the copy is done); on the CPU directly; on other devices (MPS, XPU) with one sync per
    read. Where the bar is not drawn (not a terminal), nothing is read.

    The bars are drawn on the main process, by default only when standard error is a
    terminal (or in a notebook), and disappear when their epoch ends (``leave=False``),
    leaving ``PrintProgressCallback``'s line.

    Args:
        loss_update_interval: Refresh the running loss at most once every this many training
            steps, or ``None`` (the default) to refresh it whenever the bar redraws.
        show: ``None`` (the default): show the bars only on a terminal (tqdm's
            ``disable=None``); ``True``: always; ``False``: never.
        running_loss: ``False``: show the loss only at the end of each epoch (no read of the
            running loss during the epoch).

    Raises:
        TypeError: If ``show`` or ``running_loss`` is not a bool (``show`` may be ``None``).

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(ProgressBarCallback(loss_update_interval=50),))
        ```
    """

    may_stop_training = False

    def __init__(
        self,
        loss_update_interval: int | None = None,
        show: bool | None = None,
        *,
        running_loss: bool = True,
    ) -> None:
        check_positive_int(
            "ProgressBarCallback", "loss_update_interval", loss_update_interval, allow_none=True
        )
        fix = "Pass show=None to show the bars only on a terminal."
        check_bool(
            "ProgressBarCallback",
            "show",
            show,
            allow_none=True,
            expected="None, True or False",
            fix=fix,
        )
        check_bool("ProgressBarCallback", "running_loss", running_loss)
        self.loss_update_interval = loss_update_interval
        self.show = show
        self.running_loss = running_loss
        self.pbar: Any = None
        self.eval_pbar: Any = None
        self._pending: tuple[torch.Tensor, Any] | None = None  # (pinned copy, CUDA event)
        self._loss_refreshed_at = 0  # steps done at the last refresh of the running loss
        self._epoch_offset = 0

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Note where the run's epochs start (for the bar's ``epoch/epochs``)."""
        resumed = trainer.resumed_from is not None  # as PrintProgressCallback numbers them
        self._epoch_offset = 0 if resumed else trainer.run_history.current_epoch - 1

    def on_train_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Open the training bar."""
        config = trainer.run_config
        total = config.train_dataloader_len if config else 0
        epochs = None if config is None else config.num_epochs  # None: a stream
        last = "" if epochs is None else f"/{self._epoch_offset + epochs}"
        desc = f"train {trainer.run_history.current_epoch}{last}"
        self.pbar = self._open(trainer, total, desc)
        self._pending = None
        self._loss_refreshed_at = 0

    def on_train_progress(self, trainer: TrainerLike, steps_done: int, **kwargs: Any) -> None:
        """Move the bar to ``steps_done``; read the running loss if the bar redrew (or N steps)."""
        drawn_at = getattr(self.pbar, "last_print_t", None)
        _advance(self.pbar, steps_done)
        if not self.running_loss or self.pbar.disable:
            return
        interval = self.loss_update_interval
        if interval is None:
            refresh = self.pbar.last_print_t != drawn_at  # the bar redrew: read for the next
        else:
            refresh = steps_done // interval > self._loss_refreshed_at // interval
        if refresh:
            self._loss_refreshed_at = steps_done
            self._refresh_loss(trainer)

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Show the epoch's loss and close the training bar."""
        name = trainer.run_history.metric_name_prefix + "train_loss_epoch"
        if not self.pbar.disable and name in trainer.run_history.get_metric_names():
            self._show_loss(trainer.run_history.get_latest_metric(name))
        self.pbar.close()
        self._pending = None

    def on_eval_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Open the evaluation bar."""
        total = len(trainer.eval_dataloader or ())
        if trainer.limit_eval_batches is not None:
            total = min(total, trainer.limit_eval_batches)
        self.eval_pbar = self._open(trainer, total, "eval")

    def on_eval_progress(self, trainer: TrainerLike, steps_done: int, **kwargs: Any) -> None:
        """Move the evaluation bar to ``steps_done``."""
        _advance(self.eval_pbar, steps_done)

    def on_eval_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Close the evaluation bar."""
        self.eval_pbar.close()

    def on_exception(self, trainer: TrainerLike, exception: BaseException, **kwargs: Any) -> None:
        """Close the bars a failed or interrupted run left open."""
        for bar in (self.pbar, self.eval_pbar):
            if bar is not None:
                bar.close()
        self._pending = None

    def _refresh_loss(self, trainer: TrainerLike) -> None:
        """Show the running mean loss: read directly on the CPU, without waiting on CUDA."""
        tracker = trainer.train_loss_tracker
        total = tracker.total_loss
        if self.pbar.disable or total is None:
            return
        mean = total / tracker.running_count
        if mean.device.type != "cuda":
            self._show_loss(mean.item())
            return
        # a copy of the mean into pinned host memory, with its done-event; a finished copy
        # is shown (a host tensor: no device wait) and its buffer reused
        if self._pending is not None and self._pending[1].query():
            self._show_loss(self._pending[0].item())
            buffer = self._pending[0]
        else:  # a copy still in flight keeps its buffer
            buffer = torch.empty((), dtype=mean.dtype, pin_memory=True)
        buffer.copy_(mean, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        self._pending = (buffer, event)

    def _show_loss(self, value: float) -> None:
        self.pbar.set_postfix(loss=f"{value:.4g}", refresh=False)

    def _open(self, trainer: TrainerLike, total: int | None, desc: str) -> Any:
        disable = None if self.show is None else not self.show  # None: tqdm checks for a TTY
        if not trainer.accelerator.is_local_main_process:
            disable = True
        return tqdm(total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False)


def _advance(bar: Any, steps_done: int) -> None:
    """Move ``bar`` forward to ``steps_done`` (tqdm redraws at most every ``mininterval``)."""
    if steps_done > bar.n:
        bar.update(steps_done - bar.n)


class LogMetricsCallback(TrainerCallback):
    """Log each newly recorded metric once, at the end of the phase that recorded it.

    At the end of each training epoch, evaluation epoch, training-run epoch and evaluation
    run, it logs the metrics that gained a value since it last logged. It runs last
    (``order = 100``) so that metrics recorded by other callbacks at the same event are included.
    Override ``log_metrics`` to send them elsewhere; by default they are printed once per
    node.

    Example:
        ```python
        class JsonLogger(LogMetricsCallback):
            def log_metrics(self, trainer, metrics):
                trainer.print(json.dumps(metrics))
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(self) -> None:
        self._cursor = MetricCursor()

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Mark everything already recorded as logged."""
        setup_logging()
        self._cursor.skip_to_end(trainer.run_history)

    on_evaluation_run_start = on_training_run_start

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Log the metrics recorded since the last logging (training, run and evaluation ends)."""
        self._log_new(trainer)

    on_training_run_epoch_end = on_evaluation_run_end = on_train_epoch_end

    def on_eval_epoch_end(
        self, trainer: TrainerLike, sanity_check: bool = False, **kwargs: Any
    ) -> None:
        """Log the metrics of the evaluation epoch (not those of a sanity evaluation)."""
        if not sanity_check:
            self._log_new(trainer)

    def log_metrics(self, trainer: TrainerLike, metrics: dict[str, Any]) -> None:
        """Log a dict of metric values; override to send them elsewhere.

        Args:
            trainer: The trainer.
            metrics: The latest value of each newly recorded metric.
        """
        logger = get_logger()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("metrics: %s", format_metrics(metrics))

    def _log_new(self, trainer: TrainerLike) -> None:
        new = self._cursor.read_new(trainer.run_history)
        if new:
            self.log_metrics(trainer, new)


def get_default_callbacks(progress_bar: bool = True) -> tuple[type[TrainerCallback], ...]:
    """Return the default callback classes (each trainer instantiates its own).

    Args:
        progress_bar: Whether to include ``ProgressBarCallback``.
    """
    progress: tuple[type[TrainerCallback], ...] = (ProgressBarCallback,) if progress_bar else ()
    return (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        *progress,
        LogMetricsCallback,
    )


DEFAULT_CALLBACKS: tuple[type[TrainerCallback], ...] = get_default_callbacks()
"""The callbacks used by ``Trainer`` when none are given."""


def with_environment_callbacks(callbacks: Iterable[CallbackLike]) -> list[CallbackLike]:
    """Return a new list: ``callbacks`` (instances or classes), then those the environment adds.

    When ``PYTORCH_ACCEL_LIMIT_BATCHES`` is set (see ``LimitBatches``), a
    ``LimitBatchesCallback`` is added unless one was given. Callbacks that print nothing
    (none of the console callbacks) are pointed out, once per process.

    Raises:
        ValueError: If ``PYTORCH_ACCEL_LIMIT_BATCHES`` holds something other than a count.
    """
    callbacks = list(DEFAULT_CALLBACKS if isinstance(callbacks, DefaultCallbacks) else callbacks)
    kinds = [callback if isinstance(callback, type) else type(callback) for callback in callbacks]
    if os.environ.get(LIMIT_BATCHES_ENV_VAR) or os.environ.get(OLD_LIMIT_BATCHES_ENV_VAR):
        from pytorch_accel.callbacks.limit_batches import (  # only then: a plain run reads less
            LimitBatchesCallback,
            limit_batches_from_environment,
        )

        limit = limit_batches_from_environment()
        if limit is not None and not any(issubclass(k, LimitBatchesCallback) for k in kinds):
            callbacks.append(LimitBatchesCallback(limit))
            kinds.append(LimitBatchesCallback)
    _say_once_if_silent(kinds)
    return callbacks


_CONSOLE_CALLBACKS = (PrintProgressCallback, ProgressBarCallback, LogMetricsCallback)
_said_silent = False
"""Whether this process was told that its callbacks print nothing (it is said once)."""


def _say_once_if_silent(kinds: list[type[TrainerCallback]]) -> None:
    """Say once per process that the callbacks given dropped the console callbacks.

    As in pytorch-accelerated, ``callbacks=`` replaces ``DEFAULT_CALLBACKS``; a list of one's
    own callbacks then prints nothing, which surprises users of Lightning and the HF Trainer
    (whose callbacks add to the defaults). An empty list is a deliberate silence: not said.
    """
    global _said_silent
    if _said_silent or not kinds or any(issubclass(k, _CONSOLE_CALLBACKS) for k in kinds):
        return
    _said_silent = True
    setup_logging().info(
        "Trainer: the callbacks given replace DEFAULT_CALLBACKS, so nothing prints the run's "
        "progress or metrics. To keep them, pass callbacks=(*DEFAULT_CALLBACKS, "
        f"{kinds[0].__name__}(...)). (Said once.)"
    )

"""Progress output: one line per epoch through the package's logger, and tqdm progress bars."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from pytorch_accel._checks import check_positive_int, fail
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._console import SEPARATOR, format_metrics, loss_first
from pytorch_accel.logging_setup import get_logger, setup_logging
from pytorch_accel.tracking import MetricCursor

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["PrintProgressCallback", "ProgressBarCallback"]


class PrintProgressCallback(TrainerCallback):
    """Log one compact line per epoch, through the ``pytorch_accel`` logger, on the main process.

    For example::

        training: 8 epochs, 360 updates, 32 samples per update
        epoch 1/8  train_loss 1.046  eval_loss 0.3012  accuracy 0.9083  (1.2 s)

    Each epoch's line holds every metric recorded in the run history during that epoch
    (training, evaluation and what other callbacks recorded, whatever their names), the
    losses first, with 4 significant digits, names without their ``_epoch`` suffix; then the
    epoch's wall-clock time (training and evaluation). An ``evaluate()`` run logs one
    ``evaluation ...`` line. A run stopped inside an epoch logs what that epoch recorded, with
    ``(stopped)``. The lines go through ``logging.getLogger("pytorch_accel")`` at ``INFO``
    (see ``pytorch_accel.logging_setup``): silence them with
    ``logging.getLogger("pytorch_accel").setLevel(logging.WARNING)``, or add a handler to send
    them elsewhere. Order ``100``: it reads the metrics after the callbacks that record them.

    The name is pytorch-accelerated's, whose callback printed "Starting epoch N" and similar
    messages; ported code that lists it gets this output.

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

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start collecting metrics."""
        self._start(trainer)
        resumed = trainer.resumed_from is not None
        self._epoch_offset = 0 if resumed else trainer.run_history.current_epoch - 1
        self._announced = False

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the epoch's clock; before the run's first epoch, log what the run will do.

        The announcement waits for the first epoch so that handlers added when the run
        starts (``RunRecordCallback``'s log file) receive it.
        """
        config = trainer.run_config
        if not self._announced and config is not None:
            self._announced = True
            epochs = "" if config.num_epochs is None else _plural(config.num_epochs, "epoch") + ", "
            get_logger().info(
                "training: %s%s, %d samples per update",
                epochs,
                _plural(config.total_num_update_steps, "update"),
                config.train_total_batch_size,
            )
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Collect the training epoch's metrics."""
        self._collect(trainer)

    def on_eval_epoch_end(
        self, trainer: Trainer, sanity_check: bool = False, **kwargs: Any
    ) -> None:
        """Collect the evaluation epoch's metrics (a sanity evaluation's are removed again)."""
        if not sanity_check:
            self._collect(trainer)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log the epoch's line."""
        self._collect(trainer)
        config = trainer.run_config
        epochs = None if config is None else config.num_epochs
        total = "" if epochs is None else f"/{self._epoch_offset + epochs}"  # None: a stream
        self._emit(trainer, f"epoch {trainer.run_history.current_epoch}{total}")

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log what an epoch stopped early recorded."""
        self._collect(trainer)
        if self._pending:
            epoch = trainer.run_history.current_epoch
            self._emit(trainer, f"epoch {epoch} (stopped)")

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start collecting the evaluation's metrics."""
        self._start(trainer)

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log the evaluation's line."""
        self._collect(trainer)
        self._emit(trainer, "evaluation")

    def _start(self, trainer: Trainer) -> logging.Logger:
        self._cursor.skip_to_end(trainer.run_history)
        self._pending = {}
        self._started = time.perf_counter()
        return setup_logging()

    def _collect(self, trainer: Trainer) -> None:
        new = self._cursor.read_new(trainer.run_history)
        for name in loss_first(new):
            self._pending[name] = new[name]

    def _emit(self, trainer: Trainer, head: str) -> None:
        pending, self._pending = self._pending, {}
        if not trainer.accelerator.is_main_process:
            return
        seconds = time.perf_counter() - self._started
        parts = [head, format_metrics(pending), f"({seconds:.1f} s)"]
        get_logger().info(SEPARATOR.join(part for part in parts if part))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class ProgressBarCallback(TrainerCallback):
    """Show a tqdm progress bar for each training and evaluation epoch, on the main process.

    The bars move on the trainer's progress events (``on_train_progress``,
    ``on_eval_progress``), not on every step: while steps are fast the trainer reports them
    in growing strides, at most about every 0.05 s (``Trainer.progress_interval``), which is
    as often as tqdm redraws anyway (every ``mininterval``, 0.1 s), and after every step once
    steps are slower. So the bar costs the training loop nothing on most steps, trails by at
    most about one redraw interval, and shows the exact count when the epoch ends.

    The training bar shows the mean loss of the epoch so far, on the local main process
    (the trainer's on-device running sum ``trainer.train_loss_tracker``, not reduced across
    processes). Reading a device value on the host can make the host wait for the device, so
    by default the loss is shown once per epoch, at its end, from the ``train_loss_epoch``
    the trainer has already brought to the host: the steps stay free of host reads, as for
    every default callback.

    With ``loss_update_interval=N`` the loss is also refreshed at most once every N training
    steps: at the first progress event after each multiple of N steps. On CUDA that costs no
    wait: the mean is copied into pinned host memory with ``non_blocking=True`` and shown one
    refresh later, once the copy has finished (checked with a CUDA event, which does not
    block). On the CPU there is no device to wait for and the value is read directly; on
    other devices (MPS, XPU, ...) the read synchronises, once per refresh.

    The bars are drawn only where they help: on the main process, and, by default, only when
    standard error is a terminal (or in a notebook), so that output piped to a file carries no
    carriage-return clutter. They disappear when their epoch ends (``leave=False``), leaving
    the one line per epoch of ``PrintProgressCallback``.

    Args:
        loss_update_interval: Refresh the running loss at most once every this many training
            steps, or ``None`` (the default) to show it only at the end of each epoch.
        show: ``None`` (the default): show the bars only on a terminal (tqdm's
            ``disable=None``); ``True``: always; ``False``: never.

    Raises:
        TypeError: If ``show`` is not ``None`` or a bool.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(ProgressBarCallback(loss_update_interval=50),))
        ```
    """

    may_stop_training = False

    def __init__(self, loss_update_interval: int | None = None, show: bool | None = None) -> None:
        check_positive_int(
            "ProgressBarCallback", "loss_update_interval", loss_update_interval, allow_none=True
        )
        if show is not None and not isinstance(show, bool):
            fail(
                TypeError,
                "ProgressBarCallback",
                "show",
                show,
                "None, True or False",
                "Pass show=None to show the bars only on a terminal.",
            )
        self.loss_update_interval = loss_update_interval
        self.show = show
        self.pbar: Any = None
        self.eval_pbar: Any = None
        self._pending: tuple[torch.Tensor, Any] | None = None  # (pinned copy, CUDA event)
        self._loss_refreshed_at = 0  # steps done at the last refresh of the running loss

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Open the training bar."""
        total = trainer.run_config.train_dataloader_len if trainer.run_config else 0
        self.pbar = self._open(trainer, total, "train")
        self._pending = None
        self._loss_refreshed_at = 0

    def on_train_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        """Move the bar to ``steps_done``; refresh the running loss if an interval has passed."""
        _advance(self.pbar, steps_done)
        interval = self.loss_update_interval
        if interval is not None and steps_done // interval > self._loss_refreshed_at // interval:
            self._loss_refreshed_at = steps_done
            self._refresh_loss(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Show the epoch's loss and close the training bar."""
        name = trainer.run_history.metric_name_prefix + "train_loss_epoch"
        if not self.pbar.disable and name in trainer.run_history.get_metric_names():
            self._show_loss(trainer.run_history.get_latest_metric(name))
        self.pbar.close()
        self._pending = None

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Open the evaluation bar."""
        total = len(trainer.eval_dataloader or ())
        if trainer.limit_eval_batches is not None:
            total = min(total, trainer.limit_eval_batches)
        self.eval_pbar = self._open(trainer, total, "eval")

    def on_eval_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        """Move the evaluation bar to ``steps_done``."""
        _advance(self.eval_pbar, steps_done)

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Close the evaluation bar."""
        self.eval_pbar.close()

    def _refresh_loss(self, trainer: Trainer) -> None:
        """Show the running mean loss: read directly on the CPU, without waiting on CUDA."""
        tracker = trainer.train_loss_tracker
        total = tracker.total_loss
        if self.pbar.disable or total is None:
            return
        mean = total / tracker.running_count
        if mean.device.type != "cuda":
            self._show_loss(mean.item())
            return
        if self._pending is not None and self._pending[1].query():  # the previous copy is done
            self._show_loss(self._pending[0].item())  # a host tensor: no device wait
        self._pending = _copy_to_host_async(mean, self._pending)

    def _show_loss(self, value: float) -> None:
        self.pbar.set_postfix(loss=f"{value:.4g}", refresh=False)

    def _open(self, trainer: Trainer, total: int | None, desc: str) -> Any:
        disable = None if self.show is None else not self.show  # None: tqdm checks for a TTY
        if not trainer.accelerator.is_local_main_process:
            disable = True
        return tqdm(total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False)


def _advance(bar: Any, steps_done: int) -> None:
    """Move ``bar`` forward to ``steps_done`` (tqdm redraws at most every ``mininterval``)."""
    if steps_done > bar.n:
        bar.update(steps_done - bar.n)


def _copy_to_host_async(
    value: torch.Tensor, previous: tuple[torch.Tensor, Any] | None
) -> tuple[torch.Tensor, Any]:
    """Queue a copy of a CUDA scalar into pinned host memory; return it with its done-event.

    The previous copy's buffer is reused once that copy finished; one still in flight keeps
    its buffer, and a new one is allocated.
    """
    if previous is not None and previous[1].query():
        buffer = previous[0]
    else:
        buffer = torch.empty((), dtype=value.dtype, pin_memory=True)
    buffer.copy_(value, non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return buffer, event

"""Progress output: run and epoch messages, and tqdm progress bars."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from pytorch_accel._validation import check_positive_int
from pytorch_accel.callbacks.base import TrainerCallback

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["PrintProgressCallback", "ProgressBarCallback"]


class PrintProgressCallback(TrainerCallback):
    """Print a line at the start and end of each run and at the start of each epoch.

    Prints once per node, through ``trainer.print``.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer, callbacks=(PrintProgressCallback,))
        ```
    """

    may_stop_training = False

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the training run."""
        trainer.print("\nStarting training run")

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the epoch."""
        trainer.print(f"\nStarting epoch {trainer.run_history.current_epoch}")

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the evaluation epoch."""
        trainer.print("\nStarting eval epoch")

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the end of the training run."""
        trainer.print("Finishing training run")

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the evaluation run."""
        trainer.print("\nStarting evaluation run")

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the end of the evaluation run."""
        trainer.print("Finishing evaluation run")


class ProgressBarCallback(TrainerCallback):
    """Show a tqdm progress bar for each training and evaluation epoch, on the main process.

    The training bar shows the mean loss of the epoch so far, on the local main process
    (the trainer's on-device running sum ``trainer.train_loss_tracker``, not reduced across
    processes). Reading a device value on the host can make the host wait for the device, so
    by default the loss is shown once per epoch, at its end, from the ``train_loss_epoch``
    the trainer has already brought to the host: the steps stay free of host reads, as for
    every default callback.

    With ``loss_update_interval=N`` the loss is also refreshed every N training steps (never
    in between). On CUDA that costs no wait: the mean is copied into pinned host memory with
    ``non_blocking=True`` and shown one interval later, once the copy has finished (checked
    with a CUDA event, which does not block), so the figure lags by up to N steps. On the
    CPU there is no device to wait for and the value is read directly; on other devices
    (MPS, XPU, ...) the read synchronises, once per interval.

    A step only counts itself: the count reaches tqdm in growing strides (after 1, 2, 4, ...
    steps) while steps are fast, as tqdm redraws at most every ``mininterval`` (0.1 s) anyway,
    so the bar trails by at most half a redraw interval (and half the steps done); it shows
    the exact count when the epoch ends.

    Args:
        loss_update_interval: Refresh the running loss every this many training steps, or
            ``None`` (the default) to show it only at the end of each epoch.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(ProgressBarCallback(loss_update_interval=50),))
        ```
    """

    may_stop_training = False

    def __init__(self, loss_update_interval: int | None = None) -> None:
        check_positive_int(
            "ProgressBarCallback", "loss_update_interval", loss_update_interval, allow_none=True
        )
        self.loss_update_interval = loss_update_interval
        self.pbar: Any = None
        self.eval_pbar: Any = None
        self._pending: tuple[torch.Tensor, Any] | None = None  # (pinned copy, CUDA event)
        self._count = self._eval_count = _StridedCount(None)

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Open the training bar."""
        total = trainer.run_config.train_dataloader_len if trainer.run_config else 0
        self.pbar = self._open(trainer, total, "train")
        self._count = _StridedCount(self.pbar)
        self._pending = None

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Count the step; refresh the running loss every ``loss_update_interval`` steps."""
        count = self._count
        count.done += 1
        if count.done >= count.next_push:
            count.push()
        interval = self.loss_update_interval
        if interval is not None and (kwargs.get("step", 0) + 1) % interval == 0:
            self._refresh_loss(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Show the epoch's exact count and loss, and close the training bar."""
        self._count.push()
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
        self._eval_count = _StridedCount(self.eval_pbar)

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Count the evaluation step."""
        count = self._eval_count
        count.done += 1
        if count.done >= count.next_push:
            count.push()

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Show the exact count and close the evaluation bar."""
        self._eval_count.push()
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

    @staticmethod
    def _open(trainer: Trainer, total: int, desc: str) -> Any:
        return tqdm(
            total=total,
            desc=desc,
            disable=not trainer.accelerator.is_local_main_process,
            dynamic_ncols=True,
        )


class _StridedCount:
    """The steps of one bar, handed to tqdm in strides instead of one ``update`` per step.

    The caller adds to ``done`` and calls ``push`` once ``done`` reaches ``next_push``. Each
    push doubles the stride while pushes come less than half of tqdm's ``mininterval`` apart
    and halves it once they come slower, so the bar trails by at most about half a redraw
    interval, and by at most half the steps done.
    """

    __slots__ = ("_bar", "_period", "_pushed_at", "_stride", "done", "next_push")

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._period = getattr(bar, "mininterval", 0.1) / 2
        self._pushed_at: float | None = None  # the first push only starts the clock
        self._stride = 1
        self.done = 0
        self.next_push = 1

    def push(self) -> None:
        """Give the bar the steps counted since the last push; choose the next stride."""
        if self._bar is not None and self.done > self._bar.n:
            self._bar.update(self.done - self._bar.n)
        now = time.monotonic()
        if self._pushed_at is not None:
            fast = now - self._pushed_at < self._period
            self._stride = self._stride * 2 if fast else max(1, self._stride // 2)
        self._pushed_at = now
        self.next_push = self.done + self._stride


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

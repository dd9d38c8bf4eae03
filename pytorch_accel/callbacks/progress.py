"""Progress output: run and epoch messages, and tqdm progress bars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from pytorch_accel._validation import check_positive_int
from pytorch_accel.callback import TrainerCallback

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

    Args:
        loss_update_interval: Refresh the running loss at most once every this many training
            steps, or ``None`` (the default) to show it only at the end of each epoch.

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

    @staticmethod
    def _open(trainer: Trainer, total: int | None, desc: str) -> Any:
        return tqdm(
            total=total,
            desc=desc,
            disable=not trainer.accelerator.is_local_main_process,
            dynamic_ncols=True,
        )


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

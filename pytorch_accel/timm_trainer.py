"""A `Trainer` for timm's schedulers, which are stepped per update and per epoch.

This module does not import timm: it only calls the scheduler's `step_update` and `step`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pytorch_accel._checks import fail
from pytorch_accel.trainer import Trainer

__all__ = ["TimmScheduler", "TrainerWithTimmScheduler"]


@runtime_checkable
class TimmScheduler(Protocol):
    """The two methods of a timm scheduler (`timm.scheduler.scheduler.Scheduler`)."""

    def step(self, epoch: int, metric: float | None = None) -> None:
        """Set the values of the epoch after `epoch` completed epochs."""

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        """Set the values of the update after `num_updates` completed updates."""


class TrainerWithTimmScheduler(Trainer):
    """A `Trainer` that steps a [timm scheduler](https://huggingface.co/docs/timm) like timm does.

    - After every optimizer update: `scheduler.step_update(num_updates=k)`, where `k` is the
      number of updates completed in this `train()` call (1 after the first; gradient
      accumulation counts one per update, not per batch).
    - After every epoch: `scheduler.step(epoch=e, metric=...)`, where `e` is the number of
      epochs completed in this `train()` call, and `metric` is the epoch's `eval_loss_epoch`
      when there is an eval set (for `PlateauLRScheduler`), else `None`.

    The epoch step runs in `training_run_epoch_end`, which fires once per epoch after the
    training *and* evaluation epochs, with or without an eval set, and not for intermediate
    evaluations. (`eval_epoch_end`, used by pytorch-accelerated, never fires without an eval
    set; `train_epoch_end` fires before the eval loss exists.)

    Example:
        ```python
        from functools import partial

        from timm.scheduler import CosineLRScheduler

        from pytorch_accel import TrainerPlaceholderValues as P
        from pytorch_accel.timm_trainer import TrainerWithTimmScheduler

        trainer = TrainerWithTimmScheduler(model, loss_func, optimizer)
        trainer.train(
            train_dataset,
            num_epochs=10,
            create_scheduler_fn=partial(CosineLRScheduler, t_initial=P.NUM_EPOCHS, warmup_t=2),
        )
        ```
    """

    _epochs_completed: int = 0

    def create_scheduler(self) -> Any:
        """Create the scheduler and check that it is stepped like a timm scheduler."""
        scheduler = super().create_scheduler()
        if not isinstance(scheduler, TimmScheduler):
            fail(
                TypeError,
                "TrainerWithTimmScheduler.train",
                "create_scheduler_fn",
                self.create_scheduler_fn,
                "a function returning a timm scheduler (with step_update and step)",
                "Use Trainer for torch.optim.lr_scheduler schedulers and pytorch_accel's own.",
            )
        return scheduler

    def training_run_start(self) -> None:
        """Reset the epoch count of this run."""
        super().training_run_start()
        self._epochs_completed = 0

    def scheduler_step(self) -> None:
        """Call `scheduler.step_update(num_updates)` with the updates completed in this run."""
        self.scheduler.step_update(num_updates=self.num_updates)

    def training_run_epoch_end(self) -> None:
        """Call `scheduler.step(epoch, metric)` with the epochs completed in this run."""
        super().training_run_epoch_end()
        self._epochs_completed += 1
        if self.scheduler is not None:
            self.scheduler.step(epoch=self._epochs_completed, metric=self.scheduler_metric())

    def scheduler_metric(self) -> float | None:
        """Return the metric passed to `scheduler.step`: the latest `eval_loss_epoch`, if any.

        Override to pass another metric (e.g. an accuracy, with a plateau scheduler in
        `mode="max"`).
        """
        if self.eval_dataloader is None:
            return None
        name = f"{self.run_history.metric_name_prefix}eval_loss_epoch"
        return float(self.run_history.get_latest_metric(name))

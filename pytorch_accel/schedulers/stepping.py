"""When the trainer steps its scheduler, and which metric it feeds a metric-driven one.

By default the trainer steps a scheduler after every optimizer update (``interval="step"``).
``SchedulerStepping.create_scheduler_fn(factory, interval="epoch", monitor=...)`` asks for a
step after each epoch instead, fed the latest value of a run-history metric, as Lightning's
``lr_scheduler`` configuration (``interval``, ``monitor``) does. torch's ``ReduceLROnPlateau``
needs no configuration: it is stepped after each epoch's evaluation with the first eval set's
loss (``eval_loss_epoch``), or ``train_loss_epoch`` when the run has no eval set.

The loop reads the stepping when ``train()`` starts (``of``); the default
``Trainer.scheduler_step`` calls ``step`` here. Nothing is kept between steps but the
scheduler's own state, so a resumed run steps exactly as the uninterrupted one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from pytorch_accel._checks import check_choice, check_metric_name, fail
from pytorch_accel.dataloaders import eval_set_prefix
from pytorch_accel.distributed import main_process_object
from pytorch_accel.tracking import TRAIN_LOSS_NAME, RunHistory

__all__ = ["SchedulerInterval", "SchedulerStepping"]

SchedulerInterval = Literal["step", "epoch"]
"""When a scheduler is stepped: after every optimizer update, or after every epoch."""

_WHERE = "SchedulerStepping.create_scheduler_fn"


def _configured(
    scheduler_fn: Callable[[torch.optim.Optimizer], Any],
    optimizer: torch.optim.Optimizer,
    *,
    interval: SchedulerInterval | None,
    monitor: str | None,
) -> Any:
    """Build the scheduler; ``interval`` and ``monitor`` are read by ``SchedulerStepping.of``."""
    del interval, monitor
    return scheduler_fn(optimizer)


@dataclass(frozen=True)
class SchedulerStepping:
    """When the trainer steps the run's scheduler, and with which metric.

    Attributes:
        interval: ``"step"``: after every optimizer update (not skipped by the fp16 gradient
            scaler); ``"epoch"``: after every epoch, once the epoch's evaluation is done.
        monitor: The run-history metric passed to ``scheduler.step(value)`` (its latest
            value, the main process's in several processes); ``None``: ``step()`` with no
            argument. A monitored scheduler steps only after the epochs whose end evaluates
            the eval sets (every ``eval_every_n_epochs``; every epoch without eval sets).
    """

    interval: SchedulerInterval = "step"
    monitor: str | None = None

    @classmethod
    def create_scheduler_fn(
        cls,
        scheduler_fn: Callable[[torch.optim.Optimizer], Any],
        *,
        interval: SchedulerInterval | None = None,
        monitor: str | None = None,
    ) -> functools.partial[Any]:
        """Return ``scheduler_fn`` for ``train(create_scheduler_fn=...)``, stepped as asked.

        Args:
            scheduler_fn: ``optimizer -> scheduler`` (a ``functools.partial``, whose
                placeholders the trainer resolves).
            interval: ``"step"`` or ``"epoch"``; ``None``: ``"epoch"`` with a ``monitor`` or
                for ``ReduceLROnPlateau``, else ``"step"``.
            monitor: The run-history metric fed to ``scheduler.step`` after each evaluation,
                e.g. ``"eval_loss_epoch"``, ``"val_eval_loss_epoch"`` (a named eval set) or
                ``"accuracy"`` (a metric callback's); ``None``: none, except for
                ``ReduceLROnPlateau`` (the first eval set's loss, else the training loss).

        Raises:
            ValueError: For an unknown ``interval``, or a ``monitor`` with ``interval="step"``.
            TypeError: If ``scheduler_fn`` is not callable or ``monitor`` not a string.

        Example:
            ```python
            from functools import partial
            from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

            plateau = SchedulerStepping.create_scheduler_fn(
                partial(ReduceLROnPlateau, mode="max", patience=2), monitor="accuracy"
            )
            per_epoch = SchedulerStepping.create_scheduler_fn(
                partial(StepLR, step_size=3), interval="epoch"
            )
            ```
        """
        if not callable(scheduler_fn):
            fail(
                TypeError,
                _WHERE,
                "scheduler_fn",
                scheduler_fn,
                "optimizer -> scheduler",
                "Pass e.g. functools.partial(ReduceLROnPlateau, patience=2).",
            )
        if interval is not None:
            check_choice(
                _WHERE,
                "interval",
                interval,
                ("step", "epoch"),
                "'step' steps the scheduler after every optimizer update, 'epoch' after "
                "every epoch (Lightning's 'interval').",
            )
        if monitor is not None:
            check_metric_name(_WHERE, "monitor", monitor)
        if monitor is not None and interval == "step":
            fail(
                ValueError,
                _WHERE,
                "interval",
                interval,
                "'epoch' (or None) with a monitor",
                f"The metric {monitor!r} is recorded once per epoch, so a scheduler fed it "
                "is stepped after each epoch's evaluation: leave interval out.",
            )
        return functools.partial(_configured, scheduler_fn, interval=interval, monitor=monitor)

    @classmethod
    def of(
        cls, scheduler: object, factory: object, eval_sets: Iterable[str | None] = ()
    ) -> SchedulerStepping:
        """Return how to step ``scheduler``, built by ``factory``, in a run over ``eval_sets``.

        Raises:
            ValueError: If ``ReduceLROnPlateau`` is asked to step per update.
        """
        interval: SchedulerInterval | None = None
        monitor: str | None = None
        if isinstance(factory, functools.partial) and factory.func is _configured:
            interval, monitor = factory.keywords["interval"], factory.keywords["monitor"]
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if interval == "step":
                fail(
                    ValueError,
                    _WHERE,
                    "interval",
                    interval,
                    "'epoch' (or None) for ReduceLROnPlateau",
                    "ReduceLROnPlateau steps on a metric recorded after each evaluation.",
                )
            if monitor is None:  # the first eval set's loss, else the training loss
                sets = list(eval_sets)
                monitor = f"{eval_set_prefix(sets[0])}eval_loss_epoch" if sets else TRAIN_LOSS_NAME
        if interval is None:
            interval = "epoch" if monitor is not None else "step"
        return cls(interval, monitor)

    @property
    def steps_per_update(self) -> bool:
        """Whether the scheduler is stepped after every optimizer update."""
        return self.interval == "step"

    def steps_after_epoch(self, evaluated: bool) -> bool:
        """Whether to step after an epoch (``evaluated``: its end evaluated the eval sets)."""
        return self.interval == "epoch" and (self.monitor is None or evaluated)

    def step(self, scheduler: Any, run_history: RunHistory) -> None:
        """Step ``scheduler``: with the monitored metric's latest value, or with no argument.

        With several processes the main process's value is used on every process (one
        collective per step), so every process takes the same decision.

        Raises:
            ValueError: If the monitored metric was never recorded (naming those that were).
        """
        if self.monitor is None:
            scheduler.step()
            return
        names = run_history.get_metric_names()
        if self.monitor not in names:
            fail(
                ValueError,
                "Trainer.scheduler_step",
                "the monitored metric",
                self.monitor,
                f"one the run recorded ({', '.join(sorted(names)) or 'none yet'})",
                "Name one of them in SchedulerStepping.create_scheduler_fn(..., monitor=...), "
                "or record it (a metric callback, Trainer.log) before the epoch ends.",
            )
        value = float(run_history.get_latest_metric(self.monitor))
        scheduler.step(main_process_object(value))

"""``TrainerState``: everything that changes while a trainer runs, in one object.

The loop (``pytorch_accel._loop``) writes it; the trainer's public properties
(``num_updates``, ``stopped_by``, ``is_training``, ``grad_norm``, ``resumed_from``, the
dataloaders, ``eval_set`` and the loss trackers) read it, and so does the code that saves a
training state (``position``, ``num_updates``, ``pass_random_state``, ``train_loss_tracker``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.utils.data import DataLoader

from pytorch_accel._checkpointing.resume import Position, ResumePoint
from pytorch_accel._item_weighting import ItemWeighting
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.run_setup import ChosenRates
from pytorch_accel.tracking import LoggedMetrics, LossTracker

if TYPE_CHECKING:
    from pytorch_accel._checkpointing.resume import ResumableLoader
    from pytorch_accel._checkpointing.staging import PendingSave
    from pytorch_accel.failing_batches import FailingBatchGuard

__all__ = ["TrainerState"]


class TrainerState:
    """What changes during a trainer's runs: counters, position, stop, prepared dataloaders.

    Attributes:
        epoch_index: The 0-based epoch of the current ``train()`` call in progress.
        finished_epochs: Epochs of the last ``train()`` call that were completed.
        step: Training micro-batches done in the current epoch (before the step's end event,
            so that a stop raised there still counts the step).
        eval_step: Batches done in the current evaluation epoch.
        num_updates: Optimizer updates so far in the current ``train()`` (the loop's count).
        updates_before: Optimizer updates of the earlier ``train()`` calls of the same run
            (those that continued it with ``reset_run_history=False``); 0 in a new run.
        running: Whether ``train()`` is running.
        savable: Where a training state may be saved now: ``"step"`` (between steps),
            ``"epoch"`` (between epochs), ``"end"`` (after the last epoch) or ``None``.
        stop_request: A ``StopTrainingError`` raised on this process that the processes have
            not agreed on yet.
        agreed_stop: The stop every process agreed on and is unwinding with.
        stopped_by: The ``StopTrainingError`` that ended the last run early, or ``None``.
        grad_norm: The total gradient norm of the last update, when clipping by norm.
        resume: The resume point the current run has yet to enter, if any.
        resumed_from: The training state the current (or last) run resumed from, if any.
        pass_random_state: The CPU random state at the start of the current pass through a
            train dataloader that resumes by replaying its batches (see ``resume``).
        train_dataloader: The prepared train dataloader of the current run, if any.
        eval_dataloaders: The prepared eval dataloaders of the current run, by set name
            (``None``: the one unnamed set); empty without an eval set.
        eval_set: The name of the set being evaluated (``None``: the unnamed one, or none).
        resumable: The controls of a train dataloader that can resume mid-epoch, if it can.
        train_loss_tracker: The on-device tracker of the current training epoch's loss.
        eval_loss_tracker: The on-device tracker of the current evaluation epoch's loss.
        item_weighting: The token-exact weighting of the accumulation windows, for steps
            whose ``batch_output`` carries ``num_items``.
        logged: What ``Trainer.log`` logged in the current epochs and logging intervals.
        failing_batches: The guard of ``train(skip_failing_batches=...)``, if asked for.
        eval_metric_name: The run-history name of the current eval epoch's mean loss.
        eval_limit: The most batches of the current eval epoch (a sanity check), or ``None``.
        chosen_rates: The learning rates the user chose, kept across runs (``auto_scale_lr``).
        pending_save: A training state being written in the background, if any: the loop
            polls it after each step (``poll_save``) and waits for it when the run ends.
    """

    def __init__(self) -> None:
        self.epoch_index = 0
        self.finished_epochs = 0
        self.step = 0
        self.eval_step = 0
        self.num_updates = 0
        self.updates_before = 0
        self._assigned_updates: int | None = None
        self._warned_assignment = False
        self.running = False
        self.savable: Literal["step", "epoch", "end"] | None = None
        self.stop_request: StopTrainingError | None = None
        self.agreed_stop: StopTrainingError | None = None
        self.stopped_by: StopTrainingError | None = None
        self.grad_norm: torch.Tensor | None = None
        self.resume: ResumePoint | None = None
        self.resumed_from: Path | None = None
        self.pass_random_state: torch.Tensor | None = None
        self.train_dataloader: DataLoader[Any] | None = None
        self.eval_dataloaders: dict[str | None, DataLoader[Any]] = {}
        self.eval_set: str | None = None
        self.resumable: ResumableLoader | None = None
        self.train_loss_tracker = LossTracker()
        self.eval_loss_tracker = LossTracker()
        self.item_weighting = ItemWeighting()
        self.logged = LoggedMetrics()
        self.failing_batches: FailingBatchGuard | None = None
        self.eval_metric_name = "eval_loss_epoch"
        self.eval_limit: int | None = None
        self.chosen_rates = ChosenRates()
        self.pending_save: PendingSave | None = None

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None:
        """The eval dataloader of the set being evaluated, else of the first set (or ``None``)."""
        loaders = self.eval_dataloaders
        if self.eval_set in loaders:  # no truth test: that would ask each loader its length
            return loaders[self.eval_set]
        return next(iter(loaders.values()), None)

    @property
    def global_num_updates(self) -> int:
        """``Trainer.global_num_updates``: the updates of the whole run, earlier calls included."""
        return self.updates_before + self.num_updates

    def start_counting(self, continue_run: bool) -> None:
        """Start a ``train()`` call's update count at 0; carry the run's count on, or restart it.

        Args:
            continue_run: The call continues the run (``reset_run_history=False``): the
                updates of the calls before are kept in ``updates_before``.
        """
        self.updates_before = self.global_num_updates if continue_run else 0
        self.num_updates = 0

    def restore_counts(self, saved: Mapping[str, Any]) -> None:
        """Set both update counts to those of a saved training state's trainer part."""
        self.num_updates = int(saved["num_updates"])
        self.updates_before = int(saved.get("updates_before", 0))  # 0: saved before it existed

    @property
    def visible_num_updates(self) -> int:
        """``Trainer.num_updates``: the count, or the value a subclass assigned to it."""
        return self.num_updates if self._assigned_updates is None else self._assigned_updates

    def assign_num_updates(self, value: int | None) -> None:
        """Let ``Trainer.num_updates`` read ``value`` (``None``: the count again).

        Code ported from pytorch-accelerated keeps its own update count in this attribute;
        the loop's stays separate, so the run still ends where it should.
        """
        if value is not None and not self._warned_assignment:
            self._warned_assignment = True  # once per trainer: ported code assigns it often
            warnings.warn(
                "Assigning Trainer.num_updates only changes what it reads: the trainer counts "
                "the updates itself (and TrainerWithTimmScheduler steps timm schedulers with "
                "that count).",
                DeprecationWarning,
                stacklevel=3,
            )
        self._assigned_updates = value

    def position(self, where: str) -> Position:
        """Return where the loop is, as the point a run resumed from a save there continues.

        Args:
            where: The caller, for the error message.

        Raises:
            RuntimeError: Inside ``train()`` anywhere but between steps or between epochs.
        """
        if not self.running or self.savable == "end":
            return Position(self.finished_epochs, 0, in_run=False)
        if self.savable == "step":
            return Position(self.epoch_index, self.step, in_run=True)
        if self.savable == "epoch":
            return Position(self.epoch_index + 1, 0, in_run=True)
        raise RuntimeError(
            f"{where}: a training state can only be saved between steps: call it from "
            "on_train_step_end or on_training_run_epoch_end, or outside train()."
        )

    def poll_save(self) -> None:
        """At a step boundary: complete the save written in the background if it is written."""
        if self.pending_save is not None and self.pending_save.poll():
            self.pending_save = None

    def end_save(self, failed: bool = False) -> None:
        """Wait for the save written in the background and complete it (``failed``: abandon)."""
        pending, self.pending_save = self.pending_save, None
        if pending is not None and failed:
            pending.abandon()
        elif pending is not None:
            pending.wait()

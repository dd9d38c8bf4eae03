"""The training loop, top to bottom: run, epochs, epoch, batches, step, update.

    run                    training run level: start, epochs, stop handling, end
      _epochs              the sanity evaluation if asked for; for each epoch:
        _epoch             train epoch level, eval epochs (every N epochs), run-epoch end
          _batches         for each batch: one train step level
            _step          forward, backward, and the update at a window's end
              _update      clip, optimizer step, scheduler step, zero_grad

Every level fires its start and end events through ``Levels.run``. The step methods and hooks
it calls are the trainer's (``calculate_train_batch_loss``, ``backward_step``, ...), so a
subclass of ``Trainer`` customises the loop without touching it. A resumed run enters at two
seams (``ResumePoint.enter_run`` and ``enter_epoch``); nothing in the batch loop resumes.

The loop also knows where it is (``position``), which is what a training state saved from a
callback records, and where saving is allowed: between steps and between epochs only.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from pytorch_accel._checkpointing.resume import EpochEntry, Position, ResumePoint, enter_epoch
from pytorch_accel._validation import (
    check_batch_output,
    explain_backward_failure,
    fail,
)
from pytorch_accel.accumulation import AccumulationPlan
from pytorch_accel.evaluation_loop import EvaluationLoop
from pytorch_accel.failing_batches import SKIPPED_OUTPUT, FailingBatchGuard
from pytorch_accel.levels import TRAIN_EPOCH, TRAIN_STEP, TRAIN_STEP_EVENTS, TRAINING_RUN, Levels
from pytorch_accel.preparation import Preparation
from pytorch_accel.progress_events import ProgressEvents
from pytorch_accel.run_config import TrainerRunConfig
from pytorch_accel.tracking import LossTracker

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["TrainingLoop"]


class TrainingLoop:
    """Runs training runs for one trainer, and keeps their counters and position.

    Args:
        trainer: Whose step methods, hooks, callbacks and run config the loop uses.
        levels: Fires the levels' events.
        preparation: Holds the prepared dataloaders.
        evaluation: Runs the eval epochs.

    Attributes:
        loss_tracker: The on-device tracker of the current training epoch's loss.
        num_updates: Optimizer updates so far in the current ``train()``.
        grad_norm: The total gradient norm of the last update, when clipping by norm.
        progress: The progress events of the current training epoch.
        resumed_from: The training state the current (or last) run resumed from, if any.
        running: Whether a training run is in progress.
        pass_random_state: The CPU random state at the start of the current pass through a
            train dataloader that resumes by replaying its batches (see ``resume``).
    """

    def __init__(
        self,
        trainer: Trainer,
        levels: Levels,
        preparation: Preparation,
        evaluation: EvaluationLoop,
    ) -> None:
        self._trainer, self._levels = trainer, levels
        self._preparation, self._evaluation = preparation, evaluation
        self.loss_tracker = LossTracker()
        self.num_updates = 0
        self._assigned_updates: int | None = None
        self._warned_assignment = False
        self.grad_norm: torch.Tensor | None = None
        self.progress = self._progress_events()
        self.resumed_from: Path | None = None
        self._resume: ResumePoint | None = None
        self.running = False
        self.savable: Literal["step", "epoch", "end"] | None = None
        self._epoch_index = 0
        self._finished_epochs = 0
        self.pass_random_state: torch.Tensor | None = None
        self.failing_batches: FailingBatchGuard | None = None  # train(skip_failing_batches=)

    # ----------------------------------------------------------------------------- the loop

    def run(self, resume: ResumePoint | None) -> None:
        """Run a training run, continuing ``resume`` if given."""
        self._resume, self.running = resume, True
        self.resumed_from = None if resume is None else resume.directory
        try:
            self._levels.run_entry_point("Trainer.train", TRAINING_RUN, self._epochs)
        finally:
            self.running, self._resume, self.savable = False, None, None

    def _epochs(self) -> None:
        config = self._config()
        resume = self._resume
        first_epoch = 0 if resume is None else resume.enter_run(self._trainer.callback_handler)
        if config.sanity_eval_batches and self._preparation.eval_dataloaders:
            self._evaluation.sanity_check(config.sanity_eval_batches)
        num_epochs = config.num_epochs  # None: over a stream, until the update budget
        epochs = (
            itertools.count(first_epoch) if num_epochs is None else range(first_epoch, num_epochs)
        )
        try:
            for epoch_index in epochs:
                self._epoch_index = epoch_index
                self._epoch()
                if num_epochs is None and self._budget_spent():
                    break
        finally:
            self.savable, self._finished_epochs = "end", num_epochs or self._epoch_index + 1

    def _epoch(self) -> None:
        self.loss_tracker.reset()
        self.progress = self._progress_events()
        self._levels.run(TRAIN_EPOCH, self._batches, finish=self._finish_epoch)
        evaluated = self._evaluates_after_epoch()
        if evaluated:
            self.evaluate("eval_loss_epoch")
        evaluated = evaluated or not self._preparation.eval_dataloaders  # False: skipped
        self.savable = "epoch"
        try:
            self._levels.fire(
                "training_run_epoch_end", "on_training_run_epoch_end", {"evaluated": evaluated}
            )
        finally:  # the epoch is complete even if its last event asks to stop
            self.savable = None
            self._trainer.run_history._increment_epoch()

    def _batches(self) -> None:
        config = self._config()
        plan = AccumulationPlan(config.train_dataloader_len, config.gradient_accumulation_steps)
        total_updates = config.total_num_update_steps
        entry = self._enter_epoch()
        progress = self.progress
        progress.start_at(entry.batches_done)
        if self.num_updates >= total_updates:  # resumed from the run's last update
            entry.restore_random_state()
            return
        dataloader = self._preparation.train_dataloader
        assert dataloader is not None
        if self._preparation.resumable is None:  # what a resumed pass replays
            self.pass_random_state = torch.get_rng_state()
        try:
            with entry.batches(dataloader, self._trainer.limit_train_batches) as batches:
                run_level, train_step = self._levels.run, self._step  # bound once
                handler = self._trainer.callback_handler
                for step, batch in enumerate(batches, entry.batches_done):
                    self.savable = None
                    if handler.active_events.isdisjoint(TRAIN_STEP_EVENTS):
                        train_step(plan, batch, step)  # nothing to fire around it
                    else:
                        run_level(TRAIN_STEP, train_step, (plan, batch, step))
                    if step >= progress.next_step:
                        self.savable = None  # processes report at different steps
                        progress.report()
                    if self.num_updates >= total_updates:
                        return
        finally:
            self.savable = None

    def _step(self, plan: AccumulationPlan, batch: Any, step: int) -> dict[str, Any]:
        scale = 1.0 if plan.steps == 1 else plan.loss_scale(step)
        # a pass of unknown length (a stream) ends its last window where the data ends
        if (
            plan.steps == 1
            or plan.is_update(step)
            or (plan.num_batches is None and self._at_end_of_data())
        ):
            batch_output = self._forward_backward(batch, scale)
            if self.failing_batches is None or self.failing_batches.end_window():
                self._update()
        else:  # inside an accumulation window: no gradient synchronisation between processes
            trainer = self._trainer
            with trainer.accelerator.no_sync(trainer.model):
                batch_output = self._forward_backward(batch, scale)
        self.progress.done = step + 1  # the steps done, for saves and progress
        self.savable = "step"
        return {"batch": batch, "batch_output": batch_output, "step": step}

    def _forward_backward(self, batch: Any, scale: float) -> dict[str, Any]:
        """Compute the batch's loss, track it, and back-propagate it scaled by ``scale``."""
        trainer = self._trainer
        if self.failing_batches is None:
            batch_output = check_batch_output(
                trainer.calculate_train_batch_loss(batch), "calculate_train_batch_loss"
            )
        else:  # skip_failing_batches: a batch that failed on any process is skipped by all
            guarded = self.failing_batches.forward(trainer, batch)
            if guarded is None:
                return dict(SKIPPED_OUTPUT)
            batch_output = guarded
        loss = batch_output["loss"]
        self.loss_tracker.update(loss, batch_output["batch_size"])
        handler = trainer.callback_handler  # an event nobody listens to costs one set look-up
        if "on_backward_start" in handler.active_events:
            self._levels.fire(None, "on_backward_start", {})
        try:
            trainer.backward_step(loss if scale == 1.0 else loss * scale)
        except (AttributeError, RuntimeError) as error:  # checked only once it failed
            explain_backward_failure(loss, "calculate_train_batch_loss", error)
            raise
        if "on_backward_end" in handler.active_events:
            self._levels.fire(None, "on_backward_end", {})
        return batch_output

    def _update(self) -> None:
        trainer = self._trainer
        config = trainer.run_config
        assert config is not None
        if config.gradient_clip_value is not None:
            trainer.accelerator.clip_grad_value_(
                trainer.model.parameters(), config.gradient_clip_value
            )
        elif config.max_grad_norm is not None:
            parameters = trainer.model.parameters()
            self.grad_norm = trainer.accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
        handler = trainer.callback_handler  # an event nobody listens to costs one set look-up
        if "on_optimizer_step_start" in handler.active_events:
            self._levels.fire(None, "on_optimizer_step_start", {})
        trainer.optimizer_step()
        self.num_updates += 1
        if "on_optimizer_step_end" in handler.active_events:
            self._levels.fire(None, "on_optimizer_step_end", {})
        if trainer.scheduler is not None and not self._step_was_skipped():
            trainer.scheduler_step()
        trainer.optimizer_zero_grad()

    def _budget_spent(self) -> bool:
        """Whether a run counted in updates is over; a pass that yielded nothing is an error."""
        if self.num_updates >= self._config().total_num_update_steps:
            return True
        if self.progress.done == 0:
            fail(
                ValueError,
                "Trainer.train",
                "train_dataset",
                self._trainer.train_dataset,
                "data that yields batches on every pass",
                f"Epoch {self._epoch_index + 1} got no batch before max_num_train_steps was "
                "reached: an IterableDataset's __iter__ must start afresh at each call (a "
                "generator function, not a generator object).",
            )
        return False

    def _evaluates_after_epoch(self) -> bool:
        """Whether the eval sets are evaluated after this epoch: every N epochs, and the last."""
        config = self._config()
        if not self._preparation.eval_dataloaders:
            return False
        number = self._epoch_index + 1
        last = number == config.num_epochs or self.num_updates >= config.total_num_update_steps
        return last or number % config.eval_every_n_epochs == 0

    def _at_end_of_data(self) -> bool:
        """Whether this is the train dataloader's last batch of the pass.

        accelerate's dataloaders look one batch ahead and say so before yielding the last.
        """
        return bool(getattr(self._preparation.train_dataloader, "end_of_dataloader", False))

    def _step_was_skipped(self) -> bool:
        """Whether the gradient scaler skipped the update (only possible through the wrapper)."""
        if self._preparation.direct_optimizer is not None:
            return False
        return bool(self._trainer.accelerator.optimizer_step_was_skipped)

    def _finish_epoch(self) -> None:
        """Report the epoch's last progress, then record its mean loss."""
        self.progress.finish()
        trainer = self._trainer
        trainer.run_history.update_metric(
            "train_loss_epoch", self.loss_tracker.reduce(trainer.accelerator)
        )
        if self.failing_batches is not None:
            self.failing_batches.finish_epoch(trainer)

    # --------------------------------------------------------------------- seams and helpers

    def run_eval_epoch(self, metric_name: str, is_intermediate: bool) -> None:
        """Run an eval epoch for a callback (see ``Trainer.run_eval_epoch``).

        Raises:
            ValueError: If the current run has no eval set.
        """
        if self._preparation.eval_dataloader is None:
            fail(
                ValueError,
                "Trainer.run_eval_epoch",
                "eval_dataset",
                None,
                "a dataset",
                "Pass train(..., eval_dataset=...) to evaluate during training.",
            )
        was_training = self._trainer.model.training
        try:
            self.evaluate(metric_name, is_intermediate)
        finally:
            self._trainer.model.train(was_training)

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

    def evaluate(self, metric_name: str, is_intermediate: bool = False) -> None:
        """Run an eval epoch; no training state may be saved inside it."""
        savable, self.savable = self.savable, None
        try:
            self._evaluation.run_epoch(metric_name, is_intermediate)
        finally:
            self.savable = savable

    def position(self, where: str) -> Position:
        """Return where the loop is, as the point a run resumed from a save there continues.

        Args:
            where: The caller, for the error message.

        Raises:
            RuntimeError: Inside ``train()`` anywhere but between steps or between epochs.
        """
        if not self.running or self.savable == "end":
            return Position(self._finished_epochs, 0, in_run=False)
        if self.savable == "step":
            return Position(self._epoch_index, self.progress.done, in_run=True)
        if self.savable == "epoch":
            return Position(self._epoch_index + 1, 0, in_run=True)
        raise RuntimeError(
            f"{where}: a training state can only be saved between steps: call it from "
            "on_train_step_end or on_training_run_epoch_end, or outside train()."
        )

    def _enter_epoch(self) -> EpochEntry:
        """Where this epoch starts: the resume seam (from its first batch unless resuming)."""
        resume, self._resume = self._resume, None
        return enter_epoch(resume, self._preparation.resumable, self._trainer, self.loss_tracker)

    def _config(self) -> TrainerRunConfig:
        config = self._trainer.run_config
        assert config is not None
        return config

    def _progress_events(self) -> ProgressEvents:
        """Fire ``on_train_progress`` for one epoch, as often as ``progress_interval`` says."""
        trainer = self._trainer
        return ProgressEvents(
            trainer.callback_handler, trainer, "on_train_progress", trainer.progress_interval
        )

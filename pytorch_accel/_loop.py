"""The loop, top to bottom: the training run and the evaluation run; prediction uses its levels.

    train                  training run level: start, epochs, stop handling, end
      _epochs              the sanity evaluation if asked for; for each epoch:
        _epoch             Trainer._run_train_epoch, eval epochs (every N epochs), run-epoch end
          train_epoch      train epoch level: for each batch, one train step level
            _train_step    forward, backward, and the update at a window's end
              _update      clip, optimizer step, scheduler step, zero_grad
    evaluate               evaluation run level: the eval epochs
      eval_epochs          for each eval set: Trainer._run_eval_epoch, named after the set
        eval_epoch         eval epoch level: for each batch, one eval step level
    _predictions.predict   predict run level: for each batch, one predict step level, gathered

Every level (a run, an epoch, a step) fires its start and end events through one helper,
``_with_events``, so its two events cannot drift apart, also when a ``StopTrainingError``
ends the run early: a step does not complete, an epoch fires its end and lets the stop unwind,
a run announces the stop and ends. Firing an event runs the trainer's hook of the same name
(``training_run_start`` for ``on_training_run_start``, where the trainer has one), then every
callback that listens. The step methods and hooks are the trainer's, and so are the two epoch
methods pytorch-accelerated users override (``Trainer._run_train_epoch``,
``Trainer._run_eval_epoch``), so a subclass customises the loop without touching it.

The stop rule: a hook or callback raises ``StopTrainingError``. With several processes they
agree on it at fixed points with one ``AgreedFlag`` (a blocking exchange after an event with
a listener, or an overridden hook, that may stop); listeners that agree on their stops
themselves (``TrainerCallback.agreed_stop_events``, with a lagged ``AgreedFlag``) cost none.
What changes during a run lives in the trainer's ``TrainerState`` (``pytorch_accel._state``):
counters, the position a training state saved from a callback records, where saving is
allowed (between steps and between epochs only). A resumed run enters at two seams
(``ResumePoint.enter_run`` and ``enter_epoch``); nothing in the batch loop resumes.

With several processes accelerate completes the last round of eval and predict batches with
repeated samples: their eval loss is left out and ``gather_for_metrics`` drops their
predictions, so every sample counts exactly once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from accelerate.utils import slice_tensors

from pytorch_accel._batches import AccumulationPlan
from pytorch_accel._checks import (
    check_batch_output,
    explain_backward_failure,
    fail,
    shape_mismatches_raise,
)
from pytorch_accel._dict_batches import without_count
from pytorch_accel._peer_failures import (
    announce_failure,
    lost_peer_error,
    unagreed_stop_error,
)
from pytorch_accel._resumable import enter_epoch
from pytorch_accel._state import Preparation, PreparedTrainer, TrainerState, fewer_batches
from pytorch_accel.callback import ProgressEvents
from pytorch_accel.dataloaders import epoch_batches, eval_set_prefix
from pytorch_accel.distributed import AgreedFlag, synchronise_replicas
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.failing_batches import SKIPPED, SKIPPED_OUTPUT, is_empty_batch
from pytorch_accel.run_config import TrainerRunConfig
from pytorch_accel.schedulers.stepping import SchedulerStepping
from pytorch_accel.tracking import (
    BATCH_OUTPUT_KEYS,
    TRAIN_LOSS_NAME,
    MetricCursor,
    get_logger,
    setup_logging,
)

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from pytorch_accel._batches import ItemWeighting
    from pytorch_accel._checkpointing.resume import ResumePoint
    from pytorch_accel.plugins import StepGuard
    from pytorch_accel.plugins.failing_batches import FailingBatchGuard

__all__ = ["PREDICT_STEP_EVENTS", "Loop", "training_rng_preserved"]

_LEVELS = (
    "training_run",
    "evaluation_run",
    "predict_run",
    "train_epoch",
    "eval_epoch",
    "train_step",
    "eval_step",
    "predict_step",
)
_EVENTS = {level: (f"on_{level}_start", f"on_{level}_end") for level in _LEVELS}
"""Each level's start and end events."""
_HOOKED = frozenset({"training_run", "evaluation_run", "train_epoch", "eval_epoch"})
"""The levels whose events also run a trainer hook (``train_epoch_start``, ...)."""

# a step whose two events nobody listens to runs without its level: there is nothing to fire
_TRAIN_STEP_EVENTS = frozenset(_EVENTS["train_step"])
_EVAL_STEP_EVENTS = frozenset(_EVENTS["eval_step"])
PREDICT_STEP_EVENTS = frozenset(_EVENTS["predict_step"])


class LoopTrainer(PreparedTrainer, Protocol):
    """A trainer as the loop sees it: its public surface and its two epoch levels."""

    def _run_train_epoch(self, train_dl: DataLoader[Any] | None) -> bool:
        """Run one training epoch (``Trainer._run_train_epoch``)."""

    def _run_eval_epoch(
        self, valid_dl: DataLoader[Any], is_training: bool = True, is_intermediate: bool = False
    ) -> None:
        """Run one evaluation epoch (``Trainer._run_eval_epoch``)."""


class Loop:
    """Runs a trainer's training runs and evaluation runs (predictions: ``_predictions.predict``).

    Args:
        trainer: Whose step methods, hooks, callbacks and run config the loop uses.
        state: The trainer's ``TrainerState``, where the loop keeps what changes during a run.
        preparation: The accelerate-prepared objects (for ``direct_optimizer``).
    """

    def __init__(self, trainer: LoopTrainer, state: TrainerState, preparation: Preparation) -> None:
        self._trainer, self.state, self._preparation = trainer, state, preparation
        multiple = trainer.accelerator.num_processes > 1
        self._agreement = AgreedFlag() if multiple else None  # the trainer's stop agreement
        self._train_progress = self._eval_progress = self._progress("on_train_progress")
        self._eval_guard: FailingBatchGuard | None = None  # the current eval epoch's
        self._step_parts = _StepParts(self)  # what a step guard (plugins/) runs

    # ---------------------------------------------------------------------- the training run

    def train(self, resume: ResumePoint | None) -> None:
        """Run a training run, continuing ``resume`` if given."""
        state = self.state
        state.resume, state.running = resume, True
        state.resumed_from = None if resume is None else resume.directory
        trainer = self._trainer
        state.item_weighting.start_run(trainer.accelerator.num_processes, trainer.device)
        state.logged.reset()
        if trainer.scheduler is not None:  # consulted only when there is a scheduler
            state.scheduler_stepping = SchedulerStepping.of(
                trainer.scheduler, trainer.create_scheduler_fn, state.eval_dataloaders
            )
        ended = False
        try:
            self._entry_point("Trainer.train", "training_run", self._epochs)
            ended = True
        finally:
            state.running, state.resume, state.savable = False, None, None
            state.chosen_rates.note_left(self._trainer.optimizer)
            state.end_save(failed=not ended)  # a save written in the background completes

    def _epochs(self) -> None:
        config, state = self._config(), self.state
        resume = state.resume
        first_epoch = 0 if resume is None else resume.enter_run(self._trainer.callback_handler)
        if config.sanity_eval_batches and state.eval_dataloaders:
            self.sanity_check(config.sanity_eval_batches)
        num_epochs = config.num_epochs  # None: over a stream, until the update budget
        epochs = (
            itertools.count(first_epoch) if num_epochs is None else range(first_epoch, num_epochs)
        )
        try:
            for epoch_index in epochs:
                state.epoch_index = epoch_index
                self._epoch()
                # the update budget can end a run before its last pass (over a stream)
                if state.num_updates >= config.total_num_update_steps:
                    break
        finally:
            state.savable, state.finished_epochs = "end", num_epochs or state.epoch_index + 1

    def _epoch(self) -> None:
        trainer, state = self._trainer, self.state
        trainer._run_train_epoch(state.train_dataloader)
        config, number = self._config(), state.epoch_index + 1
        # every N epochs, and after the last; True without eval sets, False: skipped
        evaluated = not state.eval_dataloaders
        if not evaluated and (
            number == config.num_epochs
            or state.num_updates >= config.total_num_update_steps
            or number % config.eval_every_n_epochs == 0
        ):
            self.evaluate_in_run("eval_loss_epoch")
            evaluated = True
        if trainer.scheduler is not None and state.scheduler_stepping.steps_after_epoch(evaluated):
            trainer.scheduler_step()  # an epoch-stepped scheduler; before a save at the end
        state.savable = "epoch"
        try:
            self._fire("on_training_run_epoch_end", {"evaluated": evaluated}, hooked=True)
        finally:  # the epoch is complete even if its last event asks to stop
            state.savable = None
            trainer.run_history._increment_epoch()

    def train_epoch(self, dataloader: DataLoader[Any] | None) -> bool:
        """Run one train epoch level over ``dataloader`` (``Trainer._run_train_epoch``).

        Returns:
            Whether the run's updates are all done.
        """
        self.state.train_loss_tracker.reset()
        self.state.logged.start_epoch(TRAIN_LOSS_NAME)
        self.state.step = 0
        self._train_progress = self._progress("on_train_progress")
        self._with_events("train_epoch", self._train_batches, dataloader, finish=self._end_epoch)
        return self.state.num_updates >= self._config().total_num_update_steps

    def _train_batches(self, dataloader: DataLoader[Any] | None) -> None:
        config, state, trainer = self._config(), self.state, self._trainer
        plan = AccumulationPlan(config.train_dataloader_len, config.gradient_accumulation_steps)
        total_updates = config.total_num_update_steps
        # where this epoch starts: the resume seam (from its first batch unless resuming)
        resume, state.resume = state.resume, None
        entry = enter_epoch(resume, state.resumable, trainer, state.train_loss_tracker)
        saved = None if resume is None else resume.rank_state.get("item_weighting")
        if saved is not None and entry.batches_done:  # inside a window weighted by num_items
            state.item_weighting.load_state_dict(saved, trainer.device)
        progress = self._train_progress
        state.step = entry.batches_done
        progress.start_at(entry.batches_done)
        if state.num_updates >= total_updates:  # resumed from the run's last update
            entry.restore_random_state()
            return
        assert dataloader is not None
        if state.resumable is None:  # what a resumed pass replays
            state.pass_random_state = torch.get_rng_state()
        try:
            with entry.batches(dataloader, trainer.limit_train_batches) as batches:
                with_events, train_step = self._with_events, self._train_step  # bound once
                handler = trainer.callback_handler
                for step, batch in enumerate(batches, entry.batches_done):
                    state.savable = None
                    if handler.active_events.isdisjoint(_TRAIN_STEP_EVENTS):
                        train_step(plan, batch, step)  # nothing to fire around it
                    else:
                        with_events("train_step", train_step, plan, batch, step)
                    if state.pending_save is not None:  # written in the background
                        state.poll_save()
                    if step >= progress.next_step:
                        state.savable = None  # processes report at different steps
                        progress.report(state.step)
                    if state.num_updates >= total_updates:
                        return
            if state.step == 0:  # before the epoch's end records a NaN loss (and stops on it)
                self._refuse_empty_pass()
        finally:
            state.savable = None

    def _refuse_empty_pass(self) -> None:
        """Raise: a pass over the training data yielded no batch before the run was done."""
        state, config = self.state, self._config()
        fix = (
            "an IterableDataset's __iter__ must start afresh at each call (a "
            "generator function, not a generator object)"
            if state.epoch_index
            else "the dataset or stream is empty"
        )
        fail(
            ValueError,
            "Trainer.train",
            "train_dataset",
            self._trainer.train_dataset,
            "data that yields batches on every pass",
            f"Epoch {state.epoch_index + 1} got no batch before the run's "
            f"{config.total_num_update_steps} updates were done: {fix}.",
        )

    def _train_step(self, plan: AccumulationPlan, batch: Any, step: int) -> dict[str, Any]:
        # the step hook: a step guard (plugins/) runs the step's parts when train() asks
        state, guard = self.state, self.state.micro_batches or self.state.failing_batches
        scale = 1.0 if plan.steps == 1 else plan.loss_scale(step)
        # a pass of unknown length (a stream) ends its last window where the data ends
        ends_window = (
            plan.steps == 1
            or plan.is_update(step)
            # accelerate's dataloaders say so before yielding the last batch
            or (
                plan.num_batches is None
                and getattr(state.train_dataloader, "end_of_dataloader", False)
            )
        )
        if ends_window and (guard is None or not guard.synchronises(self._trainer.model)):
            batch_output = self._forward_backward(batch, scale, guard)
            if guard is None or guard.end_window():
                self._update()
        else:  # inside an accumulation window: no gradient synchronisation between processes
            trainer = self._trainer
            with trainer.accelerator.no_sync(trainer.model):
                batch_output = self._forward_backward(batch, scale, guard)
            # a step guard with DDP: the loop synchronises, at the window's end
            if ends_window and guard is not None and guard.end_window():
                synchronise_replicas(trainer.model)
                self._update()
        state.step = step + 1  # the steps done, for saves and progress
        state.savable = "step"
        return {"batch": batch, "batch_output": batch_output, "step": step}

    def _forward_backward(
        self, batch: Any, scale: float, guard: StepGuard | None
    ) -> dict[str, Any]:
        """Compute the batch's loss, track it, and back-propagate it scaled by ``scale``."""
        if guard is not None:  # skip failing batches, or split on out-of-memory
            return guard.run_step(self._step_parts, batch, scale)
        trainer = self._trainer
        batch_output = check_batch_output(
            trainer.calculate_train_batch_loss(batch), "calculate_train_batch_loss"
        )
        size = batch_output["batch_size"]
        # never a tensor here: no host sync; an empty batch's NaN loss would poison weights
        if type(size) is int and size == 0 and is_empty_batch(batch):
            fail(
                ValueError,
                "Trainer.train",
                "train batch",
                f"batch {self.state.step + 1} of epoch {self.state.epoch_index + 1}",
                "a batch with at least one sample",
                "The batch is empty (0 samples): its loss would be NaN and the update would "
                "poison the weights. Pass train(skip_failing_batches=...) to skip empty "
                "batches, or drop them from the data.",
            )
        state = self.state
        scaled = state.item_weighting.scaled_loss(
            batch_output, scale, state.step, state.epoch_index
        )
        self._track(batch_output)
        self.backward(batch_output["loss"], scaled, batch, batch_output)
        return batch_output

    def _track(self, batch_output: dict[str, Any]) -> None:
        """Track a step's loss (by ``num_items`` or batch size) and its extra logged scalars."""
        num_items = batch_output.get("num_items")
        self.state.train_loss_tracker.update(
            batch_output["loss"], batch_output["batch_size"] if num_items is None else num_items
        )
        if batch_output.keys() - BATCH_OUTPUT_KEYS:  # a loss's components: logged
            self.state.logged.log_batch_output(batch_output, self._trainer.device)

    def backward(
        self, loss: torch.Tensor, scaled: torch.Tensor, batch: Any, batch_output: dict[str, Any]
    ) -> None:
        """Back-propagate ``scaled`` (``loss``, weighted by the loop), with the backward events."""
        handler = self._trainer.callback_handler  # an event nobody listens to: one set look-up
        if "on_backward_start" in handler.active_events:
            self._fire("on_backward_start", {"batch": batch, "batch_output": batch_output})
        try:
            self._trainer.backward_step(scaled)
        except (AttributeError, RuntimeError) as error:  # checked only once it failed
            explain_backward_failure(loss, "calculate_train_batch_loss", error)
            raise
        if "on_backward_end" in handler.active_events:
            self._fire("on_backward_end", {})

    def _update(self) -> None:
        trainer = self._trainer
        config = self._config()
        if self.state.item_weighting.in_use:  # the window's mean over its loss elements
            self.state.item_weighting.normalise(trainer.model.parameters(), trainer.device)
        if config.gradient_clip_value is not None:
            trainer.accelerator.clip_grad_value_(
                trainer.model.parameters(), config.gradient_clip_value
            )
        elif config.max_grad_norm is not None:
            parameters = trainer.model.parameters()
            norm = trainer.accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
            self.state.grad_norm = norm
        handler = trainer.callback_handler  # an event nobody listens to costs one set look-up
        if "on_optimizer_step_start" in handler.active_events:
            self._fire("on_optimizer_step_start", {})
        trainer.optimizer_step()
        self.state.num_updates += 1
        if "on_optimizer_step_end" in handler.active_events:
            self._fire("on_optimizer_step_end", {})
        stepped = trainer.scheduler is not None and self.state.scheduler_stepping.steps_per_update
        # the gradient scaler may skip the update (only possible through the wrapper)
        if stepped and (
            self._preparation.direct_optimizer is not None
            or not trainer.accelerator.optimizer_step_was_skipped
        ):
            trainer.scheduler_step()
        trainer.optimizer_zero_grad()

    def _end_epoch(self) -> None:
        """Report the epoch's last progress, then record its mean loss (and skipped batches)."""
        state, trainer = self.state, self._trainer
        self._train_progress.finish(state.step)
        guard = state.failing_batches
        if guard is not None and state.train_loss_tracker.total_loss is None:  # all skipped
            guard.refuse_all_skipped(guard.skipped_in_epoch, guard.skipped_in_epoch)
        # the mean loss and the logged values, with one exchange (two if anything was logged)
        state.logged.end_epoch(trainer.run_history, trainer.device, state.train_loss_tracker)
        if state.failing_batches is not None:
            state.failing_batches.finish_epoch(trainer.run_history)

    # ------------------------------------------------------------------------ evaluation

    def evaluate(self, metric_prefix: str, skip_failing_batches: object = None) -> dict[str, Any]:
        """Run an evaluation run (``Trainer.evaluate``); return what it recorded, by name."""
        history, cursor = self._trainer.run_history, MetricCursor()
        cursor.skip_to_end(history)
        with (
            history.prefixed(metric_prefix),
            self._guarding(skip_failing_batches, "evaluation"),
        ):
            run = functools.partial(self.eval_epochs, "loss", False)
            self._entry_point("Trainer.evaluate", "evaluation_run", run)
        return cursor.read_new(history)

    def run_eval_epoch(self, metric_name: str, is_intermediate: bool) -> None:
        """Run an eval epoch for a callback (see ``Trainer.run_eval_epoch``)."""
        if self.state.eval_dataloader is None:
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
            self.evaluate_in_run(metric_name, is_intermediate)
        finally:
            self._trainer.model.train(was_training)

    def evaluate_in_run(self, metric_name: str, is_intermediate: bool = False) -> None:
        """Run the eval epochs inside ``train()``; no training state may be saved inside."""
        state = self.state
        savable, state.savable = state.savable, None
        try:
            self.eval_epochs(metric_name, is_intermediate)
        finally:
            state.savable = savable

    def sanity_check(self, num_batches: int) -> None:
        """Evaluate ``num_batches`` of every eval set, then put the run history back as it was."""
        history, state = self._trainer.run_history, self.state
        saved = history.state_dict()
        state.sanity_checking = True
        try:
            with fewer_batches(self._trainer, num_batches, train=False):
                self.eval_epochs("sanity_eval_loss", False)
        finally:
            state.sanity_checking = False
            history.load_state_dict(saved)

    def eval_epochs(self, metric_name: str, is_intermediate: bool) -> None:
        """Run an eval epoch of every eval set, recording each mean loss as ``metric_name``.

        Under ``training_rng_preserved``: evaluating never changes the training's random
        draws, so a resumed run, whose eval iterators start afresh, draws the same.
        """
        trainer, state = self._trainer, self.state
        for name, dataloader in list(state.eval_dataloaders.items()):
            state.eval_set, state.eval_metric_name = name, metric_name
            try:
                with (
                    trainer.run_history.prefixed(eval_set_prefix(name)),
                    torch.no_grad(),
                    training_rng_preserved(trainer.device),
                ):
                    trainer._run_eval_epoch(dataloader, state.running, is_intermediate)
            finally:
                state.eval_set = None

    def eval_epoch(self, dataloader: DataLoader[Any], is_intermediate: bool) -> None:
        """Run one eval epoch level over ``dataloader`` (``Trainer._run_eval_epoch``)."""
        state = self.state
        state.eval_loss_tracker.reset()
        state.logged.start_epoch(state.eval_metric_name)
        state.eval_step = 0
        self._eval_progress = self._progress("on_eval_progress")
        guard, model = state.failing_batches, self._trainer.model  # unguarded: not entered
        self._eval_guard = None if guard is None else guard.for_eval_epoch(model)
        self._with_events(
            "eval_epoch",
            self._eval_batches,
            dataloader,
            finish=functools.partial(self._end_eval_epoch, state.eval_metric_name),
            is_intermediate=is_intermediate,
            eval_set=state.eval_set,
            sanity_check=state.sanity_checking,
        )

    def _eval_batches(self, dataloader: DataLoader[Any]) -> None:
        trainer, progress = self._trainer, self._eval_progress
        with epoch_batches(dataloader, trainer.limit_eval_batches) as batches:
            with_events, eval_step = self._with_events, self._eval_step  # bound once
            handler = trainer.callback_handler
            for index, batch in enumerate(batches):
                if handler.active_events.isdisjoint(_EVAL_STEP_EVENTS):
                    eval_step(dataloader, batch)  # nothing to fire around it
                else:
                    with_events("eval_step", eval_step, dataloader, batch)
                if index >= progress.next_step:
                    progress.report(self.state.eval_step)

    def _eval_step(self, dataloader: DataLoader[Any], batch: Any) -> dict[str, Any]:
        trainer, state, guard = self._trainer, self.state, self._eval_guard
        compute = functools.partial(self._eval_outputs, dataloader, batch)
        outputs = compute() if guard is None else guard.attempt(compute, batch)
        if outputs is SKIPPED:  # skip_failing_batches: skipped on every process
            state.eval_step += 1
            return {"batch": batch, "batch_output": dict(SKIPPED_OUTPUT)}
        batch_output, real_output, real_samples = outputs
        if real_samples != 0:  # 0: every sample of this process's batch is a repeat
            counted = batch_output
            if real_samples is not None:  # the padded last batch: its real samples only
                counted = {**real_output, "batch_size": real_samples}
            # weighted by the loss elements where the step counts them (num_items), else samples
            weight = counted.get("num_items", counted["batch_size"])
            if "num_items" in batch_output and "num_items" not in counted:
                # the real rows' share of the batch's count (their own is not known)
                weight = batch_output["num_items"] * real_samples / batch_output["batch_size"]
            state.eval_loss_tracker.update(counted["loss"], weight)
            if counted.keys() - BATCH_OUTPUT_KEYS:  # a loss's components: logged
                state.logged.log_batch_output(counted, trainer.device)
        state.eval_step += 1
        return {"batch": batch, "batch_output": batch_output}

    def _eval_outputs(self, dataloader: DataLoader[Any], batch: Any) -> tuple[Any, Any, Any]:
        """The batch's output, and that of its real samples where accelerate padded it.

        Real samples: ``None`` if not padded. The first ``remainder`` samples of the gathered
        last batch are real, in process order (the repeats are those ``gather_for_metrics``
        drops).
        """
        method, trainer = "calculate_eval_batch_loss", self._trainer
        batch_output = check_batch_output(trainer.calculate_eval_batch_loss(batch), method)
        real_samples, accelerator = None, trainer.accelerator
        if accelerator.num_processes > 1 and getattr(dataloader, "end_of_dataloader", False):
            remainder = int(getattr(dataloader, "remainder", -1))
            if remainder > 0:
                size, rank = int(batch_output["batch_size"]), int(accelerator.process_index)
                real_samples = max(0, min(size, remainder - rank * size))
        if not real_samples:
            return batch_output, None, real_samples
        real_batch = slice_tensors(without_count(batch), slice(0, real_samples))
        real_output = check_batch_output(trainer.calculate_eval_batch_loss(real_batch), method)
        return batch_output, real_output, real_samples

    def _end_eval_epoch(self, metric_name: str) -> None:
        """Report the evaluation epoch's last progress, then record its mean loss."""
        trainer, state = self._trainer, self.state
        self._eval_progress.finish(state.eval_step)
        if self._eval_guard is not None:  # agreed counts: every process raises, or none
            self._eval_guard.refuse_all_skipped(self._eval_guard.skipped, state.eval_step)
        state.logged.end_epoch(trainer.run_history, trainer.device, state.eval_loss_tracker)
        if self._eval_guard is not None:
            self._eval_guard.record_eval_epoch(trainer.run_history, metric_name)

    # -------------------------------------------------------------- levels, events, stops

    def _guarding(self, policy: object, kind: str) -> contextlib.AbstractContextManager[None]:
        """An ``evaluate()`` or ``predict()`` call's guard of failing batches (``plugins/``)."""
        from pytorch_accel.plugins.failing_batches import guarding

        trainer = self._trainer
        processes, model = trainer.accelerator.num_processes, trainer.model
        return guarding(self.state, policy, kind, processes, model, trainer.run_history)

    def _entry_point(self, where: str, level: str, body: Callable[[], None]) -> None:
        """Run a whole run level (``train``, ``evaluate``, ``predict``) with its events.

        ``stopped_by`` is cleared first; a loss that broadcasts targets of another shape raises
        (``shape_mismatches_raise``). With several processes an error is left in the process
        group's store (``announce_failure``), and a collective that failed because another
        process ended raises an error naming that process's (``lost_peer_error``).
        """
        self.state.stopped_by = None
        setup_logging()  # the loop's and the callbacks' messages go through the package's logger
        try:
            with shape_mismatches_raise(where):
                self._with_events(level, body)
        except Exception as error:
            if self._agreement is not None and not isinstance(error, StopTrainingError):
                # failed on one process: the others learn it when their next collective fails
                lost = lost_peer_error(where, error)
                if lost is not None:
                    raise lost from error
                announce_failure(error)
            raise

    def _with_events(
        self,
        level: str,
        body: Callable[..., dict[str, Any] | None],
        *args: Any,
        finish: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Fire ``level``'s start event, run ``body(*args)``, then ``finish`` and the end event.

        ``body`` may return extra keyword arguments for the end event. On a
        ``StopTrainingError`` a step (``*_step``) does not complete: the stop propagates; an
        epoch runs ``finish`` and fires its end, then lets the stop unwind; a run keeps the
        stop in ``stopped_by``, announces it (``on_stop_training_error``), fires its end and
        returns. Events fired while closing a level are not agreed on again: every process
        unwinds the same levels in step.
        """
        start, end = _EVENTS[level]
        hooked = level in _HOOKED
        try:
            self._fire(start, kwargs, hooked)
            end_kwargs = body(*args) or {}
        except StopTrainingError as error:
            if level.endswith("_step"):
                raise
            self._refuse_unagreed_stop(level, error)
            if finish is not None:
                finish()
            is_run = level.endswith("_run")
            if is_run:
                self.state.stopped_by = error
                if str(error):
                    get_logger().info(str(error))
                self._trainer.callback_handler.call_event_while_stopping(
                    "on_stop_training_error", self._trainer, error=error
                )
            self._dispatch(end, kwargs, hooked)  # further stops are moot
            if not is_run:
                raise
            return
        if finish is not None:
            finish()
        kwargs.update(end_kwargs)
        self._fire(end, kwargs, hooked)

    def _refuse_unagreed_stop(self, level: str, error: StopTrainingError) -> None:
        """Raise for a stop raised inside an unguarded step with several processes.

        Such a stop is this process's alone (``_peer_failures.unagreed_stop_error``); with
        ``skip_failing_batches`` or ``on_oom="split"`` every step's outcome is agreed on.
        """
        state = self.state
        if self._agreement is None or error is state.agreed_stop or level.endswith("_run"):
            return
        guarded = {
            "train_epoch": state.failing_batches or state.micro_batches,
            "eval_epoch": self._eval_guard,
        }.get(level)
        if guarded is not None:
            return
        step = "train" if level == "train_epoch" else "eval"
        where = "Trainer.train" if state.running else "Trainer.evaluate"
        rank = self._trainer.accelerator.process_index
        raise unagreed_stop_error(where, step, rank, error) from error

    def _fire(self, event: str, kwargs: dict[str, Any], hooked: bool = False) -> None:
        """Run the trainer's hook (if ``hooked``), then the callbacks of ``event``; agree on a stop.

        With several processes all agree on a stop before anyone moves on, so no collective is
        left waiting; a stop already agreed on in a nested event goes on unwinding at once.
        The exchange happens after an event whose hook is overridden (the trainer's own hooks
        never stop) or that has a listener which may stop, unless those listeners agree on
        their stops themselves (``agreed_stop_events``).
        """
        handler = self._trainer.callback_handler
        if hooked:
            stop = self._dispatch(event, kwargs, hooked)
        elif event in handler.active_events:
            stop = handler.dispatch(event, (self._trainer,), kwargs)
        else:
            return  # nothing runs, so there is no stop to agree on either
        state, agreement = self.state, self._agreement
        if agreement is None or (stop is not None and stop is state.agreed_stop):
            if stop is not None:
                raise stop
            return
        if stop is not None and state.stop_request is None:
            state.stop_request = stop  # the first one wins
        if handler.may_stop(event) or (hooked and self._hook_overridden(event[3:])):
            request = state.stop_request
            if not agreement.settle(int(request is not None)):
                return
            error = request or StopTrainingError("Stopping: another process requested it.")
            state.stop_request, state.agreed_stop = None, error
            raise error
        if stop is not None and handler.agrees_on_stops(event):
            # raised on every process at once by a self-agreeing listener
            state.stop_request, state.agreed_stop = None, stop
            raise stop

    def _hook_overridden(self, hook: str) -> bool:
        """Whether ``hook`` is overridden, so it may stop (the trainer's own hooks never do)."""
        trainer = self._trainer
        return (
            hook in vars(trainer) or sum(hook in vars(kind) for kind in type(trainer).__mro__) > 1
        )

    def _dispatch(
        self, event: str, kwargs: dict[str, Any], hooked: bool
    ) -> StopTrainingError | None:
        """Run the hook and the callbacks of ``event``; return the first stop they raised."""
        stop = None
        if hooked:
            try:
                getattr(self._trainer, event[3:])()  # on_train_epoch_start: train_epoch_start
            except StopTrainingError as error:
                stop = error
        callback_stop = self._trainer.callback_handler.dispatch(event, (self._trainer,), kwargs)
        return stop or callback_stop

    def _config(self) -> TrainerRunConfig:
        config = self._trainer.run_config
        assert config is not None
        return config

    def _progress(self, event: str) -> ProgressEvents:
        """The progress events of one epoch, as often as ``progress_interval`` says."""
        trainer = self._trainer
        return ProgressEvents(trainer.callback_handler, trainer, event, trainer.progress_interval)


@contextlib.contextmanager
def training_rng_preserved(device: torch.device) -> Iterator[None]:
    """Restore the CPU random state and that of ``device`` on exit, as they were on entry.

    Creating a ``DataLoader`` iterator draws a seed from the global generator: an evaluation
    would otherwise change the shuffling of every later epoch.
    """
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield


class _StepParts:
    """The parts of the loop's training step that a step guard runs (``plugins.TrainStep``)."""

    def __init__(self, loop: Loop) -> None:
        self._loop = loop

    @property
    def item_weighting(self) -> ItemWeighting:
        """The run's weighting of losses."""
        return self._loop.state.item_weighting

    @property
    def model(self) -> torch.nn.Module:
        """The model being trained."""
        return self._loop._trainer.model

    @property
    def num_updates(self) -> int:
        """The updates done in this ``train()`` call."""
        return self._loop._trainer.num_updates

    def position(self) -> str:
        """Where the step is: ``"step <n> of epoch <m>"``."""
        state = self._loop.state
        return f"step {state.step + 1} of epoch {state.epoch_index + 1}"

    def forward(self, batch: Any) -> Any:
        """Run ``calculate_train_batch_loss`` (its output is not checked here)."""
        return self._loop._trainer.calculate_train_batch_loss(batch)

    def scaled_loss(self, batch_output: dict[str, Any], scale: float) -> torch.Tensor:
        """The output's loss weighted by the run's item weighting and ``scale``."""
        state = self._loop.state
        return state.item_weighting.scaled_loss(batch_output, scale, state.step, state.epoch_index)

    def backward(self, batch_output: dict[str, Any], scaled: torch.Tensor, batch: Any) -> None:
        """Back-propagate ``scaled``, with the backward events."""
        self._loop.backward(batch_output["loss"], scaled, batch, batch_output)

    def track(self, batch_output: dict[str, Any]) -> None:
        """Track the step's loss and logged values."""
        self._loop._track(batch_output)

"""The evaluation epoch: its level, its batches, and the loss of the samples that are real.

    run_epoch              for each eval set: one eval epoch, named after the set
      _run_set             eval epoch level (no gradients, the training's random state kept)
        _batches           for each batch: one eval step level
          _step            calculate_eval_batch_loss, loss tracking
    sanity_check           a few batches of every set before training; the history is kept

With several processes accelerate completes the last round of batches with repeated samples;
their loss is left out, so the recorded loss is that of every sample exactly once. Each named
set is evaluated with the run history's prefix extended by its name (``eval_sets``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import slice_tensors

from pytorch_accel._validation import check_batch_output
from pytorch_accel.batch_iteration import epoch_batches
from pytorch_accel.eval_sets import eval_set_prefix
from pytorch_accel.levels import EVAL_EPOCH, EVAL_STEP, EVAL_STEP_EVENTS, Levels
from pytorch_accel.preparation import Preparation
from pytorch_accel.progress_events import ProgressEvents
from pytorch_accel.tracking import LossTracker

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["EvaluationLoop", "training_rng_preserved"]


class EvaluationLoop:
    """Runs evaluation epochs of the current run's eval dataloaders.

    Args:
        trainer: Whose ``calculate_eval_batch_loss`` runs and whose run history records the loss.
        levels: Fires the levels' events.
        preparation: Holds the prepared eval dataloader.

    Attributes:
        loss_tracker: The on-device tracker of the current evaluation epoch's loss.
        progress: The progress events of the current evaluation epoch.
    """

    def __init__(self, trainer: Trainer, levels: Levels, preparation: Preparation) -> None:
        self._trainer, self._levels, self._preparation = trainer, levels, preparation
        self.loss_tracker = LossTracker()
        self.progress = self._progress_events()

    def run_epoch(self, metric_name: str, is_intermediate: bool = False) -> None:
        """Run an eval epoch of every eval set, recording each mean loss as ``metric_name``.

        Each runs without gradients and under ``training_rng_preserved``: evaluating (an eval
        set, or evaluating more often) never changes the training's random draws, so a resumed
        run, whose eval iterators start afresh, draws the same. A named set's metrics get its
        prefix (``val_eval_loss_epoch``).
        """
        for name in list(self._preparation.eval_dataloaders):
            self._run_set(name, metric_name, is_intermediate, None)

    def sanity_check(self, num_batches: int) -> None:
        """Evaluate ``num_batches`` of every eval set, then put the run history back as it was.

        It runs the eval step and every callback of the eval events (with ``sanity_check=True``),
        so a broken evaluation fails before the first training epoch rather than after it. The
        run's results do not change: no gradients, the training's random state kept, and the
        metrics it recorded are removed.
        """
        history = self._trainer.run_history
        saved = history.state_dict()
        try:
            for name in list(self._preparation.eval_dataloaders):
                self._run_set(name, "sanity_eval_loss", False, num_batches)
        finally:
            history.load_state_dict(saved)

    def _run_set(
        self, name: str | None, metric_name: str, is_intermediate: bool, limit: int | None
    ) -> None:
        """Run one eval epoch of the set ``name``, with its metric prefix, at most ``limit``."""
        trainer, preparation = self._trainer, self._preparation
        history = trainer.run_history
        outer_prefix = history.metric_name_prefix
        preparation.eval_set = name
        history.set_metric_name_prefix(outer_prefix + eval_set_prefix(name))
        self.loss_tracker.reset()
        try:
            with torch.no_grad(), training_rng_preserved(trainer.device):
                self.progress = self._progress_events()
                self._levels.run(
                    EVAL_EPOCH,
                    self._batches,
                    (limit,),
                    finish=functools.partial(self._finish, metric_name),
                    is_intermediate=is_intermediate,
                    eval_set=name,
                    sanity_check=limit is not None,
                )
        finally:
            history.set_metric_name_prefix(outer_prefix)
            preparation.eval_set = None

    def _batches(self, limit: int | None) -> None:
        dataloader = self._preparation.eval_dataloader
        assert dataloader is not None
        progress = self.progress
        limits = [n for n in (limit, self._trainer.limit_eval_batches) if n is not None]
        with epoch_batches(dataloader, min(limits, default=None)) as batches:
            run_level, eval_step = self._levels.run, self._step  # bound once
            handler = self._trainer.callback_handler
            for index, batch in enumerate(batches):
                if handler.active_events.isdisjoint(EVAL_STEP_EVENTS):
                    eval_step(batch)  # nothing to fire around it
                else:
                    run_level(EVAL_STEP, eval_step, (batch,))
                if index >= progress.next_step:
                    progress.report()

    def _step(self, batch: Any) -> dict[str, Any]:
        trainer = self._trainer
        method = "calculate_eval_batch_loss"
        batch_output = check_batch_output(trainer.calculate_eval_batch_loss(batch), method)
        real_samples = self._real_samples_in_padded_batch(batch_output["batch_size"])
        if real_samples is None:
            self.loss_tracker.update(batch_output["loss"], batch_output["batch_size"])
        elif real_samples > 0:
            real_batch = slice_tensors(batch, slice(0, real_samples))
            real_output = check_batch_output(trainer.calculate_eval_batch_loss(real_batch), method)
            self.loss_tracker.update(real_output["loss"], real_samples)
        self.progress.done += 1
        return {"batch": batch, "batch_output": batch_output}

    def _real_samples_in_padded_batch(self, batch_size: Any) -> int | None:
        """Return how many samples of this batch are real, if accelerate padded it; else None.

        With several processes, accelerate completes the last round of eval batches with
        samples from the start of the dataset, so every process has as many batches (no
        collective can deadlock). Those repeats are the ones ``gather_for_metrics`` drops:
        the first ``remainder`` samples of the gathered last batch are real, in process order.
        """
        dataloader = self._preparation.eval_dataloader
        accelerator = self._trainer.accelerator
        at_end = getattr(dataloader, "end_of_dataloader", False)
        if accelerator.num_processes == 1 or not at_end:
            return None
        remainder = int(getattr(dataloader, "remainder", -1))
        if remainder <= 0:
            return None
        size, rank = int(batch_size), int(accelerator.process_index)
        return max(0, min(size, remainder - rank * size))

    def _finish(self, metric_name: str) -> None:
        """Report the evaluation epoch's last progress, then record its mean loss."""
        self.progress.finish()
        trainer = self._trainer
        trainer.run_history.update_metric(
            metric_name, self.loss_tracker.reduce(trainer.accelerator)
        )

    def _progress_events(self) -> ProgressEvents:
        trainer = self._trainer
        return ProgressEvents(
            trainer.callback_handler, trainer, "on_eval_progress", trainer.progress_interval
        )


@contextlib.contextmanager
def training_rng_preserved(device: torch.device) -> Iterator[None]:
    """Restore the CPU random state and that of ``device`` on exit, as they were on entry.

    Creating a ``DataLoader`` iterator draws a seed from the global generator, which also
    seeds the shuffling of the next training epoch; an evaluation would otherwise change the
    order of every later epoch.
    """
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield

"""Prediction: the model's outputs for every sample of a dataset, gathered in dataset order.

    run                    predict run level (no gradients, eval mode, random state kept)
      _batches             for each batch: one predict step level
        _step              calculate_predict_batch, gather across processes, to the output device

With several processes each batch's outputs are gathered with ``gather_for_metrics``, which
drops the samples accelerate repeats to complete the last round of batches, so every sample
appears exactly once, in the order of the (unshuffled) dataloader; with one process nothing
is gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import concatenate, send_to_device

from pytorch_accel.batch_iteration import epoch_batches
from pytorch_accel.evaluation_loop import training_rng_preserved
from pytorch_accel.levels import PREDICT_RUN, PREDICT_STEP, PREDICT_STEP_EVENTS, Levels

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from pytorch_accel.trainer import Trainer

__all__ = ["PredictionLoop"]


class PredictionLoop:
    """Runs prediction runs for one trainer.

    Args:
        trainer: Whose ``calculate_predict_batch`` runs, and whose callbacks get the events.
        levels: Fires the levels' events.
    """

    def __init__(self, trainer: Trainer, levels: Levels) -> None:
        self._trainer, self._levels = trainer, levels
        self._outputs: list[Any] | None = None

    def run(
        self, dataloader: DataLoader[Any], output_device: str | torch.device | None, keep: bool
    ) -> Any:
        """Predict every batch of a prepared ``dataloader``; return the outputs concatenated.

        Args:
            dataloader: The prepared (sharded) dataloader, not shuffled.
            output_device: Where each gathered batch is moved (``None``: where it is).
            keep: Keep and return the outputs; ``False`` returns ``None`` (the callbacks of
                ``on_predict_step_end`` receive each gathered batch).

        Returns:
            The outputs of every sample in order, concatenated on the first dimension (a
            tensor, or the same nested structure of tensors as one batch's outputs).
        """
        self._outputs = [] if keep else None
        model = self._trainer.model
        was_training = model.training
        model.eval()
        try:
            device = self._trainer.device
            with torch.no_grad(), training_rng_preserved(device):
                self._levels.run_entry_point(
                    "Trainer.predict", PREDICT_RUN, self._batches, (dataloader, output_device)
                )
        finally:
            model.train(was_training)
        outputs, self._outputs = self._outputs, None
        return None if not outputs else concatenate(outputs)

    def _batches(
        self, dataloader: DataLoader[Any], output_device: str | torch.device | None
    ) -> None:
        with epoch_batches(dataloader, None) as batches:
            handler = self._trainer.callback_handler
            for batch in batches:
                if handler.active_events.isdisjoint(PREDICT_STEP_EVENTS):
                    self._step(batch, output_device)
                else:
                    self._levels.run(PREDICT_STEP, self._step, (batch, output_device))

    def _step(self, batch: Any, output_device: str | torch.device | None) -> dict[str, Any]:
        outputs = self._trainer.calculate_predict_batch(batch)
        accelerator = self._trainer.accelerator
        # one process has nothing to gather (accelerate would still all-gather over a group of
        # one under a launcher), and no repeated samples to drop
        gathered = (
            accelerator.gather_for_metrics(outputs) if accelerator.num_processes > 1 else outputs
        )
        if output_device is not None:
            gathered = send_to_device(gathered, output_device)
        if self._outputs is not None:
            self._outputs.append(gathered)
        return {"batch": batch, "predictions": gathered}

"""Checkpoints and training states: the ``Trainer`` methods that save and load them.

``Trainer`` inherits these from ``TrainerPersistence``; the work is done by
``pytorch_accel._checkpointing``: ``checkpoint`` (checkpoint files) and ``training_state`` (training
states). See the Checkpointing page of the documentation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accel._checkpointing.checkpoint import restore_checkpoint, write_checkpoint
from pytorch_accel._checkpointing.training_state import TrainingStateIO
from pytorch_accel.tracking import RunHistory

__all__ = ["TrainerPersistence"]


class TrainerPersistence:
    """Save and load checkpoints and training states (part of ``Trainer``)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    run_history: RunHistory
    _accelerator: Accelerator
    _states: TrainingStateIO

    def save_checkpoint(
        self,
        save_path: str | os.PathLike[str],
        checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
    ) -> None:
        """Write a portable checkpoint file, atomically, from the main process.

        The file holds ``model_state_dict`` (unwrapped model), ``optimizer_state_dict`` and
        ``scheduler_state_dict`` when asked for and present, and ``checkpoint_kwargs``. It is
        written to a temporary file and renamed, so a failed save leaves the previous file
        intact. Every process must call this.

        Args:
            save_path: The file to write (e.g. ``"model.pt"``).
            checkpoint_kwargs: Extra entries (tensors, numbers, strings, containers).
            save_optimizer: Include the optimizer state.
            save_scheduler: Include the scheduler state, if there is a scheduler.
        """
        optimizer = self.optimizer if save_optimizer else None
        scheduler = self.scheduler if save_scheduler else None
        accelerator, model = self._accelerator, self.model
        write_checkpoint(accelerator, save_path, model, optimizer, scheduler, checkpoint_kwargs)

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike[str],
        load_optimizer: bool = True,
        load_scheduler: bool = True,
    ) -> dict[str, Any]:
        """Load a checkpoint written by ``save_checkpoint`` (safely: ``weights_only``).

        Args:
            checkpoint_path: The checkpoint file.
            load_optimizer: Restore the optimizer state, if the file has one.
            load_scheduler: Restore the scheduler state, if the file and trainer have one.

        Returns:
            The whole checkpoint dict, including the ``checkpoint_kwargs`` saved with it.
        """
        optimizer = self.optimizer if load_optimizer else None
        scheduler = self.scheduler if load_scheduler else None
        return restore_checkpoint(
            self._accelerator, checkpoint_path, self.model, optimizer, scheduler
        )

    def save_training_state(self, output_dir: str | os.PathLike[str]) -> Path:
        """Save everything needed to continue this run exactly, atomically, to a directory.

        Model, optimizer, gradient scaler and every process's random states (through
        ``accelerator.save_state``), the scheduler, run history, update counter, position in
        the loop, every callback with ``state_dict``/``load_state_dict``, and per process the
        epoch's running loss, gradients of an unfinished accumulation window and the random
        states of the epoch's order. Written to a hidden temporary directory and renamed into
        place once complete (with its manifest), so a failed or interrupted save leaves an
        existing ``output_dir`` intact. Every process must call this.

        Call it outside ``train()``, or inside from ``on_train_step_end`` or
        ``on_training_run_epoch_end`` (``SaveTrainingStateCallback`` does this for you).

        Args:
            output_dir: The directory to write; an existing one is replaced.

        Returns:
            The directory written.

        Raises:
            RuntimeError: If called at another point inside ``train()``.
        """
        return self._states.save(output_dir)

    def load_training_state(self, input_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore the model, optimizer, scaler, random states and run history of a saved state.

        To continue training where the state was saved (scheduler, callbacks, position in the
        epoch included), use ``train(..., resume_from=input_dir)`` instead. The directory is
        verified first: its manifest, every file's size and SHA-256 digest, every pickled file
        read with ``weights_only=True``, the world size and the model's parameter names and
        shapes. Every process must call this.

        Args:
            input_dir: A directory written by ``save_training_state``.

        Returns:
            The trainer state saved with it (position, counters, callback states).

        Raises:
            FileNotFoundError: If there is no such directory.
            TrainingStateError: If it is incomplete, corrupt or does not fit this trainer.
        """
        shared, _ = self._states.load(Path(input_dir), "Trainer.load_training_state")
        self.run_history.load_state_dict(shared["history"])
        return shared

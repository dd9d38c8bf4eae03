"""Place the trainer's auxiliary modules (e.g. a loss with weights) on the right device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from pytorch_accel.callback import TrainerCallback

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["MoveModulesToDeviceCallback"]


class MoveModulesToDeviceCallback(TrainerCallback):
    """Move every public ``nn.Module`` attribute of the trainer, except the model, to its device.

    The model is placed by ``accelerator.prepare``; this covers the rest, such as a loss
    function with class weights (``trainer.loss_func``) or a teacher model set as an attribute
    of a trainer subclass. Runs first (``order = -100``) at the start of each run.

    Example:
        ```python
        trainer = Trainer(model, nn.CrossEntropyLoss(weight=class_weights), optimizer)
        ```
    """

    order = -100
    may_stop_training = False

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Move the modules before training starts."""
        self._move_modules(trainer)

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Move the modules before evaluation starts."""
        self._move_modules(trainer)

    @staticmethod
    def _move_modules(trainer: Trainer) -> None:
        for name, value in vars(trainer).items():
            public = not name.startswith("_")
            if public and isinstance(value, nn.Module) and value is not trainer.model:
                value.to(trainer.device)

"""Stop training when the loss becomes NaN or infinite."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel._checks import check_positive_int
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.errors import StopTrainingError

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["TerminateOnNaNCallback"]


class TerminateOnNaNCallback(TrainerCallback):
    """Raise ``StopTrainingError`` once the loss is NaN or infinite.

    It never reads a loss per step. A NaN or infinite batch loss makes the epoch's
    sample-weighted sum non-finite, so by default the check reads the epoch loss the trainer
    has already brought to the host (``train_loss_epoch``): it costs nothing and stops at the
    end of the epoch that went bad, before its evaluation. With ``check_every_n_steps=N`` it
    also reads the running sum every N training steps (one host synchronisation each time),
    stopping within N steps. It never calls ``sys.exit``.

    Args:
        check_every_n_steps: Also check the running loss every this many training steps, or
            ``None`` to check only at epoch ends.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(TerminateOnNaNCallback(check_every_n_steps=100),))
        ```
    """

    order = -50

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        check_positive_int(
            "TerminateOnNaNCallback", "check_every_n_steps", check_every_n_steps, allow_none=True
        )
        self.check_every_n_steps = check_every_n_steps
        if check_every_n_steps is None:
            # Not listening to steps at all keeps them free of any stop agreement between
            # processes (the handler skips events an instance sets to None).
            self.on_train_step_end = None  # type: ignore[assignment]

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Check the running loss sum every ``check_every_n_steps`` steps."""
        every = self.check_every_n_steps
        if every is None or (kwargs.get("step", 0) + 1) % every:
            return
        total = trainer.train_loss_tracker.total_loss
        if total is not None and not bool(torch.isfinite(total)):
            raise StopTrainingError(
                f"Stopping training: the loss became NaN or infinite within the last {every} "
                f"steps (epoch {trainer.run_history.current_epoch})."
            )

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Check the epoch's mean training loss."""
        self._check_metric(trainer, "train_loss_epoch")

    def check_for_nan_after_batch(
        self, batch_output: dict[str, Any], step: str | None = None
    ) -> None:
        """Stop if a batch's loss is NaN or infinite (pytorch-accelerated's per-batch check).

        The callback itself never calls it (it reads the loss once per epoch); a subclass or a
        step method may, at the cost of one host synchronisation per call.

        Args:
            batch_output: A step method's output, with ``loss``.
            step: ``"training"`` or ``"validation"``, for the message.

        Raises:
            StopTrainingError: If the loss is not finite.
        """
        loss = batch_output["loss"]
        if not bool(torch.isfinite(torch.as_tensor(loss)).all()):
            raise StopTrainingError(f"Stopping training due to NaN loss in {step} step")

    @staticmethod
    def _check_metric(trainer: Trainer, name: str) -> None:
        value = trainer.run_history.get_latest_metric(name)
        if not math.isfinite(value):
            raise StopTrainingError(
                f"Stopping training: {name} is {value} in epoch "
                f"{trainer.run_history.current_epoch}."
            )

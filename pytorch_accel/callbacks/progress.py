"""Progress output: run and epoch messages, and tqdm progress bars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from pytorch_accel.callbacks.base import TrainerCallback

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["PrintProgressCallback", "ProgressBarCallback"]


class PrintProgressCallback(TrainerCallback):
    """Print a line at the start and end of each run and at the start of each epoch.

    Prints once per node, through ``trainer.print``.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer, callbacks=(PrintProgressCallback,))
        ```
    """

    may_stop_training = False

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the training run."""
        trainer.print("\nStarting training run")

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the epoch."""
        trainer.print(f"\nStarting epoch {trainer.run_history.current_epoch}")

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the evaluation epoch."""
        trainer.print("\nStarting eval epoch")

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the end of the training run."""
        trainer.print("Finishing training run")

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the evaluation run."""
        trainer.print("\nStarting evaluation run")

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Announce the end of the evaluation run."""
        trainer.print("Finishing evaluation run")


class ProgressBarCallback(TrainerCallback):
    """Show a tqdm progress bar for each training and evaluation epoch, on the main process.

    Updating the bar is pure Python: it never reads a tensor, so it adds no host
    synchronisation to the step.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer, callbacks=(ProgressBarCallback,))
        ```
    """

    may_stop_training = False

    def __init__(self) -> None:
        self.pbar: Any = None
        self.eval_pbar: Any = None

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Open the training bar."""
        self.pbar = self._open(trainer, len(trainer.train_dataloader or ()), "train")

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Advance the training bar."""
        self.pbar.update(1)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Close the training bar."""
        self.pbar.close()

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Open the evaluation bar."""
        self.eval_pbar = self._open(trainer, len(trainer.eval_dataloader or ()), "eval")

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Advance the evaluation bar."""
        self.eval_pbar.update(1)

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Close the evaluation bar."""
        self.eval_pbar.close()

    @staticmethod
    def _open(trainer: Trainer, total: int, desc: str) -> Any:
        return tqdm(
            total=total,
            desc=desc,
            disable=not trainer.accelerator.is_local_main_process,
            dynamic_ncols=True,
        )

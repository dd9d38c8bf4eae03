"""What the layers below the ``Trainer``, and callbacks, see of a trainer: small protocols.

The loop, the run state, the checkpointing code, the tools and the callbacks are typed against
these, never against the ``Trainer`` class, so none of them imports the facade (not even for
type hints) and a third party can write a callback from this public surface alone:

```python
from typing import Any

from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.protocols import TrainerLike


class PrintUpdates(TrainerCallback):
    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        trainer.print(f"{trainer.num_updates} updates so far")
```

Every ``Trainer`` (and subclass) satisfies ``TrainerLike``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from accelerate import Accelerator

    from pytorch_accel.callback import CallbackHandler
    from pytorch_accel.errors import StopTrainingError
    from pytorch_accel.run_config import TrainerRunConfig
    from pytorch_accel.tracking import LoggedMetrics, LossTracker, RunHistory

__all__ = ["DataHooks", "StepMethods", "TrainerLike"]


class StepMethods(Protocol):
    """The overridable step methods the loop calls for each batch and update."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Return the training batch's loss (``"loss"``) and model outputs."""

    def backward_step(self, loss: torch.Tensor) -> None:
        """Compute the gradients of ``loss``."""

    def optimizer_step(self) -> None:
        """Update the parameters."""

    def scheduler_step(self) -> None:
        """Step the scheduler, once per update."""

    def optimizer_zero_grad(self) -> None:
        """Reset the gradients."""

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Return the evaluation batch's loss (``"loss"``) and model outputs."""

    def calculate_predict_batch(self, batch: Any) -> Any:
        """Return the model's predictions for one batch."""


class DataHooks(Protocol):
    """The dataloader hooks a run builds its dataloaders with, and the data they read."""

    train_dataset: Any
    eval_dataset: Any
    collate_fn: Callable[..., Any] | None

    def create_train_dataloader(
        self, batch_size: int, train_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the training dataloader."""

    def create_eval_dataloader(
        self, batch_size: int, eval_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the evaluation dataloader."""


class TrainerLike(StepMethods, DataHooks, Protocol):
    """A trainer as callbacks and the layers below the facade see it: its public surface."""

    model: nn.Module
    loss_func: Callable[..., torch.Tensor] | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    create_scheduler_fn: Callable[[torch.optim.Optimizer], Any] | None
    callback_handler: CallbackHandler
    run_history: RunHistory
    run_config: TrainerRunConfig | None
    limit_train_batches: int | None
    limit_eval_batches: int | None
    progress_interval: float
    dry_run_dir: Path | None

    @property
    def accelerator(self) -> Accelerator:
        """The trainer's ``accelerate.Accelerator``."""

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""

    @property
    def run_dir(self) -> Path | None:
        """This run's directory under ``Trainer(output_dir=...)``, else ``None``."""

    @property
    def train_dataloader(self) -> DataLoader[Any] | None:
        """The current run's prepared training dataloader."""

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None:
        """The current run's prepared (first) evaluation dataloader."""

    @property
    def eval_dataloaders(self) -> Mapping[str | None, DataLoader[Any]]:
        """The current run's prepared evaluation dataloaders, by eval set name."""

    @property
    def eval_set(self) -> str | None:
        """The name of the eval set being evaluated."""

    @property
    def train_loss_tracker(self) -> LossTracker:
        """The running training loss of the epoch."""

    @property
    def eval_loss_tracker(self) -> LossTracker:
        """The running evaluation loss of the epoch."""

    @property
    def num_updates(self) -> int:
        """The optimizer updates of the current ``train()`` call."""

    @property
    def global_num_updates(self) -> int:
        """The optimizer updates since the first run (a resumed run's included)."""

    @property
    def is_training(self) -> bool:
        """Whether a training epoch is in progress."""

    @property
    def stopped_by(self) -> StopTrainingError | None:
        """The ``StopTrainingError`` that ended the last run early, if any."""

    @property
    def resumed_from(self) -> Path | None:
        """The training state the current run resumed from, if any."""

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The gradient norm of the last update, when gradients were clipped."""

    @property
    def logged_metrics(self) -> LoggedMetrics:
        """The values logged with ``log`` in the current epoch."""

    def train(self, *args: Any, **kwargs: Any) -> None:
        """Train (``Trainer.train``'s arguments)."""

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Evaluate (``Trainer.evaluate``'s arguments)."""

    def create_scheduler(self) -> Any:
        """Create the scheduler from ``create_scheduler_fn``."""

    def run_eval_epoch(
        self, metric_name: str = "intermediate_eval_loss", is_intermediate: bool = True
    ) -> None:
        """Run one evaluation epoch of each of the current run's eval sets, inside ``train()``."""

    def log(self, name: str, value: Any, *, reduce: str = "mean", weight: Any = 1) -> None:
        """Log a value of the current epoch."""

    def gather(self, tensor: Any, padding_value: float | None = None) -> Any:
        """Gather tensors from every process."""

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather predictions and targets for metrics, without the padding samples."""

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once, on the main process."""

    def get_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """The model without its distributed wrappers."""

    def save_checkpoint(
        self,
        save_path: str | os.PathLike[str],
        checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
    ) -> None:
        """Save a single-file model checkpoint."""

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike[str],
        load_optimizer: bool = True,
        load_scheduler: bool = True,
    ) -> dict[str, Any]:
        """Load a single-file model checkpoint."""

    def save_training_state(
        self, output_dir: str | os.PathLike[str], blocking: bool = True
    ) -> Path:
        """Save a training state directory."""

    def load_training_state(self, input_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Load a training state directory."""

"""Convert BatchNorm layers to SyncBatchNorm before the model is wrapped for distribution."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from torch import nn

from pytorch_accel.callback import TrainerCallback

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["ConvertSyncBatchNormCallback"]


class ConvertSyncBatchNormCallback(TrainerCallback):
    """Replace every ``BatchNorm*d`` with ``SyncBatchNorm`` in multi-GPU runs.

    Batch statistics are then computed over the global batch instead of each process's share.
    The conversion happens at ``on_init_end``, before the first ``train()`` or ``evaluate()``
    wraps the model in ``DistributedDataParallel`` (converting a wrapped model has no effect
    on the wrapper), so pass this callback to the ``Trainer`` constructor. Parameters are
    kept, so the optimizer built on the original model stays valid.

    Single-process runs are left unchanged, and so are multi-process CPU runs: PyTorch's DDP
    rejects SyncBatchNorm on CPU, so a warning says statistics stay per process there.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(*DEFAULT_CALLBACKS, ConvertSyncBatchNormCallback()))
        ```
    """

    order = -200
    may_stop_training = False

    def on_init_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Convert the still unwrapped model, if several GPU processes take part."""
        if trainer.accelerator.num_processes == 1:
            return
        if trainer.device.type == "cpu":
            warnings.warn(
                "ConvertSyncBatchNormCallback: left BatchNorm layers as they are, because "
                "PyTorch's DistributedDataParallel rejects SyncBatchNorm on CPU; batch "
                "statistics stay per process.",
                stacklevel=2,
            )
            return
        trainer.model = nn.SyncBatchNorm.convert_sync_batchnorm(trainer.model)  # type: ignore[no-untyped-call]

"""Convert BatchNorm layers to SyncBatchNorm before the model is wrapped for distribution."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from torch import nn

from pytorch_accel.callback import TrainerCallback

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["ConvertSyncBatchNormCallback"]


class ConvertSyncBatchNormCallback(TrainerCallback):
    """Replace every ``BatchNorm*d`` with ``SyncBatchNorm`` in multi-GPU runs.

    Batch statistics are then computed over the global batch instead of each process's share.
    The conversion happens at ``on_init_end``, before the model is wrapped in
    ``DistributedDataParallel``, so pass this callback to the ``Trainer`` constructor. The
    parameters are kept, so the optimizer stays valid. Single-process runs are left
    unchanged, and so are multi-process CPU runs (DDP rejects SyncBatchNorm on CPU), with a
    warning.

    Example:
        ```python
        sync = ConvertSyncBatchNormCallback()
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, sync))
        ```
    """

    order = -200
    may_stop_training = False

    def on_init_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
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

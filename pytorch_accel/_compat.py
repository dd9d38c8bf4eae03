"""The names pytorch-accelerated users import from its ``trainer`` module, served lazily.

``pytorch_accel.trainer`` uses ``trainer_module_attribute`` as its module ``__getattr__``, so
``from pytorch_accel.trainer import TrainerWithTimmScheduler, ProgressBarCallback, set_seed``
works as it did, without the facade importing them all (``TrainerWithTimmScheduler`` is a
subclass of ``Trainer``, defined after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = ["TRAINER_MODULE_NAMES", "PortedTrainerAttributes", "trainer_module_attribute"]

TRAINER_MODULE_NAMES = (
    "DEFAULT_CALLBACKS",
    "LogMetricsCallback",
    "MoveModulesToDeviceCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "TerminateOnNaNCallback",
    "TrainerWithTimmScheduler",
    "remove_padding",
    "set_seed",
    "worker_init_fn",
)
"""The extra names of pytorch-accelerated's ``trainer`` module."""


def trainer_module_attribute(name: str) -> Any:
    """Return one of ``TRAINER_MODULE_NAMES``, imported from where it lives.

    Raises:
        AttributeError: For any other name, as a module does.
    """
    if name not in TRAINER_MODULE_NAMES:
        raise AttributeError(f"module 'pytorch_accel.trainer' has no attribute {name!r}")
    from accelerate.utils import set_seed

    from pytorch_accel.callbacks import defaults
    from pytorch_accel.dataloaders import worker_init_fn
    from pytorch_accel.distributed import remove_padding
    from pytorch_accel.timm_trainer import TrainerWithTimmScheduler

    found = {
        "TrainerWithTimmScheduler": TrainerWithTimmScheduler,
        "remove_padding": remove_padding,
        "set_seed": set_seed,
        "worker_init_fn": worker_init_fn,
    }
    return found[name] if name in found else getattr(defaults, name)


class _WithDataloaders(Protocol):
    @property
    def train_dataloader(self) -> DataLoader[Any] | None: ...

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None: ...


class PortedTrainerAttributes:
    """Private attributes of pytorch-accelerated's ``Trainer`` that its own examples read.

    ``Trainer`` inherits them, so that code subclassing that trainer keeps working; new code
    uses the public ``train_dataloader`` and ``eval_dataloader``.
    """

    @property
    def _train_dataloader(self: _WithDataloaders) -> DataLoader[Any] | None:
        """``train_dataloader``, under pytorch-accelerated's private name."""
        return self.train_dataloader

    @property
    def _eval_dataloader(self: _WithDataloaders) -> DataLoader[Any] | None:
        """``eval_dataloader``, under pytorch-accelerated's private name."""
        return self.eval_dataloader

"""The pytorch-accelerated names of the trainer module and of ``Trainer``, in one place.

``pytorch_accel.trainer`` serves ``TRAINER_MODULE_NAMES`` through its module ``__getattr__``
(``trainer_module_attribute``), without importing them all (``TrainerWithTimmScheduler`` is a
subclass of ``Trainer``, defined after it).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pytorch_accel.callback import CallbackLike

__all__ = [
    "TRAINER_ATTRIBUTES",
    "TRAINER_MODULE_NAMES",
    "DefaultCallbacks",
    "trainer_module_attribute",
    "with_ported_attributes",
]

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
    """Return one of ``TRAINER_MODULE_NAMES``, imported from where it lives."""
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


TRAINER_ATTRIBUTES = {
    "_train_dataloader": "train_dataloader",
    "_eval_dataloader": "eval_dataloader",
}
"""Private attributes of pytorch-accelerated's ``Trainer`` that its own examples and callbacks
read, and the public property each one reads (read-only)."""

TrainerType = TypeVar("TrainerType", bound=type)


def with_ported_attributes(trainer_class: TrainerType) -> TrainerType:
    """Give ``trainer_class`` the ``TRAINER_ATTRIBUTES``, as read-only aliases of its properties.

    So a callback written for pytorch-accelerated (reading ``trainer._train_dataloader``) works.
    """
    for ported, public in TRAINER_ATTRIBUTES.items():
        alias = property(operator.attrgetter(public), doc=f"``{public}``, under {ported!r}.")
        setattr(trainer_class, ported, alias)
    return trainer_class


class DefaultCallbacks:
    """``DEFAULT_CALLBACKS``, read when a trainer is created (never when a module is imported)."""

    def __iter__(self) -> Iterator[CallbackLike]:
        from pytorch_accel.callbacks.defaults import DEFAULT_CALLBACKS

        return iter(DEFAULT_CALLBACKS)

    def __repr__(self) -> str:
        return "DEFAULT_CALLBACKS"

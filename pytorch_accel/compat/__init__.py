"""Every pytorch-accelerated name that is not the project's own, in one place.

- The extra names of pytorch-accelerated's ``trainer`` module (``TRAINER_MODULE_NAMES``):
  ``pytorch_accel.trainer`` serves them through its module ``__getattr__``
  (``trainer_module_attribute``), each imported from where it lives when first read, by name
  (PEP 562, as ``pytorch_accel.callbacks`` serves its catalogue), so the trainer module
  imports none of them (``TrainerWithTimmScheduler`` is a subclass of ``Trainer``).
- Assigning ``Trainer.num_updates``, as pytorch-accelerated's timm examples do: it changes
  what the property reads, with a deprecation warning (``warn_assigned_num_updates``).
- The private attributes of pytorch-accelerated's ``Trainer`` that its examples and
  callbacks read (``TRAINER_ATTRIBUTES``), as read-only aliases (``with_ported_attributes``).
- ``remove_padding``, pytorch-accelerated's helper for tensors gathered with padding (served by
  ``pytorch_accel.trainer`` and ``pytorch_accel.utils``).

The other modules pytorch-accelerated users import keep their paths (``pytorch_accel.trainer``,
``callbacks``, ``tracking``, ``run_config``, ``finetuning``, ``utils``, ``schedulers``), and
the top-level package has its ``logger`` and ``accelerate_notebook_launcher``.
"""

from __future__ import annotations

import importlib
import operator
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from pytorch_accel.callback import CallbackLike

__all__ = [
    "TRAINER_ATTRIBUTES",
    "TRAINER_MODULE_NAMES",
    "DefaultCallbacks",
    "remove_padding",
    "trainer_module_attribute",
    "warn_assigned_num_updates",
    "with_ported_attributes",
]

TRAINER_MODULE_NAMES = {
    "DEFAULT_CALLBACKS": "pytorch_accel.default_callbacks",
    "LogMetricsCallback": "pytorch_accel.default_callbacks",
    "MoveModulesToDeviceCallback": "pytorch_accel.default_callbacks",
    "PrintProgressCallback": "pytorch_accel.default_callbacks",
    "ProgressBarCallback": "pytorch_accel.default_callbacks",
    "TerminateOnNaNCallback": "pytorch_accel.default_callbacks",
    "TrainerWithTimmScheduler": "pytorch_accel.timm_trainer",
    "remove_padding": "pytorch_accel.compat",
    "set_seed": "accelerate.utils",
    "worker_init_fn": "pytorch_accel.dataloaders",
}
"""The extra names of pytorch-accelerated's ``trainer`` module, and the module of each."""


def trainer_module_attribute(name: str) -> Any:
    """Return one of ``TRAINER_MODULE_NAMES``, imported from where it lives."""
    module = TRAINER_MODULE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'pytorch_accel.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
    """``DEFAULT_CALLBACKS`` as ``Trainer(callbacks=...)``'s default: read when a trainer is made.

    The trainer's ``with_environment_callbacks`` puts ``DEFAULT_CALLBACKS`` in its place; it is
    iterable too, for code that reads the default (nothing is imported at import time).
    """

    def __iter__(self) -> Iterator[CallbackLike]:
        return iter(trainer_module_attribute("DEFAULT_CALLBACKS"))

    def __repr__(self) -> str:
        return "DEFAULT_CALLBACKS"


def warn_assigned_num_updates() -> None:
    """Warn that assigning ``Trainer.num_updates`` changes only what it reads (once per value)."""
    warnings.warn(
        "Assigning Trainer.num_updates only changes what it reads: the trainer counts "
        "the updates itself (and TrainerWithTimmScheduler steps timm schedulers with "
        "that count).",
        DeprecationWarning,
        stacklevel=3,
    )


def remove_padding(padded_tensor: torch.Tensor, pad_value: float) -> torch.Tensor:
    """Drop the rows of a gathered tensor that consist of padding only.

    After ``Trainer.gather(..., padding_value=pad_value)``, the rows that are ``pad_value``
    everywhere are the padding.

    Args:
        padded_tensor: The tensor, padded along its first dimension.
        pad_value: The padding value.

    Returns:
        The rows that hold anything but padding.
    """
    padding = padded_tensor == pad_value
    while padding.ndim > 1:
        padding = padding.all(dim=-1)
    return padded_tensor[~padding]

"""Keep the random state of training untouched by evaluations that callbacks add."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["training_rng_preserved"]


@contextlib.contextmanager
def training_rng_preserved(trainer: Trainer) -> Iterator[None]:
    """Restore the CPU and device random states on exit, as they were on entry.

    Creating a ``DataLoader`` iterator draws a seed from the global generator, which also
    seeds the shuffling of the next training epoch; an extra evaluation would otherwise change
    the order of every later epoch.
    """
    device = trainer.device
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield

"""Count host reads of tensors inside training steps (as tests/test_host_syncs.py does)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback

HOST_READS = ("item", "__bool__", "__float__", "__int__", "tolist", "numpy")


class HostReads:
    """Records the host reads made in each training step and each ``on_train_progress``.

    Add ``callbacks`` to the trainer: they open each window first and close it last.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.active = False
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        self.callbacks = (_Open(self), _Close(self))

    def _counted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls.append(original.__name__)
            return original(tensor, *args, **kwargs)

        return counted


class _Open(TrainerCallback):
    order = -10_000

    def __init__(self, reads: HostReads) -> None:
        self.reads = reads

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.reads.active = True

    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        self.reads.active = True


class _Close(TrainerCallback):
    order = 10_000

    def __init__(self, reads: HostReads) -> None:
        self.reads = reads

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.reads.active = False

    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        self.reads.active = False

"""pytorch-accelerated's ``utils`` module: the same names, for code ported by changing the import.

Most names live elsewhere in pytorch-accel and are re-exported here; ``ModelEma`` and the
process decorators are kept for ported code (``ModelEmaCallback`` and accelerate's
``main_process_first`` / ``on_main_process`` are the usual tools).
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, ParamSpec, TypeVar

import torch
from accelerate.state import PartialState
from torch import nn

from pytorch_accel.callbacks.limit_batches import LIMIT_BATCHES_ENV_VAR, LimitBatches
from pytorch_accel.compat import remove_padding
from pytorch_accel.dataloaders import worker_init_fn

__all__ = [
    "LIMIT_BATCHES_ENV_VAR",
    "DataLoaderSlice",
    "EmaPairs",
    "LimitBatches",
    "ModelEma",
    "local_process_zero_first",
    "local_process_zero_only",
    "remove_padding",
    "worker_init_fn",
    "world_process_zero_only",
]

P = ParamSpec("P")
R = TypeVar("R")


class DataLoaderSlice:
    """The first ``slice_size`` batches of a dataloader (its length is ``slice_size``).

    Args:
        dl: The dataloader (any iterable).
        slice_size: The number of batches to yield.
    """

    def __init__(self, dl: Iterable[Any], slice_size: int) -> None:
        self.dl = dl
        self.slice_size = slice_size

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self.dl, self.slice_size)

    def __len__(self) -> int:
        return self.slice_size


def _on_process_zero_only(func: Callable[P, R], local: bool) -> Callable[P, R | None]:
    """Run ``func`` on process zero (of the node, or of the run) only, then wait."""

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R | None:
        state = PartialState()
        zero = state.is_local_main_process if local else state.is_main_process
        result = func(*args, **kwargs) if zero else None
        state.wait_for_everyone()
        return result

    return wrapped


def local_process_zero_only(func: Callable[P, R]) -> Callable[P, R | None]:
    """Run ``func`` on each node's main process only (others get ``None``); then all wait."""
    return _on_process_zero_only(func, local=True)


def world_process_zero_only(func: Callable[P, R]) -> Callable[P, R | None]:
    """Run ``func`` on the main process of the whole run only (others get ``None``)."""
    return _on_process_zero_only(func, local=False)


def local_process_zero_first(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` on each node's main process first, then on the others (e.g. a download)."""

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        with PartialState().local_main_process_first():
            return func(*args, **kwargs)

    return wrapped


class EmaPairs(NamedTuple):
    """Average tensors paired with the tensors they follow: the one exponential moving average.

    Floating-point tensors move towards theirs, ``ema = decay * ema + (1 - decay) * live``;
    other tensors (such as BatchNorm's ``num_batches_tracked``) are copied. ``ModelEma`` and
    ``ModelEmaCallback`` both average with it.
    """

    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    float_ema: list[torch.Tensor]
    float_live: list[torch.Tensor]
    others: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of(cls, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> EmaPairs:
        """Split ``(average, live)`` pairs (on the same device and dtype) for ``update``."""
        pairs = list(pairs)
        floats = [pair for pair in pairs if pair[0].is_floating_point()]
        others = [pair for pair in pairs if not pair[0].is_floating_point()]
        return cls(pairs, [ema for ema, _ in floats], [live for _, live in floats], others)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """Move every average towards its live tensor by ``1 - decay`` (copy the others)."""
        if self.float_ema:
            torch._foreach_lerp_(self.float_ema, self.float_live, 1.0 - decay)
        for ema, live in self.others:
            ema.copy_(live)


class ModelEma(nn.Module):
    """An exponential moving average of a model's weights, as pytorch-accelerated's ``ModelEma``.

    ``update(model)`` averages the state dict as ``EmaPairs`` does (pytorch-accelerated
    averaged and truncated the integer tensors). ``ModelEmaCallback`` does this for a trainer.

    Args:
        model: The model to average (unwrapped, before DDP or SyncBatchNorm conversion).
        decay: The weight of the average so far, close to 1 (e.g. 0.9999).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s current weights."""
        averages, live = self.module.state_dict().values(), model.state_dict().values()
        pairs = zip(averages, live, strict=True)
        EmaPairs.of((ema, now.to(ema.device, ema.dtype)) for ema, now in pairs).update(self.decay)

    @torch.no_grad()
    def set(self, model: nn.Module) -> None:
        """Copy ``model``'s weights into the average."""
        self.module.load_state_dict(model.state_dict())

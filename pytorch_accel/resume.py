"""The trainer's part of a training state, and where a resumed run picks up.

accelerate saves the model, optimizer, gradient scaler and random states. The trainer adds
its position in the loop, counters, run history, scheduler and the state of every callback
that has ``state_dict``/``load_state_dict`` (saved once, by the main process), and, per
process, the epoch's running loss, gradients accumulated inside an unfinished accumulation
window, and the random states its train dataloader drew the epoch's order from.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytorch_accel.callbacks.base import TrainerCallback
from pytorch_accel.resumable_loader import RandomStates

__all__ = [
    "CheckpointedTrainerState",
    "Position",
    "ResumePoint",
    "callback_states",
    "gradients",
    "restore_callback_states",
    "restore_gradients",
]


@dataclass(frozen=True)
class Position:
    """Where in ``train()`` a state was saved, as the point a resumed run continues from.

    Attributes:
        epoch_index: The epoch of the ``train()`` call (0-based) the run continues in.
        batches_done: Micro-batches of that epoch already trained on (0: it has not begun).
        in_run: Saved during ``train()``, rather than before or after one.
    """

    epoch_index: int
    batches_done: int
    in_run: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the position as a plain dict."""
        return {
            "epoch_index": self.epoch_index,
            "batches_done": self.batches_done,
            "in_run": self.in_run,
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Position:
        """Rebuild from ``to_dict``'s output."""
        return cls(int(state["epoch_index"]), int(state["batches_done"]), bool(state["in_run"]))


@dataclass
class ResumePoint:
    """A loaded training state, waiting to be applied where the saved run was.

    Attributes:
        directory: The training state it was loaded from.
        position: Where the saved run was.
        callbacks: The saved callback states, by key (see ``callback_states``).
        rank_state: This process's own saved state.
        random_states: The random states at the save, and of the samplers' generators.
    """

    directory: Path
    position: Position
    callbacks: dict[str, Any]
    rank_state: dict[str, Any]
    random_states: RandomStates

    @property
    def epoch_states(self) -> RandomStates | None:
        """The random states the saved epoch's order was drawn from (mid-epoch saves)."""
        saved = self.rank_state["loader"]["epoch_states"]
        return None if saved is None else RandomStates.from_dict(saved)


class CheckpointedTrainerState:
    """The object the trainer registers, once, with ``accelerator.register_for_checkpointing``.

    Args:
        collect: Returns the trainer state to save.
    """

    def __init__(self, collect: Callable[[], dict[str, Any]]) -> None:
        self._collect = collect
        self.loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Return the trainer state to save."""
        return self._collect()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Keep a loaded state until the trainer applies it."""
        self.loaded = dict(state_dict)


def _callback_keys(callbacks: Iterable[TrainerCallback]) -> dict[str, TrainerCallback]:
    """Key each stateful callback by class name (``Name#2`` for a second one of a class)."""
    keys: dict[str, TrainerCallback] = {}
    for callback in callbacks:
        if not (
            callable(getattr(callback, "state_dict", None))
            and callable(getattr(callback, "load_state_dict", None))
        ):
            continue
        name = type(callback).__name__
        key, count = name, 1
        while key in keys:
            count += 1
            key = f"{name}#{count}"
        keys[key] = callback
    return keys


def callback_states(callbacks: Iterable[TrainerCallback]) -> dict[str, Any]:
    """Return the state of every callback with ``state_dict`` and ``load_state_dict``."""
    return {key: callback.state_dict() for key, callback in _callback_keys(callbacks).items()}  # type: ignore[attr-defined]


def restore_callback_states(
    callbacks: Iterable[TrainerCallback], states: Mapping[str, Any], source: Path
) -> None:
    """Load each saved callback state into the callback with the same key.

    A saved state without a matching callback, or a stateful callback without a saved state,
    is reported with a warning (the callback starts fresh; nothing else is affected).
    """
    keyed = _callback_keys(callbacks)
    for key, state in states.items():
        callback = keyed.pop(key, None)
        if callback is None:
            warnings.warn(
                f"The training state {str(source)!r} holds the state of a {key} callback that "
                "this trainer does not have; it is ignored.",
                stacklevel=3,
            )
            continue
        callback.load_state_dict(state)  # type: ignore[attr-defined]
    for key in keyed:
        warnings.warn(
            f"The training state {str(source)!r} has no state for the {key} callback; it "
            "starts fresh.",
            stacklevel=3,
        )


def gradients(model: nn.Module) -> list[torch.Tensor | None] | None:
    """Return the model's gradients on the CPU (``None`` if no parameter has one)."""
    grads = [None if p.grad is None else p.grad.detach().cpu() for p in model.parameters()]
    return grads if any(grad is not None for grad in grads) else None


def restore_gradients(model: nn.Module, grads: list[torch.Tensor | None] | None) -> None:
    """Put saved gradients back on the model's parameters (on their devices)."""
    if grads is None:
        return
    for parameter, grad in zip(model.parameters(), grads, strict=True):
        parameter.grad = None if grad is None else grad.to(parameter.device, parameter.dtype)

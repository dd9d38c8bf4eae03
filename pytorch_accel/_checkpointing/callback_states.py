"""The states of callbacks in training states: shared by all processes, or one per process.

A callback with ``state_dict()`` and ``load_state_dict(state)`` has a **shared** state, saved
by the main process and loaded on every process (the best value of a watched metric, EMA
weights, metrics computed from gathered predictions). A callback with ``rank_state_dict()``
and ``load_rank_state_dict(state)`` also has a **per-process** state, saved by every process
in its own file and loaded back on the same process (running sums of this process's batches,
its clocks). A callback may have either or both.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pytorch_accel.callback import TrainerCallback

__all__ = ["PER_PROCESS", "SHARED", "StateKind", "callback_states", "restore_callback_states"]


class StateKind(NamedTuple):
    """The pair of methods a callback defines for one kind of state."""

    save: str
    load: str
    label: str


SHARED = StateKind("state_dict", "load_state_dict", "state")
"""A state shared by all processes (saved by the main process)."""

PER_PROCESS = StateKind("rank_state_dict", "load_rank_state_dict", "per-process state")
"""A state of each process (saved by every process)."""


def _callback_keys(callbacks: Iterable[TrainerCallback], kind: StateKind) -> dict[str, Any]:
    """Key each callback with ``kind``'s methods by class name (``Name#2`` for a second one)."""
    keys: dict[str, Any] = {}
    for callback in callbacks:
        if not all(callable(getattr(callback, name, None)) for name in (kind.save, kind.load)):
            continue
        name = type(callback).__name__
        key, count = name, 1
        while key in keys:
            count += 1
            key = f"{name}#{count}"
        keys[key] = callback
    return keys


def callback_states(
    callbacks: Iterable[TrainerCallback], kind: StateKind = SHARED
) -> dict[str, Any]:
    """Return the ``kind`` state of every callback that has one, by key."""
    keyed = _callback_keys(callbacks, kind)
    return {key: getattr(callback, kind.save)() for key, callback in keyed.items()}


def restore_callback_states(
    callbacks: Iterable[TrainerCallback],
    states: Mapping[str, Any],
    source: Path,
    kind: StateKind = SHARED,
) -> None:
    """Load each saved ``kind`` state into the callback with the same key.

    A saved state without a matching callback, or a callback without a saved state, is
    reported with a warning (the callback starts fresh; nothing else is affected).
    """
    keyed = _callback_keys(callbacks, kind)
    for key, state in states.items():
        callback = keyed.pop(key, None)
        if callback is None:
            warnings.warn(
                f"The training state {str(source)!r} holds the {kind.label} of a {key} "
                "callback that this trainer does not have; it is ignored.",
                stacklevel=3,
            )
            continue
        getattr(callback, kind.load)(state)
    for key in keyed:
        warnings.warn(
            f"The training state {str(source)!r} has no {kind.label} for the {key} callback; "
            "it starts fresh.",
            stacklevel=3,
        )

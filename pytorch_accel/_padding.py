"""``predict(..., pad_value=...)``: outputs of varying sequence lengths padded to one length.

Each tensor of the batches' outputs (nested in lists, tuples and mappings, the same structure
in every batch) with a second dimension is padded at the end of that dimension, with
``pad_value``, to the longest of that output over all batches, so the batches concatenate on
the first. Across processes, each batch is padded before it is gathered
(``accelerator.pad_across_processes``, in the loop).
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pytorch_accel._checks import fail

__all__ = ["SEQUENCE_DIM", "check_pad_value", "pad_to_longest"]

SEQUENCE_DIM = 1
"""The dimension padded: the sequence dimension of batch-first outputs ``(batch, length, ...)``."""


def check_pad_value(value: object) -> None:
    """Refuse a ``pad_value`` that is not a real number.

    Raises:
        TypeError: Naming the argument, the value and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(
            TypeError,
            "Trainer.predict",
            "pad_value",
            value,
            "a number or None",
            "Pass the value to pad outputs of varying lengths with, e.g. pad_value=-100 or "
            "pad_value=float('nan'); None (the default) pads nothing.",
        )


def pad_to_longest(batches: list[Any], value: float) -> list[Any]:
    """Return ``batches`` with each output padded along ``SEQUENCE_DIM`` to its longest."""
    longest: dict[int, int] = {}
    for batch in batches:
        for index, leaf in enumerate(_tensors(batch)):
            if leaf.ndim > SEQUENCE_DIM:
                longest[index] = max(longest.get(index, 0), leaf.shape[SEQUENCE_DIM])

    def pad(index: int, leaf: torch.Tensor) -> torch.Tensor:
        if leaf.ndim <= SEQUENCE_DIM or leaf.shape[SEQUENCE_DIM] >= longest[index]:
            return leaf
        shape = list(leaf.shape)
        shape[SEQUENCE_DIM] = longest[index] - leaf.shape[SEQUENCE_DIM]
        return torch.cat([leaf, leaf.new_full(shape, value)], dim=SEQUENCE_DIM)

    return [_rebuild(batch, pad, itertools.count()) for batch in batches]


def _tensors(outputs: Any) -> Iterator[torch.Tensor]:
    """The tensors of nested lists, tuples and mappings, depth first."""
    if isinstance(outputs, torch.Tensor):
        yield outputs
    elif isinstance(outputs, Mapping):
        for item in outputs.values():
            yield from _tensors(item)
    elif isinstance(outputs, (list, tuple)):
        for item in outputs:
            yield from _tensors(item)


def _rebuild(
    outputs: Any, pad: Callable[[int, torch.Tensor], torch.Tensor], indices: Iterator[int]
) -> Any:
    """``outputs`` with each tensor replaced by ``pad(its index in _tensors order, tensor)``."""
    if isinstance(outputs, torch.Tensor):
        return pad(next(indices), outputs)
    if isinstance(outputs, Mapping):
        return type(outputs)({k: _rebuild(v, pad, indices) for k, v in outputs.items()})  # type: ignore[call-arg]
    if isinstance(outputs, (list, tuple)):
        items = [_rebuild(item, pad, indices) for item in outputs]
        return type(outputs)(*items) if hasattr(outputs, "_fields") else type(outputs)(items)
    return outputs

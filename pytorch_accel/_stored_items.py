"""Whether a dataset's items are stored or built at each read: the workers' default's probe.

``dataloaders.default_num_workers`` gives no workers to a dataset whose items are already in
memory; a ``TensorDataset`` or a stream is known without reading, any other dataset is read
here (its first item, twice).
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator, Mapping

import torch

__all__ = ["items_are_stored"]


def items_are_stored(dataset: object) -> bool:
    """Return whether ``dataset[0]`` read twice gives back the same objects.

    Tensors and NumPy arrays count as the same when they are views of the same memory (a
    ``TensorDataset`` returns new views of the tensors it holds), mappings and sequences when
    their members are, strings, numbers and ``None`` when equal, anything else when it is the
    same object. The two reads run with the random states of ``torch`` (CPU), ``random`` and
    NumPy saved and restored, so a random transform in ``__getitem__`` leaves no trace.

    Args:
        dataset: A map-style dataset (anything without ``__len__`` and ``__getitem__``, or
            empty, or whose first read raises, counts as not stored).

    Returns:
        Whether its items are stored rather than built at each read.
    """
    if not hasattr(dataset, "__getitem__"):
        return False
    try:
        if len(dataset) == 0:  # type: ignore[arg-type]
            return False
        with _random_states_kept():
            first = dataset[0]
            second = dataset[0]
    except Exception:  # a dataset indexed otherwise: its loader will say so, not this check
        return False
    return _same_item(first, second)


def _same_item(first: object, second: object) -> bool:
    if first is second:
        return True
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        return (
            first.device == second.device
            and first.shape == second.shape
            and first.dtype == second.dtype
            and first.numel() > 0
            and first.data_ptr() == second.data_ptr()
        )
    if isinstance(first, (str, bytes, int, float, complex)) or first is None:
        return type(first) is type(second) and first == second
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return first.keys() == second.keys() and all(
            _same_item(first[key], second[key]) for key in first
        )
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return len(first) == len(second) and all(
            _same_item(a, b) for a, b in zip(first, second, strict=True)
        )
    interface = getattr(first, "__array_interface__", None)
    other = getattr(second, "__array_interface__", None)
    if isinstance(interface, dict) and isinstance(other, dict):
        return bool(interface["data"][0]) and (
            interface["data"],
            interface["shape"],
            interface["typestr"],
        ) == (other["data"], other["shape"], other["typestr"])
    return False


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """Restore the random states of ``torch`` (CPU), ``random`` and NumPy (if loaded)."""
    numpy = sys.modules.get("numpy")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)

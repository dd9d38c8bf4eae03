"""The exchanges of logged values between processes, and what they refuse.

``read_reduced`` combines values across processes and reads them once; ``read_with_logged``
adds a span's logged values (``tracking.LoggedValues``) to an exchange made anyway, in a
section of a fixed size with a fingerprint of their names, so that processes which logged
different names raise (``refuse_different_names``) instead of combining by position or
waiting; ``refuse_negative_weights`` refuses the loss weights (token counts) that the epoch's
loss exchange found negative or NaN (issue 41).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from pytorch_accel.distributed import (
    gather_objects,
    gather_rows,
    group_size,
    reduce_across_processes,
)


class LoggedValues(Protocol):
    """What an exchange reads of a span's logged values (a ``tracking.LoggedValues``)."""

    capacity: list[int]

    def names(self) -> list[str]:
        """The names logged, with their reductions."""

    def fingerprint(self) -> int:
        """The same number on every process that logged the same names."""

    def parts(self) -> tuple[list[Any], list[str]]:
        """The values to exchange and the reduction of each."""


__all__ = [
    "DEFAULT_LOGGED_CAPACITY",
    "read_reduced",
    "read_with_logged",
    "reduction_dtype",
    "refuse_different_names",
    "refuse_negative_weights",
]


def reduction_dtype(device: torch.device) -> torch.dtype:
    """The dtype to sum metrics in on ``device``: float64, or float32 on MPS (which has none)."""
    return torch.float32 if device.type == "mps" else torch.float64


def read_reduced(
    parts: Sequence[Any], reductions: Sequence[str], device: torch.device
) -> list[float]:
    """Stack ``parts`` on ``device``, combine them across processes and read them: once each."""
    dtype = reduction_dtype(device)
    packed = torch.stack([torch.as_tensor(part).to(device, dtype) for part in parts])
    return reduce_across_processes(packed, reductions).tolist()


DEFAULT_LOGGED_CAPACITY = 16
"""The logged parts an interval's exchange has room for at first (a mean takes two)."""


def read_with_logged(
    parts: Sequence[Any], reductions: Sequence[str], logged: LoggedValues, device: torch.device
) -> list[float]:
    """Combine ``parts`` and a span's logged values across processes in one exchange; read once.

    Returns the combined ``parts``, then the logged values' combined ``parts()`` (what
    ``logged.results`` reads). With several processes the logged values travel in a section of
    a fixed size, with the names' fingerprint: the exchange matches whatever each process
    logged, and names that differ between processes raise (``refuse_different_names``) on
    every process instead of being combined by position. A section too small for what was
    logged (every process logs more than it holds) grows, with one more exchange, once.

    Args:
        parts: This process's values, the same names on every process.
        reductions: How each of ``parts`` combines (``REDUCTIONS``).
        logged: The span's logged values (``LoggedValues.take()``).
        device: Where the values are combined.
    """
    logged_parts, logged_reductions = logged.parts()
    size = group_size()
    if size == 1:
        return read_reduced([*parts, *logged_parts], [*reductions, *logged_reductions], device)
    capacity = logged.capacity[0]
    count = len(logged_parts)
    section = logged_parts if count <= capacity else []
    section = [*section, *[0.0] * (capacity - len(section))]
    header = [logged.fingerprint(), count]
    dtype = reduction_dtype(device)
    row = torch.stack(
        [torch.as_tensor(part).to(device, dtype) for part in [*parts, *header, *section]]
    )
    rows = gather_rows(row)  # the one exchange and host read
    combined = _combined(rows, reductions, 0)
    start = len(parts)
    fingerprints = [int(row[start]) for row in rows]
    if len(set(fingerprints)) > 1:
        refuse_different_names(logged, fingerprints, "logging interval")
    if count > capacity:  # every process logged as many (the names agree): room for them
        logged.capacity[0] = count
        return combined + read_reduced(logged_parts, logged_reductions, device)
    return combined + _combined(rows, logged_reductions, start + 2)


def _combined(rows: list[list[float]], reductions: Sequence[str], start: int) -> list[float]:
    """Combine the processes' ``rows`` from column ``start`` on, each column by its reduction."""
    combined = []
    for column, reduction in enumerate(reductions, start):
        values = [row[column] for row in rows]
        if reduction == "max":
            combined.append(max(values))
        elif reduction == "min":
            combined.append(min(values))
        else:
            total = math.fsum(values)
            combined.append(total / len(values) if reduction == "mean" else total)
    return combined


def refuse_different_names(logged: LoggedValues, fingerprints: Sequence[int], span: str) -> None:
    """Raise on every process: the processes logged different names (or reductions) in a span.

    Every process calls it at the same point (their fingerprints disagree on every one): one
    more collective gathers each process's names, for the message.

    Raises:
        ValueError: Naming the names each process logged.
    """
    gathered = gather_objects(logged.names())
    per_process = "; ".join(
        f"process {rank} logged {', '.join(names) if names else 'nothing'}"
        for rank, names in enumerate(gathered)
    )
    raise ValueError(
        f"Trainer.log: the processes logged different metrics in one {span}: {per_process}. "
        "Values are combined across processes name by name, so every process must log the "
        "same names, with the same reduction, in each epoch and logging interval. Log each "
        "name on every process: where a process has nothing to report, log it with weight 0 "
        "(e.g. trainer.log('rare_event', 0.0, weight=0) for a mean; 0.0 for reduce='sum')."
    )


def refuse_negative_weights(smallest: Sequence[float], kind: str, loss_name: str) -> None:
    """Raise on every process if a loss weight of the epoch was negative or NaN (per process)."""
    bad = [
        f"process {rank}: {value}" if len(smallest) > 1 else str(value)
        for rank, value in enumerate(smallest)
        if not value >= 0
    ]
    if bad:
        where = "Trainer.train" if kind == "train" else "Trainer.evaluate"
        raise ValueError(
            f"{where}: batch_output['num_items'] (a dict batch's 'num_items_in_batch'), the "
            f"count each batch's loss is weighted by, must be at least 0; the smallest in this "
            f"{kind} epoch ({loss_name}) was {', '.join(bad)}. Return the number of loss "
            "elements the batch's loss is the mean of, e.g. (labels != -100).sum() for a token "
            "loss (a tensor 'batch_size' is checked the same way)."
        )

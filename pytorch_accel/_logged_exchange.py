"""What ``Trainer.log`` takes, and how logged values cross processes; used once something is logged.

``checked_metrics`` (with ``check_weight`` and ``checked_value``) checks what is logged, and
``batch_output_scalars`` picks what a step's ``batch_output`` logs; ``read_with_logged`` adds a
span's logged values (``tracking.LoggedValues``) to an exchange made anyway, in a section of a
fixed size with a fingerprint of their names, so that processes which logged different names raise
(``refuse_different_names``) instead of combining by position or waiting. The epoch's exchange
also carries each process's smallest loss weight: ``refuse_negative_weights`` raises for one
below 0 or NaN.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from pytorch_accel._checks import fail
from pytorch_accel.distributed import (
    REDUCTIONS,
    gather_objects,
    gather_rows,
    group_size,
    read_reduced,
    reduction_dtype,
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

    def reduction_of(self, name: str) -> str | None:
        """The reduction ``name`` was logged with in the span, or ``None``."""


__all__ = [
    "BATCH_OUTPUT_KEYS",
    "DEFAULT_LOGGED_CAPACITY",
    "batch_output_scalars",
    "check_weight",
    "checked_metrics",
    "checked_value",
    "read_with_logged",
    "refuse_different_names",
    "refuse_negative_weights",
]


BATCH_OUTPUT_KEYS = frozenset(
    {"loss", "model_outputs", "batch_size", "num_items", "num_items_in_batch"}
)
"""The keys of a step's ``batch_output`` that are never logged as metrics."""

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


def check_weight(where: str, weight: object) -> None:
    """Refuse a weight that is not a number at least 0 (a tensor's value is not read)."""
    fix = "Pass e.g. weight=batch_size (weight=0 for a process with nothing to report)."
    if isinstance(weight, torch.Tensor):
        if weight.numel() != 1 or weight.is_complex():
            fail(ValueError, where, "weight", weight, "a one-element tensor or a number", fix)
        return
    if type(weight) is not int and (
        isinstance(weight, bool) or not isinstance(weight, numbers.Real)
    ):
        fail(TypeError, where, "weight", weight, "a number", fix)
    if not float(weight) >= 0 or not math.isfinite(weight):  # NaN fails both
        fail(ValueError, where, "weight", weight, "a finite number at least 0", fix)


def checked_value(where: str, name: object, value: object, device: torch.device) -> Any:
    """``value`` as logged: a detached one-element tensor, or a float on ``device``."""
    if type(name) is not str or not name:
        fail(
            TypeError if not isinstance(name, str) else ValueError,
            where,
            "name",
            name,
            "a non-empty str",
            "Pass e.g. trainer.log('aux_loss', aux).",
        )
    if name == "loss":
        fail(
            ValueError,
            where,
            "name",
            name,
            "a name other than 'loss'",
            "The trainer records the loss itself (train_loss_epoch, eval_loss_epoch); log a "
            "part of it under its own name, e.g. 'main_loss'.",
        )
    if isinstance(value, torch.Tensor):
        if (value.ndim and value.numel() != 1) or value.is_complex():
            fail(
                ValueError,
                where,
                name,
                value,
                "a real scalar (a one-element tensor)",
                "Reduce it first, e.g. value.mean(), or log each element under its own name.",
            )
        return value.data
    if isinstance(value, numbers.Real):
        return torch.full((), float(value), device=device)
    fail(TypeError, where, name, value, "a number or a one-element tensor", "Log a scalar.")


def checked_metrics(
    where: str,
    metrics: object,
    reduce: str,
    weight: object,
    span: LoggedValues,
    device: torch.device,
) -> Iterator[tuple[str, Any]]:
    """Yield the ``(name, value)`` pairs of a ``Trainer.log`` call, each once it is checked.

    Raises:
        TypeError: If ``metrics`` is not a mapping, a name not a string, a value not a real
            number or one-element tensor, or ``weight`` not a number or tensor.
        ValueError: If ``reduce`` is unknown, a name empty, a tensor has several elements,
            or a name was logged in ``span`` with another reduction.
    """
    if type(metrics) is not dict and not isinstance(metrics, Mapping):
        fail(TypeError, where, "metrics", metrics, "a dict", "Pass e.g. {'aux_loss': aux}.")
    if reduce not in REDUCTIONS:
        fail(ValueError, where, "reduce", reduce, f"one of {REDUCTIONS}", "Pass reduce='mean'.")
    check_weight(where, weight)
    for name, value in metrics.items():
        checked = checked_value(where, name, value, device)
        logged = span.reduction_of(name)
        if logged is not None and logged != reduce:
            fail(
                ValueError,
                where,
                "reduce",
                reduce,
                f"{logged!r}, as {name!r} was logged",
                "Log each name with one reduction, or log the other under another name.",
            )
        yield name, checked


def batch_output_scalars(
    batch_output: Mapping[str, Any], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """The extra floating-point scalars of a step's ``batch_output``, logged by batch size.

    Skipped: ``BATCH_OUTPUT_KEYS``, names starting with ``_``, and anything that is not a
    0-dimensional floating-point tensor or a Python float (counts, outputs, lists).
    """
    for name, value in batch_output.items():
        if name in BATCH_OUTPUT_KEYS or not isinstance(name, str) or name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            if not value.ndim and value.is_floating_point():
                yield name, value.data
        elif type(value) is float:
            yield name, torch.full((), value, device=device)


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

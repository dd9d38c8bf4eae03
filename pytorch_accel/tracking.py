"""What a run reports: run history, loss tracking, logged values and the package's logger.

Run history holds the metrics per epoch; the loss tracker and ``Trainer.log``'s values stay on
the device until an epoch ends.

**The package's logger**, ``logging.getLogger("pytorch_accel")``: rank-aware, set up lazily.
Everything the built-in callbacks say goes through this one named logger, so that a user can
silence it (``logging.getLogger("pytorch_accel").setLevel(logging.WARNING)``), redirect it
(add a handler of their own) or format it (configure logging before training).

Nothing happens at import. When a run starts, the callbacks that log call ``setup_logging``,
which, the first time, keeps records from every process but the main one (a filter on the
logger) and sets the logger's level to ``INFO`` if nobody set one; and, each time, if neither
this logger nor the root logger has a handler (a plain script that configured no logging),
adds one that writes the bare message to standard output. A program that configured logging
(``logging.basicConfig(...)``, a handler on the root or on this logger) gets no extra handler:
its own handlers show the lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import numbers
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import torch
from accelerate.utils import send_to_device

from pytorch_accel._logged_exchange import (
    BATCH_OUTPUT_KEYS,
    DEFAULT_LOGGED_CAPACITY,
    batch_output_scalars,
    checked_metrics,
    read_with_logged,
    refuse_different_names,
    refuse_negative_weights,
)
from pytorch_accel.distributed import (
    group_size,
    process_rank,
    read_reduced,
    reduction_dtype,
)

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = [
    "BATCH_OUTPUT_KEYS",
    "CONSOLE_HANDLER_NAME",
    "LOGGER_NAME",
    "TRAIN_LOSS_NAME",
    "InMemoryRunHistory",
    "LoggedMetrics",
    "LoggedValues",
    "LossTracker",
    "MainProcessFilter",
    "MetricCursor",
    "MetricNotFoundError",
    "RunHistory",
    "get_logger",
    "is_main_process",
    "logged_name",
    "read_reduced",
    "read_with_logged",
    "reduction_dtype",
    "reported_float",
    "setup_logging",
]


class MetricNotFoundError(KeyError, ValueError):
    """A metric was read that has never been recorded.

    It is both a ``KeyError`` (the natural type for a missing name) and a ``ValueError`` (what
    pytorch-accelerated raised), so existing ``except`` clauses keep working.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RunHistory(ABC):
    """The interface of a trainer's run history: metric values recorded per epoch."""

    @abstractmethod
    def get_metric_names(self) -> set[str]:
        """Return the names of all recorded metrics."""

    @abstractmethod
    def get_metric_values(self, metric_name: str) -> Sequence[Any]:
        """Return every value recorded for ``metric_name``, oldest first.

        Raises:
            MetricNotFoundError: If nothing was recorded under that name.
        """

    @abstractmethod
    def get_latest_metric(self, metric_name: str) -> Any:
        """Return the most recent value of ``metric_name``.

        Raises:
            MetricNotFoundError: If nothing was recorded under that name.
        """

    @abstractmethod
    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Record a value of ``metric_name`` (the current prefix is prepended)."""

    @abstractmethod
    def set_metric_name_prefix(self, prefix: str = "") -> None:
        """Set the prefix prepended to names passed to ``update_metric``."""

    @property
    @abstractmethod
    def metric_name_prefix(self) -> str:
        """The prefix prepended to names passed to ``update_metric``."""

    @abstractmethod
    def delete_metric(self, metric_name: str) -> None:
        """Delete every value of ``metric_name``."""

    @contextlib.contextmanager
    def prefixed(self, prefix: str, *, replace: bool = False) -> Iterator[None]:
        """Record under ``prefix`` inside the block, then restore the prefix (also on errors).

        Args:
            prefix: Added after the current prefix (``val_`` inside ``evaluation_``: metrics
                named ``evaluation_val_...``).
            replace: Use ``prefix`` alone instead of adding it to the current one.
        """
        outer = self.metric_name_prefix
        self.set_metric_name_prefix(prefix if replace else outer + prefix)
        try:
            yield
        finally:
            self.set_metric_name_prefix(outer)

    @property
    @abstractmethod
    def current_epoch(self) -> int:
        """The 1-based number of the epoch in progress (or about to start)."""

    @abstractmethod
    def _increment_epoch(self) -> None:
        """Advance ``current_epoch`` by one (called by the trainer after each epoch)."""

    @abstractmethod
    def _set_epoch(self, epoch: int) -> None:
        """Set ``current_epoch`` (used when resuming)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every metric and set the epoch back to 1."""

    def state_dict(self) -> dict[str, Any]:
        """Return every metric's values and the current epoch (saved in training states)."""
        metrics = {name: list(self.get_metric_values(name)) for name in self.get_metric_names()}
        return {"metrics": metrics, "current_epoch": self.current_epoch}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the history with one returned by ``state_dict`` (the prefix is kept)."""
        self.reset()
        with self.prefixed("", replace=True):
            for name, values in state_dict["metrics"].items():
                for value in values:
                    self.update_metric(name, value)
        self._set_epoch(int(state_dict["current_epoch"]))


class InMemoryRunHistory(RunHistory):
    """A ``RunHistory`` that keeps every value in memory.

    Reading a metric that was never recorded raises ``MetricNotFoundError``, naming the
    metrics that exist, and creates nothing.
    """

    def __init__(self) -> None:
        self._current_epoch = 1
        self._metrics: dict[str, list[Any]] = {}
        self._prefix = ""

    def get_metric_names(self) -> set[str]:
        """Return the names of all recorded metrics."""
        return set(self._metrics)

    def get_metric_values(self, metric_name: str) -> list[Any]:
        """Return every value recorded for ``metric_name``, oldest first."""
        return list(self._values(metric_name))

    def get_latest_metric(self, metric_name: str) -> Any:
        """Return the most recent value of ``metric_name``."""
        return self._values(metric_name)[-1]

    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Record a value of ``metric_name`` (the current prefix is prepended)."""
        self._metrics.setdefault(f"{self._prefix}{metric_name}", []).append(metric_value)

    def set_metric_name_prefix(self, prefix: str = "") -> None:
        """Set the prefix prepended to names passed to ``update_metric``."""
        self._prefix = prefix

    @property
    def metric_name_prefix(self) -> str:
        """The prefix prepended to names passed to ``update_metric``."""
        return self._prefix

    def delete_metric(self, metric_name: str) -> None:
        """Delete every value of ``metric_name``.

        Raises:
            MetricNotFoundError: If nothing was recorded under that name.
        """
        self._values(metric_name)
        del self._metrics[metric_name]

    @property
    def current_epoch(self) -> int:
        """The 1-based number of the epoch in progress (or about to start)."""
        return self._current_epoch

    def _increment_epoch(self) -> None:
        self._current_epoch += 1

    def _set_epoch(self, epoch: int) -> None:
        self._current_epoch = epoch

    def reset(self) -> None:
        """Forget every metric and set the epoch back to 1."""
        self._current_epoch = 1
        self._metrics = {}

    def _values(self, metric_name: str) -> list[Any]:
        values = self._metrics.get(metric_name)
        if not values:
            known = ", ".join(sorted(self._metrics)) or "none yet"
            raise MetricNotFoundError(
                f"No values have been recorded for the metric {metric_name!r}. "
                f"Recorded metrics: {known}."
            )
        return values


class MetricCursor:
    """Reads the run-history metrics recorded since it last read, once each.

    Used by callbacks that log or send metrics at the end of a phase, so that every value is
    reported exactly once, whatever recorded it.
    """

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def skip_to_end(self, history: RunHistory) -> None:
        """Treat every value recorded so far as already read."""
        self._seen = {
            name: len(history.get_metric_values(name)) for name in history.get_metric_names()
        }

    def read_new(self, history: RunHistory) -> dict[str, Any]:
        """Return the latest value of each metric that gained values, by name; mark them read."""
        new = {}
        for name in sorted(history.get_metric_names()):
            count = len(history.get_metric_values(name))
            if count > self._seen.get(name, 0):
                self._seen[name] = count
                new[name] = history.get_latest_metric(name)
        return new


class LossTracker:
    """Accumulates a sample-weighted loss on the loss's device, without host synchronisation.

    ``update`` only keeps a detached reference to each batch loss; every ``fold_every``
    batches (and whenever ``total_loss`` is read) they are folded into the sum with one
    ``stack`` and one ``dot`` on the device. The mean is read once, by ``reduce`` (across
    processes) or ``average`` (this process), typically at the end of an epoch.

    Attributes:
        fold_every: How many batch losses are kept before they are folded into the sum.
    """

    fold_every = 256

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._total: torch.Tensor | None = None
        self._folded_count: int | torch.Tensor = 0
        self._last_folded: torch.Tensor | None = None
        self._pending: list[tuple[torch.Tensor, int | torch.Tensor]] = []
        self._smallest_weight: torch.Tensor | None = None

    def update(
        self, loss_batch_value: torch.Tensor | float, batch_size: int | torch.Tensor = 1
    ) -> None:
        """Add one batch: its mean loss and the number of samples it holds (a reference only).

        Args:
            loss_batch_value: The batch's mean loss (a scalar tensor; a tensor of per-sample
                losses is averaged; a Python number is accepted, on the CPU).
            batch_size: The number of samples the loss was averaged over.
        """
        # ``.data`` is ``detach()`` without the trip through the dispatcher; the value is only
        # ever read, so nothing needs the version counter ``detach()`` would share.
        try:
            value = loss_batch_value.data  # type: ignore[union-attr]
        except AttributeError:  # a Python number (``loss.item()``), as ported code passes
            value = torch.tensor(float(loss_batch_value))
        if value.ndim:
            value = value.mean()
        pending = self._pending
        pending.append((value, batch_size))
        if len(pending) >= self.fold_every:
            self._fold()

    @property
    def loss_value(self) -> torch.Tensor | None:
        """The last loss passed to ``update`` (a detached tensor), or ``None``."""
        return self._pending[-1][0] if self._pending else self._last_folded

    @property
    def running_count(self) -> int | torch.Tensor:
        """The running number of samples (an int, or a tensor if batch sizes were tensors)."""
        return sum((size for _, size in self._pending), self._folded_count)

    def state_dict(self) -> dict[str, Any]:
        """Return the running sums, on the CPU (saved in training states)."""
        state = {
            "loss_value": self.loss_value,
            "running_count": self.running_count,
            "total": self._total,
            "pending": [value for value, _ in self._pending],
            "pending_sizes": [size for _, size in self._pending],
        }
        return send_to_device(state, torch.device("cpu"))  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: Mapping[str, Any], device: torch.device) -> None:
        """Restore the sums saved by ``state_dict`` on ``device``, the losses' device."""
        state = send_to_device(dict(state_dict), device)
        self._pending = list(zip(state["pending"], state["pending_sizes"], strict=True))
        self._total = state["total"]
        self._folded_count = state["running_count"] - sum(state["pending_sizes"])
        self._last_folded = state["loss_value"]

    @property
    def smallest_weight(self) -> torch.Tensor | None:
        """The smallest tensor weight (``batch_size``, a ``num_items`` count) so far, or ``None``.

        On the device, read where the epoch's loss is (``LoggedMetrics.end_epoch``); ``None``
        when every weight was a Python int (checked where it was returned).
        """
        if self._pending:
            self._fold()
        return self._smallest_weight

    @property
    def total_loss(self) -> torch.Tensor | None:
        """The running sum of ``loss * batch_size`` on the device, or ``None`` before any batch."""
        if self._pending:
            self._fold()
        return self._total

    def _fold(self) -> None:
        """Add the pending losses, weighted by their batch sizes, to the running sum."""
        pending = self._pending
        values = torch.stack([value for value, _ in pending])
        values = values.to(torch.promote_types(values.dtype, torch.float32))
        sizes = [size for _, size in pending]
        if not all(type(size) is int for size in sizes):  # counts on the device: keep the least
            least = _as_device_tensor(sizes, values).amin()  # NaN if any is NaN
            smallest = self._smallest_weight
            self._smallest_weight = least if smallest is None else torch.minimum(smallest, least)
        self._total = self._folded(values, sizes)
        self._folded_count = sum(sizes, self._folded_count)
        self._last_folded, self._pending = pending[-1][0], []

    def _folded(self, values: torch.Tensor, sizes: list[int | torch.Tensor]) -> torch.Tensor:
        """The running sum with ``values`` added, weighted by ``sizes``."""
        if all(isinstance(size, int) and size == sizes[0] for size in sizes):
            folded = values.sum() * sizes[0]  # the usual case: nothing to copy to the device
        else:
            folded = torch.dot(values, _as_device_tensor(sizes, values))
        # Out of place: a state_dict() taken earlier may hold this very tensor (on the CPU).
        return folded if self._total is None else self._total + folded

    @property
    def average(self) -> float:
        """The sample-weighted mean over this process's batches (synchronises with the device)."""
        if self.total_loss is None:
            return float("nan")
        return float(self.total_loss / self.running_count)

    def reduce(self, accelerator: Accelerator) -> float:
        """Return the sample-weighted mean over every process's batches (``nan`` if none).

        One collective and one host read for the whole epoch.

        Args:
            accelerator: The accelerator whose processes take part.
        """
        total = 0.0 if self.total_loss is None else self.total_loss
        parts = [total, self.running_count]
        loss_sum, count_sum = read_reduced(parts, ("sum", "sum"), accelerator.device)
        return loss_sum / count_sum if count_sum else float("nan")


class _ExtremeTracker(LossTracker):
    """A ``LossTracker`` whose running value is the largest (or smallest) value, not a sum."""

    def __init__(self, reduction: str) -> None:
        super().__init__()
        self._combine = torch.maximum if reduction == "max" else torch.minimum
        self._extreme = torch.amax if reduction == "max" else torch.amin

    def _folded(self, values: torch.Tensor, sizes: list[int | torch.Tensor]) -> torch.Tensor:
        folded = self._extreme(values)
        return folded if self._total is None else self._combine(self._total, folded)


def _tracker(reduction: str) -> LossTracker:
    """The on-device tracker of a value logged with ``reduction``."""
    return LossTracker() if reduction in ("mean", "sum") else _ExtremeTracker(reduction)


class LoggedValues:
    """The values logged under each name over one span (an epoch, a logging interval).

    Each name keeps an on-device tracker of its reduction: a ``LossTracker`` (a weighted sum
    and the sum of the weights) for ``"mean"`` and ``"sum"``, the running extreme for
    ``"max"`` and ``"min"``; nothing is read on the host until the span is reduced.

    Args:
        capacity: The logged parts an exchange has room for (``read_with_logged``), in a list
            shared by the spans of one series (the step logging's intervals) and grown at the
            same exchange on every process; by default a list of its own.

    Attributes:
        capacity: That list.
    """

    def __init__(self, capacity: list[int] | None = None) -> None:
        self._trackers: dict[str, tuple[str, LossTracker]] = {}
        self.capacity = [DEFAULT_LOGGED_CAPACITY] if capacity is None else capacity

    def __len__(self) -> int:
        return len(self._trackers)

    def names(self) -> list[str]:
        """The names logged in this span, each with its reduction (``"a (mean)"``), sorted."""
        return [
            f"{name!r} ({reduction})" for name, (reduction, _) in sorted(self._trackers.items())
        ]

    def fingerprint(self) -> int:
        """A number that tells the names and reductions of this span apart (0: nothing logged).

        The same on every process that logged the same names with the same reductions (below
        2**48, so exact in a float64 exchange).
        """
        if not self._trackers:
            return 0
        digest = hashlib.blake2b("\n".join(self.names()).encode(), digest_size=6).digest()
        return int.from_bytes(digest, "big") | 1

    @property
    def num_parts(self) -> int:
        """How many values ``parts`` returns: two for a mean (total, weight), else one."""
        return sum(2 if reduction == "mean" else 1 for reduction, _ in self._trackers.values())

    def reduction_of(self, name: str) -> str | None:
        """The reduction ``name`` was logged with in this span, or ``None``."""
        entry = self._trackers.get(name)
        return None if entry is None else entry[0]

    def update(self, name: str, value: torch.Tensor, reduction: str, weight: Any) -> None:
        """Add one value of ``name`` (a one-element tensor), with its weight (for a mean)."""
        entry = self._trackers.get(name)
        if entry is None:
            entry = self._trackers[name] = (reduction, _tracker(reduction))
        entry[1].update(value, weight)

    def state_dict(self) -> dict[str, Any]:
        """Return each name's reduction and tracker state, on the CPU (for training states)."""
        return {
            name: {"reduction": reduction, "tracker": tracker.state_dict()}
            for name, (reduction, tracker) in self._trackers.items()
        }

    def load_state_dict(self, state: Mapping[str, Any], device: torch.device) -> None:
        """Replace the values with those ``state_dict`` returned, on ``device``."""
        self._trackers = {}
        for name, saved in state.items():
            tracker = _tracker(saved["reduction"])
            tracker.load_state_dict(saved["tracker"], device)
            self._trackers[name] = (saved["reduction"], tracker)

    def take(self) -> LoggedValues:
        """Return the values logged so far and start the span afresh."""
        taken = LoggedValues(self.capacity)
        taken._trackers, self._trackers = self._trackers, {}
        return taken

    def parts(self) -> tuple[list[Any], list[str]]:
        """The span's totals, by name, and how each combines across processes."""
        parts: list[Any] = []
        reductions: list[str] = []
        for _, (reduction, tracker) in sorted(self._trackers.items()):
            total = tracker.total_loss
            assert total is not None
            parts.append(total)
            reductions.append("sum" if reduction == "mean" else reduction)
            if reduction == "mean":
                parts.append(tracker.running_count)
                reductions.append("sum")
        return parts, reductions

    def results(self, values: Sequence[float]) -> dict[str, float]:
        """The value of each name, from the combined ``parts`` (in their order)."""
        numbers_in_order = iter(values)
        results = {}
        for name, (reduction, _) in sorted(self._trackers.items()):
            value = next(numbers_in_order)
            if reduction == "mean":
                count = next(numbers_in_order)
                value = value / count if count else math.nan
            results[name] = value
        return results

    def reduce(self, device: torch.device) -> dict[str, float]:
        """Combine the span's values across processes (one collective) and read them once."""
        return self.results(read_reduced(*self.parts(), device))


TRAIN_LOSS_NAME = "train_loss_epoch"
"""The run-history name of a training epoch's mean loss."""


def logged_name(loss_name: str, name: str) -> str:
    """The run-history name of a value logged as ``name`` in an epoch whose loss is ``loss_name``.

    The loss's name with its first ``loss`` replaced by ``name`` (``train_loss_epoch``:
    ``train_<name>_epoch``; ``evaluate()``'s ``loss``: ``<name>``); ``<loss_name>_<name>``
    if it has no ``loss``.
    """
    return loss_name.replace("loss", name, 1) if "loss" in loss_name else f"{loss_name}_{name}"


class LoggedMetrics:
    """What ``Trainer.log`` and the steps' extra ``batch_output`` values logged, on the device.

    Inside a train or eval epoch (``start_epoch`` to ``end_epoch``, nested for an evaluation
    run inside a training epoch) each value is added to the epoch's ``LoggedValues``, which
    ``end_epoch`` reduces across processes (one collective) and records under its
    ``logged_name``; training values also go to each interval opened with ``open_interval``
    (read by the step-logging callbacks). Outside an epoch a value is recorded at once.
    """

    def __init__(self) -> None:
        self._intervals: list[LoggedValues] = []
        self._epochs: list[tuple[str, LoggedValues]] = []
        self._interval_capacity = [DEFAULT_LOGGED_CAPACITY]  # shared by the intervals

    def reset(self) -> None:
        """Forget every span (at the start of a training run)."""
        self._intervals, self._epochs = [], []

    @property
    def in_training_epoch(self) -> bool:
        """Whether the innermost epoch is a training epoch (its values join the intervals)."""
        return bool(self._epochs) and self._epochs[-1][0] == TRAIN_LOSS_NAME

    def state_dict(self) -> dict[str, Any]:
        """The values of the training epoch in progress (a training state saved mid-epoch)."""
        return self._epochs[-1][1].state_dict() if self.in_training_epoch else {}

    def load_state_dict(self, state: Mapping[str, Any] | None, device: torch.device) -> None:
        """Continue the training epoch in progress from ``state_dict`` (``None``: nothing)."""
        if state and self.in_training_epoch:
            self._epochs[-1][1].load_state_dict(state, device)

    def open_interval(self) -> LoggedValues:
        """Return a span that receives every training value from now on (``take`` reads it)."""
        interval = LoggedValues(self._interval_capacity)
        self._intervals.append(interval)
        return interval

    def start_epoch(self, loss_name: str) -> None:
        """Start collecting the values of an epoch whose mean loss is recorded as ``loss_name``."""
        self._epochs.append((loss_name, LoggedValues()))

    def end_epoch(self, history: RunHistory, device: torch.device, loss: LossTracker) -> None:
        """Record the epoch's mean loss, then its logged values under their ``logged_name``.

        The loss's exchange (one collective, as every epoch has) also carries each process's
        fingerprint of the names it logged (``LoggedValues.fingerprint``), so that the
        processes agree on whether anything was logged and on what, before the values'
        exchange (one collective, only if something was): names logged on some processes
        only, or other names on each, raise ``ValueError`` on every process
        (``refuse_different_names``) instead of waiting or combining by position.

        Args:
            history: Where the values are recorded.
            device: Where they are combined.
            loss: The epoch's loss tracker; its mean is recorded under the epoch's loss name.
        """
        loss_name, values = self._epochs.pop()
        kind = "train" if loss_name == TRAIN_LOSS_NAME else "eval"
        total = loss.total_loss
        smallest = loss.smallest_weight
        # one slot per process for what is checked: their sum is every process's value
        size = group_size()
        rank = process_rank()
        fingerprints: list[Any] = [0] * size
        fingerprints[rank] = values.fingerprint()
        weights: list[Any] = [0.0] * size
        weights[rank] = math.inf if smallest is None else smallest
        parts = [0.0 if total is None else total, loss.running_count, *fingerprints, *weights]
        combined = read_reduced(parts, ["sum"] * len(parts), device)
        if not all(value >= 0 for value in combined[2 + size :]):  # NaN included
            refuse_negative_weights(combined[2 + size :], kind, loss_name)
        loss_sum, count = combined[:2]
        history.update_metric(loss_name, loss_sum / count if count else math.nan)
        fingerprints = [int(value) for value in combined[2 : 2 + size]]
        if len(set(fingerprints)) > 1:
            refuse_different_names(values, fingerprints, f"{kind} epoch ({loss_name})")
        if fingerprints[0]:
            for name, value in values.reduce(device).items():
                history.update_metric(logged_name(loss_name, name), value)

    def log(
        self,
        metrics: Mapping[str, Any],
        reduce: str,
        weight: Any,
        history: RunHistory,
        device: torch.device,
        where: str = "Trainer.log",
    ) -> None:
        """Log each value of ``metrics``, checked first (``_logged_exchange.checked_metrics``)."""
        values = self._epochs[-1][1] if self._epochs else LoggedValues()
        for name, value in checked_metrics(where, metrics, reduce, weight, values, device):
            self._add(values, name, value, reduce, weight)
        if not self._epochs:  # between epochs: reduced and recorded now
            for name, value in values.reduce(device).items():
                history.update_metric(name, value)

    def log_batch_output(self, batch_output: Mapping[str, Any], device: torch.device) -> None:
        """Log the extra scalars of a step's ``batch_output`` (``batch_output_scalars``)."""
        if not self._epochs:
            return
        values, weight = self._epochs[-1][1], batch_output["batch_size"]
        for name, value in batch_output_scalars(batch_output, device):
            if values.reduction_of(name) in (None, "mean"):
                self._add(values, name, value, "mean", weight)

    def _add(self, values: LoggedValues, name: str, value: Any, reduce: str, weight: Any) -> None:
        """Add a value to ``values`` and, in a training epoch, to each open interval."""
        for span in [values, *(self._intervals if self.in_training_epoch else ())]:
            span.update(name, value, reduce, weight)


def _as_device_tensor(sizes: list[int | torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Batch sizes as a tensor on ``like``'s device, without making the host wait for it."""
    if all(isinstance(size, int) for size in sizes):
        host = torch.tensor(sizes, dtype=like.dtype)
        if like.device.type == "cuda":
            return host.pin_memory().to(like.device, non_blocking=True)
        return host.to(like.device)
    return torch.stack([torch.as_tensor(size, device=like.device) for size in sizes]).to(like.dtype)


def reported_float(value: Any) -> float | None:
    """The value as a float if it is a real number (or a one-element tensor), else ``None``."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


LOGGER_NAME = "pytorch_accel"
"""The name of the package's logger."""

CONSOLE_HANDLER_NAME = "pytorch_accel.console"
"""The name of the handler ``setup_logging`` adds (``handler.get_name()``)."""


def get_logger() -> logging.Logger:
    """Return the package's logger, ``logging.getLogger("pytorch_accel")`` (sets nothing up)."""
    return logging.getLogger(LOGGER_NAME)


class MainProcessFilter(logging.Filter):
    """Let records through on the main process only (of the whole run, see ``is_main_process``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Return whether this process is the main one."""
        return is_main_process()


def is_main_process() -> bool:
    """Return whether this is the run's main process (rank 0).

    accelerate's ``is_main_process`` once an ``Accelerator`` exists, else ``RANK == 0``.
    """
    from accelerate.state import PartialState

    if PartialState._shared_state:  # initialised: ask accelerate (no collective involved)
        return bool(PartialState().is_main_process)
    rank = os.environ.get("RANK", "0")
    return not rank.isdigit() or int(rank) == 0


class _StandardOutputHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stdout`` is when a record is emitted (it may be redirected)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.set_name(CONSOLE_HANDLER_NAME)

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass


def setup_logging() -> logging.Logger:
    """Make the package's logger show its ``INFO`` lines on the main process (see the module).

    Idempotent and cheap: the callbacks that log call it when each run starts. Returns the logger.
    """
    logger = get_logger()
    if not any(isinstance(existing, MainProcessFilter) for existing in logger.filters):
        logger.addFilter(MainProcessFilter())
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(_StandardOutputHandler())
    return logger

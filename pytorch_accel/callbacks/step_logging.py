"""Step-level metrics every N optimizer updates: loss, learning rates, gradient norm, speed.

``StepMetrics`` collects them; ``StepLoggingCallback`` logs them (to the console by default);
``TrackingCallback`` builds on it to send them to the experiment trackers and a CSV file.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from accelerate.utils import send_to_device

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks.defaults import SEPARATOR, format_metrics
from pytorch_accel.checks import check_bool, check_positive_int
from pytorch_accel.distributed import group_size
from pytorch_accel.tracking import (
    LoggedValues,
    LossTracker,
    get_logger,
    logged_name,
    read_with_logged,
    reduction_dtype,
    setup_logging,
)

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = [
    "DEFAULT_LOG_EVERY_N_UPDATES",
    "FLUSH_EVERY_N_UPDATES",
    "StepLoggingCallback",
    "StepMetrics",
]

DEFAULT_LOG_EVERY_N_UPDATES = 50
"""The default logging interval, in optimizer updates (HF's ``logging_steps`` and Lightning's
``log_every_n_steps`` default to 500 and 50)."""

FLUSH_EVERY_N_UPDATES = 32
"""Logging points are read on the host together once they span this many updates.

At the default interval (50) every point is read at once; logging every update reads once
every 32 updates. The points are also read at each epoch's end, at the run's end, when a
training state is saved, and (in one process) on an exception.
"""


class _Mark(NamedTuple):
    """The trainer's running loss at one moment, as ``LossTracker.position`` gives it.

    What was recorded before it: ``total`` (``None``: nothing) and ``count``, plus the first
    ``length`` batches of ``batches`` (``None``: none).
    """

    total: Any
    count: Any
    batches: list[tuple[torch.Tensor, Any]] | None
    length: int


def _mark_of(tracker: LossTracker) -> _Mark:
    """Where the tracker's running sums are, without folding them or any device work.

    Its folded sum and count, and the list of batches recorded since with its length now: a
    fold starts a new list and a list is only ever appended to, so that prefix stays as it is.
    """
    pending = tracker._pending  # the tracker's own fields: read here, never changed
    return tuple.__new__(_Mark, (tracker._total, tracker._folded_count, pending, len(pending)))


_ZERO = _Mark(None, 0, None, 0)
"""The mark of a running loss that starts from nothing (an epoch's start)."""

_Terms = tuple[list[tuple[int, Any, Any]], list[tuple[int, Any]]]
"""A span's loss as ``(sign, value, weight)`` terms and its sample count as ``(sign, count)``."""


def _span_terms(start: _Mark, end: _Mark) -> _Terms:
    """The loss and count recorded between two marks of one running loss."""
    batches = _batches_between(start, end)
    if batches is not None:
        return [(1, value, size) for value, size in batches], [(1, size) for _, size in batches]
    loss, count = _mark_terms(end, 1)
    start_loss, start_count = _mark_terms(start, -1)
    return loss + start_loss, count + start_count


def _batches_between(start: _Mark, end: _Mark) -> list[tuple[torch.Tensor, Any]] | None:
    """The batches recorded between two marks, where both lists hold them (else ``None``).

    With no fold between, the end's list from the start's length; with one (whole counts
    tell it with no device work), the rest of the start's list, then the end's.
    """
    if start.batches is None or end.batches is None:
        return None
    if start.batches is end.batches:
        return end.batches[start.length : end.length]
    if type(start.count) is int and type(end.count) is int:
        sizes = [size for _, size in start.batches]
        if all(type(size) is int for size in sizes) and start.count + sum(sizes) == end.count:
            return start.batches[start.length :] + end.batches[: end.length]
    return None


def _mark_terms(mark: _Mark, sign: int) -> _Terms:
    """Everything recorded before ``mark``, with ``sign``."""
    loss: list[tuple[int, Any, Any]] = [] if mark.total is None else [(sign, mark.total, 1)]
    count: list[tuple[int, Any]] = [(sign, mark.count)]
    if mark.batches is not None:
        batches = mark.batches[: mark.length]
        loss += [(sign, value, size) for value, size in batches]
        count += [(sign, size) for _, size in batches]
    return loss, count


def _tensors_of(terms: _Terms) -> list[torch.Tensor]:
    loss, count = terms
    found = [item for _, value, weight in loss for item in (value, weight)]
    found += [item for _, item in count]
    return [item for item in found if isinstance(item, torch.Tensor)]


def _evaluate(terms: _Terms, value_of: Callable[[Any], Any]) -> tuple[Any, Any]:
    """The loss sum and count of ``terms``, with each tensor replaced by ``value_of`` it."""
    loss_terms, count_terms = terms
    loss: Any = 0.0
    for sign, value, weight in loss_terms:
        term = value_of(value) if isinstance(value, torch.Tensor) else value
        if not isinstance(weight, int) or weight != 1:
            term = term * (value_of(weight) if isinstance(weight, torch.Tensor) else weight)
        loss = loss + term if sign > 0 else loss - term
    count: Any = 0
    for sign, item in count_terms:
        term = value_of(item) if isinstance(item, torch.Tensor) else item
        count = count + term if sign > 0 else count - term
    return loss, count


def _joined(spans: list[tuple[_Mark, _Mark]]) -> _Terms:
    """The terms of an interval made of ``spans``."""
    loss: list[tuple[int, Any, Any]] = []
    count: list[tuple[int, Any]] = []
    for start, end in spans:
        span_loss, span_count = _span_terms(start, end)
        loss += span_loss
        count += span_count
    return loss, count


def _on_device(tensor: torch.Tensor) -> torch.Tensor:
    """A loss in at least float32 (a count as it is), for sums on the device."""
    if not tensor.is_floating_point():
        return tensor
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _read_at_once(tensors: list[torch.Tensor], device: torch.device | None) -> dict[int, Any]:
    """Read ``tensors`` (one value each) on the host with one transfer: ``id`` -> value."""
    unique = list({id(tensor): tensor for tensor in tensors}.values())
    if not unique:
        return {}
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in unique:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    ordered = [tensor for group in groups.values() for tensor in group]
    scalars = [
        [tensor if tensor.dim() == 0 else tensor.reshape(()) for tensor in group]
        for group in groups.values()
    ]
    if len(groups) == 1:
        values = torch.stack(scalars[0]).tolist()  # the one host read
    else:  # several dtypes or devices: each in the dtype that holds them all
        device = device or ordered[0].device
        dtype = reduction_dtype(device)
        stacked = [torch.stack(group).to(device, dtype) for group in scalars]
        values = torch.cat(stacked).tolist()  # the one host read
    return {id(tensor): value for tensor, value in zip(ordered, values, strict=True)}


@dataclass
class _Point:
    """One logging point whose values are still on the device."""

    step: int
    spans: list[tuple[_Mark, _Mark]]  # the interval's part of the trainer's running loss
    others: list[Any]  # [grad norm], tensor lrs
    lrs: list[Any]  # as the update used them: floats, or tensors (their values are in others)
    grad_norm: bool
    logged: LoggedValues
    seconds: float
    memory: float | None


class StepMetrics:
    """Collects the metrics of each logging interval on the device and reads them once.

    Nothing is read on the host between logging points, and nothing is computed on the device
    per update: a logging point keeps references to the batch losses the trainer's running
    loss (``trainer.train_loss_tracker``) recorded since the last point (``snapshot``), carried
    over epoch ends. ``flush`` reads one or more points at one place: in one process with one
    ``tolist()``, each interval's sample-weighted loss summed on the host in float64 from its
    batches; with several, each point's loss summed on the device and its values and logged
    names exchanged as ``read_with_logged`` does. Logging leaves the trainer's running loss
    as it is (the epoch losses are those of a run without it).

    The metrics, by name:

    - ``train_loss_step``: the sample-weighted mean training loss over the interval.
    - ``lr`` (one parameter group), or ``lr_group_0``, ``lr_group_1``, ...: the learning rate
      the update at the logging point used (at the end of a run, the last update's).
    - ``grad_norm``: the total gradient norm of that update, before clipping (if asked for;
      ``trainer.grad_norm`` when ``train(max_grad_norm=...)`` computed it).
    - ``samples_per_second``: the interval's samples per second of wall clock, without the
      evaluations run inside it.
    - ``max_memory_allocated_gb``: the peak memory allocated on this process's accelerator
      (CUDA and XPU).
    - ``train_<name>_step``: each value logged in the interval with ``trainer.log`` (or an
      extra scalar of ``batch_output``), reduced as logged (a mean by default).

    Every value is over all processes.

    The logging points are the multiples of ``every_n_updates`` in the run's update count
    (``trainer.global_num_updates``).

    Args:
        every_n_updates: The interval, in optimizer updates.
        log_grad_norm: Whether to include ``grad_norm``.
    """

    def __init__(self, every_n_updates: int, log_grad_norm: bool) -> None:
        self.every_n_updates = every_n_updates
        self.log_grad_norm = log_grad_norm
        self._reset_interval(time.perf_counter(), 0)
        self._seen = _ZERO
        self._seen_position: tuple[int, int] | None = None  # of a resumed interval
        self._pause_start: float | None = None
        self._device: torch.device | None = None
        self._memory_device: torch.device | None = None
        self._update_lrs: list[Any] | None = None
        self._logged = LoggedValues()
        self._nothing_logged = LoggedValues(self._logged.capacity)

    def _reset_interval(self, now: float, updates: int) -> None:
        self._spans: list[tuple[_Mark, _Mark]] = []
        self._grad_norm: torch.Tensor | None = None
        self._clock = now
        self._paused = 0.0
        self._logged_at = updates

    def start_run(self, trainer: Trainer) -> None:
        """Start the first interval (at ``on_training_run_start``)."""
        self._reset_interval(time.perf_counter(), trainer.global_num_updates)
        self._seen, self._seen_position = _ZERO, None
        self._update_lrs = None
        self._device = trainer.device
        tracked = trainer.device.type in ("cuda", "xpu")  # where torch tracks the peak memory
        self._memory_device = trainer.device if tracked else None
        self._logged = trainer.logged_metrics.open_interval()
        self._nothing_logged = LoggedValues(self._logged.capacity)  # for intervals without any

    def state_dict(self) -> dict[str, Any]:
        """Return this process's part of the interval so far, for a training state.

        The interval's closed spans are summed on the host (one read: a save reads anyway),
        as a flush would sum them, so a resumed interval logs the same value.
        """
        spans, seen = _joined(self._spans), _mark_terms(self._seen, 1)
        read = _read_at_once([*_tensors_of(spans), *_tensors_of(seen)], self._device)
        loss, count = _evaluate(spans, lambda part: read[id(part)])
        seen_total, seen_count = _evaluate(seen, lambda part: read[id(part)])
        state = {
            "loss": loss if self._spans else None,
            "count": count,
            "seen_total": seen_total if seen[0] else None,
            "seen_count": seen_count,
            "logged_at": self._logged_at,
            "seconds": time.perf_counter() - self._clock - self._paused,
            "logged": self._logged.state_dict(),
        }
        if self._seen.batches is not None and isinstance(self._seen.count, int):
            # where the running loss was last seen, in the trainer's loss state saved with it
            state["seen_position"] = [self._seen.count, self._seen.length]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the interval of a state returned by ``state_dict`` (after ``start_run``).

        The trainer's running loss is restored to what it was at the save right after, so
        what the interval gains from it is counted once (from the same batches as without
        the save, where no fold came between).
        """
        state = send_to_device(state, self._device)  # loaded on the CPU
        loss, count = state["loss"], state["count"]
        carried = _Mark(loss, count, None, 0)
        self._spans = [(_ZERO, carried)] if loss is not None else []
        self._seen = _Mark(state["seen_total"], state["seen_count"], None, 0)
        position = state.get("seen_position")
        self._seen_position = None if position is None else (int(position[0]), int(position[1]))
        self._logged_at = int(state["logged_at"])
        self._clock, self._paused = time.perf_counter() - float(state["seconds"]), 0.0
        self._logged.load_state_dict(state.get("logged", {}), self._device or torch.device("cpu"))

    def start_epoch(self) -> None:
        """The trainer's running loss starts again from zero (at ``on_train_epoch_start``)."""
        self._seen, self._seen_position = _ZERO, None

    def end_epoch(self, trainer: Trainer) -> None:
        """Close the interval's part of the running loss since last seen (no device work).

        At ``on_train_epoch_end`` (the epoch's part is carried over) and at each logging
        point; the parts are summed when the point is read.
        """
        mark = _mark_of(trainer.train_loss_tracker)
        if self._seen_position is not None:  # the first close after a resume
            folded, length = self._seen_position
            self._seen_position = None
            if type(mark.count) is int and mark.count == folded and mark.length >= length:
                self._seen = mark._replace(length=length)  # no fold since: the same batches
        self._spans.append((self._seen, mark))
        self._seen = mark

    def pause(self) -> None:
        """Stop the clock, for an evaluation inside the interval."""
        self._pause_start = time.perf_counter()

    def resume(self) -> None:
        """Start the clock again after an evaluation."""
        if self._pause_start is not None:
            self._paused += time.perf_counter() - self._pause_start
            self._pause_start = None

    def is_due(self, trainer: Trainer, ahead: int = 0) -> bool:
        """Whether update ``global_num_updates + ahead`` is a logging point."""
        return (trainer.global_num_updates + ahead) % self.every_n_updates == 0

    def before_update(self, trainer: Trainer) -> None:
        """Keep the gradient norm of an update at a logging point (``on_optimizer_step_start``)."""
        if self.log_grad_norm and self.is_due(trainer, ahead=1):
            norm = trainer.grad_norm
            self._grad_norm = norm if norm is not None else _total_norm(trainer.model)

    def after_update(self, trainer: Trainer) -> None:
        """Keep the learning rates the update used (``on_optimizer_step_end``, per update).

        Kept now, as run-end callbacks may load a checkpoint; a tensor rate is copied on the
        device (the scheduler fills it in place).
        """
        lrs: list[Any] = []  # a plain loop: this runs at every update
        for group in trainer.optimizer.param_groups:
            lr = group["lr"]
            lrs.append(lr.clone() if isinstance(lr, torch.Tensor) else lr)
        self._update_lrs = lrs

    def read(self, trainer: Trainer) -> dict[str, float] | None:
        """Read the interval's metrics (one host read) and start the next interval.

        Every process must call it at the same update (one collective).

        Returns:
            The metrics, or ``None`` if no update was made since the last read.
        """
        point = self.snapshot(trainer)
        return None if point is None else self.flush([point])[0][1]

    def snapshot(self, trainer: Trainer) -> _Point | None:
        """Close the interval at this update, keeping its values on the device; start the next.

        Nothing is read on the host and nothing is computed on the device: the interval keeps
        references to the trainer's running loss, summed by ``flush`` for one or more
        snapshots at once.

        Returns:
            The logging point, or ``None`` if no update was made since the last one.
        """
        updates = trainer.global_num_updates
        if updates == self._logged_at:
            return None
        if self._seen_position is None:  # end_epoch's work, inline: this runs at every point
            mark = _mark_of(trainer.train_loss_tracker)
            self._spans.append((self._seen, mark))
            self._seen = mark
        else:
            self.end_epoch(trainer)
        lrs = self._update_lrs or [group["lr"] for group in trainer.optimizer.param_groups]
        logged = self._logged.take() if len(self._logged) else self._nothing_logged
        grad_norm = self._grad_norm
        others: list[Any] = [] if grad_norm is None else [grad_norm]
        for lr in lrs:
            if isinstance(lr, torch.Tensor):
                others.append(lr)
        now = time.perf_counter()
        point = _Point(
            step=updates,
            spans=self._spans,
            others=others,
            lrs=lrs,
            grad_norm=grad_norm is not None,
            logged=logged,
            seconds=now - self._clock - self._paused,
            memory=None if self._memory_device is None else _max_memory_gb(self._memory_device),
        )
        self._reset_interval(now, updates)
        return point

    def flush(
        self, points: list[_Point], across_processes: bool = True
    ) -> list[tuple[int, dict[str, float]]]:
        """Read logging points on the host, all at this one place.

        In one process (or with ``across_processes=False``: this process's values, for an
        exception), one host read for all of them; each interval's loss is summed on the
        host from the batch losses it spans (in float64). With several, each point's values
        and logged names are exchanged as ``read_with_logged`` does (every process must call
        it with the same points), its loss summed on the device first.

        Returns:
            ``(step, metrics)`` of each point, in order.
        """
        if not points:
            return []
        device = self._device or torch.device("cpu")
        if across_processes and group_size() > 1:
            rows = []
            for point in points:
                loss, count = _evaluate(_joined(point.spans), _on_device)
                parts = [loss, count, *point.others]
                # the loss and sample count summed, the gradient norm and learning rates
                # averaged (the same on every process); the logged values reduced as logged
                reductions = ["sum", "sum"] + ["mean"] * len(point.others)
                rows.append(read_with_logged(parts, reductions, point.logged, device))
        else:
            rows = _read_on_host(points, device)
        return [(point.step, _metrics(point, row)) for point, row in zip(points, rows, strict=True)]


def _read_on_host(points: list[_Point], device: torch.device) -> list[list[Any]]:
    """Each point's values with one host read: loss sum, count, others, logged parts.

    A point whose interval is one run of batches (the usual case) is summed from them
    directly, in the order and arithmetic of ``_evaluate``; any other from its terms.
    """
    plans: list[tuple[list[tuple[torch.Tensor, Any]] | None, _Terms | None, list[Any]]] = []
    tensors: list[torch.Tensor] = []
    for point in points:
        spans = point.spans
        batches = _batches_between(*spans[0]) if len(spans) == 1 else None
        extra = point.others
        if len(point.logged):
            extra = [*extra, *point.logged.parts()[0]]
        terms: _Terms | None = None
        if batches is None:
            terms = joined = _joined(spans)
            tensors += _tensors_of(joined)
        else:
            for value, size in batches:
                tensors.append(value)
                if isinstance(size, torch.Tensor):
                    tensors.append(size)
        plans.append((batches, terms, extra))
        for part in extra:
            if isinstance(part, torch.Tensor):
                tensors.append(part)
    read = _read_at_once(tensors, device)

    def value_of(part: Any) -> Any:
        return read[id(part)] if isinstance(part, torch.Tensor) else part

    rows = []
    for batches, terms, extra in plans:
        if batches is None:
            assert terms is not None
            loss, count = _evaluate(terms, value_of)
        else:
            loss, count = 0.0, 0
            for value, size in batches:
                weight = read[id(size)] if isinstance(size, torch.Tensor) else size
                loss = loss + read[id(value)] * weight
                count = count + weight
        others = [read[id(part)] if isinstance(part, torch.Tensor) else part for part in extra]
        rows.append([float(loss), float(count), *others])
    return rows


def _metrics(point: _Point, values: list[float]) -> dict[str, float]:
    """A logging point's metrics by name, from its values read on the host."""
    loss_sum, count = values[0], values[1]
    metrics = {"train_loss_step": loss_sum / count if count else math.nan}
    lrs = point.lrs
    if len(lrs) == 1 and not isinstance(lrs[0], torch.Tensor):  # the usual case, at once
        metrics["lr"] = float(lrs[0])
    else:
        tensor_lrs = iter(values[3 if point.grad_norm else 2 :])
        host_lrs = [next(tensor_lrs) if isinstance(lr, torch.Tensor) else lr for lr in lrs]
        metrics.update(_lr_names(host_lrs))
    if point.grad_norm:
        metrics["grad_norm"] = values[2]
    seconds = point.seconds
    metrics["samples_per_second"] = count / seconds if seconds > 0 else math.nan
    if point.memory is not None:
        metrics["max_memory_allocated_gb"] = point.memory
    logged = point.logged
    if len(logged):
        user = logged.results(values[len(values) - logged.num_parts :])
        metrics.update(
            {logged_name("train_loss_step", name): value for name, value in user.items()}
        )
    return metrics


def _total_norm(model: torch.nn.Module) -> torch.Tensor | None:
    """The 2-norm of all gradients together, on the device, or ``None`` without gradients."""
    norms = [
        torch.linalg.vector_norm(parameter.grad.detach())
        for parameter in model.parameters()
        if parameter.grad is not None
    ]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else None


def _lr_names(lrs: list[float]) -> dict[str, float]:
    if len(lrs) == 1:
        return {"lr": float(lrs[0])}
    return {f"lr_group_{index}": float(lr) for index, lr in enumerate(lrs)}


def _max_memory_gb(device: torch.device) -> float:
    """The peak memory allocated on ``device`` in GiB (a CUDA or XPU device)."""
    module = getattr(torch, device.type)
    return float(module.max_memory_allocated(device)) / 2**30


class StepLoggingCallback(TrainerCallback):
    """Log step-level metrics every ``log_every_n_updates`` optimizer updates (see ``StepMetrics``).

    Every ``log_every_n_updates`` updates, and once more at the end of a training run for the
    updates since the last logging point, it calls ``log_step(trainer, metrics, step)`` with
    ``step`` the update count of the run (``trainer.global_num_updates``: it continues across
    ``train(reset_run_history=False)`` calls and restarts at 0 with a new run). By default
    that logs one line on the ``pytorch_accel`` logger (``update 50/360  train_loss_step
    0.4121  lr 0.001 ...``); override ``log_step`` to send the metrics elsewhere, as
    ``TrackingCallback`` does.

    Nothing is read on the host between reads: each logging point closes its interval on the
    device, and the points are read together (one host read in one process; with several, each
    point's exchange, all at that place: every process must run the callback), once they span
    ``FLUSH_EVERY_N_UPDATES`` (32) updates, at each epoch's end, at the run's end and when a
    training state is saved; ``log_steps`` is then called once with the points in order
    (by default it calls ``log_step`` for each), with the values they would have had if read
    at once. At the default interval every point is read at
    once; logging every update, ``log_step`` runs in bursts of 32. On an exception the points
    not yet read are logged in one process; with several they would need a collective, and
    are dropped with a warning. Order ``100``.

    Args:
        log_every_n_updates: The logging interval in optimizer updates (default 50); ``None``
            logs nothing.
        log_grad_norm: Also log the gradient norm of the update at each logging point.

    Raises:
        ValueError: If ``log_every_n_updates`` is not a positive int.
        TypeError: If ``log_grad_norm`` is not a bool.

    Example:
        ```python
        step_logging = StepLoggingCallback(log_every_n_updates=100)
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(*DEFAULT_CALLBACKS, step_logging))
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(
        self,
        log_every_n_updates: int | None = DEFAULT_LOG_EVERY_N_UPDATES,
        log_grad_norm: bool = False,
    ) -> None:
        where = type(self).__name__
        check_positive_int(where, "log_every_n_updates", log_every_n_updates, allow_none=True)
        check_bool(where, "log_grad_norm", log_grad_norm)
        self.step_metrics = (
            None if log_every_n_updates is None else StepMetrics(log_every_n_updates, log_grad_norm)
        )
        self._pending: list[_Point] = []
        self._run_trainer: weakref.ref[Trainer] | None = None  # for saves between points

    def rank_state_dict(self) -> dict[str, Any]:
        """Return this process's part of the logging interval (saved in training states).

        Logging points not yet read are logged first (every process saves at the same update).
        """
        trainer = None if self._run_trainer is None else self._run_trainer()
        if trainer is not None:
            self._log_pending(trainer)
        return {} if self.step_metrics is None else self.step_metrics.state_dict()

    def load_rank_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the interval of a state returned by ``rank_state_dict``."""
        if self.step_metrics is not None and state:
            self.step_metrics.load_state_dict(state)

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the first interval."""
        setup_logging()
        self._pending, self._run_trainer = [], weakref.ref(trainer)
        if self.step_metrics is not None:
            self.step_metrics.start_run(trainer)

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Follow the trainer's running loss into the new epoch."""
        if self.step_metrics is not None:
            self.step_metrics.start_epoch()

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Carry the epoch's part of the interval over; log the points not yet read."""
        if self.step_metrics is not None:
            self.step_metrics.end_epoch(trainer)
            self._log_pending(trainer)

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Stop the interval's clock during evaluations."""
        if self.step_metrics is not None:
            self.step_metrics.pause()

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the interval's clock again."""
        if self.step_metrics is not None:
            self.step_metrics.resume()

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Keep the gradient norm of an update at a logging point."""
        if self.step_metrics is not None:
            self.step_metrics.before_update(trainer)

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Keep the update's learning rates; close the interval at each logging point.

        The points are read and logged once they span ``FLUSH_EVERY_N_UPDATES`` updates.
        """
        steps = self.step_metrics
        if steps is not None:
            steps.after_update(trainer)
            if trainer.global_num_updates % steps.every_n_updates == 0:  # steps.is_due, inline
                self._log(trainer, steps)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Log the updates since the last logging point, and every point not yet read."""
        if self.step_metrics is not None:
            point = self.step_metrics.snapshot(trainer)
            if point is not None:
                self._pending.append(point)
            self._log_pending(trainer)

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """Log the points not yet read, in one process (with several: no collective, dropped)."""
        self._log_pending_on_exception(trainer)

    def _log_pending_on_exception(self, trainer: Trainer) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        if trainer.accelerator.num_processes > 1:  # their values need a collective
            get_logger().warning(
                "%s: %d step logging point(s) up to update %d were not logged: the run failed "
                "before they were combined across processes.",
                type(self).__name__,
                len(pending),
                pending[-1].step,
            )
            return
        try:
            steps = self.step_metrics
            assert steps is not None  # points are only taken with an interval
            self._log_rows(trainer, steps.flush(pending, across_processes=False))
        except Exception as error:  # the run has failed already: that error is the one to see
            get_logger().warning("%s: could not log step metrics: %s", type(self).__name__, error)

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        """Log one logging point's metrics; override to send them elsewhere.

        Called on every process with the ``metrics`` by name (see ``StepMetrics``) and
        ``step``, the update count of the run (``trainer.global_num_updates``); the default
        logs one line, on the main process.
        """
        config, before = trainer.run_config, trainer.global_num_updates - trainer.num_updates
        total = before + config.total_num_update_steps if config else step
        get_logger().info(SEPARATOR.join([f"update {step}/{total}", format_metrics(metrics)]))

    def log_steps(self, trainer: Trainer, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        """Log several logging points, ``(step, metrics)`` in order, read at one flush.

        The default calls ``log_step`` for each; override it to handle them together (as
        ``TrackingCallback`` does, with one write of its CSV file). A subclass that overrides
        ``log_step`` below the class that defines ``log_steps`` gets ``log_step`` per row.
        """
        for step, metrics in rows:
            self.log_step(trainer, metrics, step)

    def _log_rows(self, trainer: Trainer, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        """Log a flush's rows with ``log_steps``, or per row with an override of ``log_step``.

        ``log_step`` per row where a subclass of the class that defines ``log_steps``
        overrides it, so that override sees every row.
        """
        if not rows:
            return
        if _defined_later(type(self), "log_step", "log_steps"):
            for step, metrics in rows:
                self.log_step(trainer, metrics, step)
        else:
            self.log_steps(trainer, rows)

    def _log(self, trainer: Trainer, steps: StepMetrics) -> None:
        point = steps.snapshot(trainer)
        if point is None:
            return
        self._pending.append(point)
        first = self._pending[0].step - steps.every_n_updates
        if point.step - first >= FLUSH_EVERY_N_UPDATES:
            self._log_pending(trainer)

    def _log_pending(self, trainer: Trainer) -> None:
        """Read the pending points together and log each, in order."""
        pending, self._pending = self._pending, []
        if self.step_metrics is not None:
            self._log_rows(trainer, self.step_metrics.flush(pending))


def _defined_later(cls: type, name: str, other: str) -> bool:
    """Whether ``cls`` gets method ``name`` from a class before the one ``other`` comes from."""
    owners = [
        next(index for index, owner in enumerate(cls.__mro__) if attribute in vars(owner))
        for attribute in (name, other)
    ]
    return owners[0] < owners[1]

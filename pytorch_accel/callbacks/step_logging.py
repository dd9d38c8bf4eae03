"""Step-level metrics every N optimizer updates: loss, learning rates, gradient norm, speed.

``StepMetrics`` collects them; ``StepLoggingCallback`` logs them (to the console by default);
``TrackingCallback`` builds on it to send them to the experiment trackers and a CSV file.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import send_to_device

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks.defaults import SEPARATOR, format_metrics
from pytorch_accel.checks import check_bool, check_positive_int
from pytorch_accel.distributed import group_size
from pytorch_accel.tracking import (
    LoggedValues,
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


@dataclass
class _Point:
    """One logging point whose values are still on the device."""

    step: int
    parts: list[Any]  # loss sum, count, [grad norm], tensor lrs: tensors or numbers
    reductions: list[str]
    lrs: list[Any]  # as the update used them: floats, or tensors (their values are in packed)
    grad_norm: bool
    logged: LoggedValues
    seconds: float
    memory: float | None


class StepMetrics:
    """Collects the metrics of each logging interval on the device and reads them once.

    Nothing is read on the host between logging points: the interval's loss is the difference
    of the trainer's on-device running sum (``trainer.train_loss_tracker``) between two points,
    carried over epoch ends. Each logging point keeps its values on the device (``snapshot``);
    ``flush`` reads one or more points at one place: in one process with one ``tolist()``, with
    several each point's values and logged names exchanged as ``read_with_logged`` does.

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
        self._seen: tuple[torch.Tensor | None, int | torch.Tensor] = (None, 0)
        self._pause_start: float | None = None
        self._device: torch.device | None = None
        self._update_lrs: list[Any] | None = None
        self._logged = LoggedValues()

    def _reset_interval(self, now: float, updates: int) -> None:
        self._loss: torch.Tensor | None = None
        self._count: int | torch.Tensor = 0
        self._grad_norm: torch.Tensor | None = None
        self._clock = now
        self._paused = 0.0
        self._logged_at = updates

    def start_run(self, trainer: Trainer) -> None:
        """Start the first interval (at ``on_training_run_start``)."""
        self._reset_interval(time.perf_counter(), trainer.global_num_updates)
        self._seen = (None, 0)
        self._update_lrs = None
        self._device = trainer.device
        self._logged = trainer.logged_metrics.open_interval()

    def state_dict(self) -> dict[str, Any]:
        """Return this process's part of the interval so far, for a training state."""
        seen_total, seen_count = self._seen
        return {
            "loss": self._loss,
            "count": self._count,
            "seen_total": seen_total,
            "seen_count": seen_count,
            "logged_at": self._logged_at,
            "seconds": time.perf_counter() - self._clock - self._paused,
            "logged": self._logged.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the interval of a state returned by ``state_dict`` (after ``start_run``).

        The trainer's running loss is restored to what it was at the save right after, so
        what the interval gains from it is counted once.
        """
        state = send_to_device(state, self._device)  # loaded on the CPU
        self._loss, self._count = state["loss"], state["count"]
        self._seen = (state["seen_total"], state["seen_count"])
        self._logged_at = int(state["logged_at"])
        self._clock, self._paused = time.perf_counter() - float(state["seconds"]), 0.0
        self._logged.load_state_dict(state.get("logged", {}), self._device or torch.device("cpu"))

    def start_epoch(self) -> None:
        """The trainer's running loss starts again from zero (at ``on_train_epoch_start``)."""
        self._seen = (None, 0)

    def end_epoch(self, trainer: Trainer) -> None:
        """Add what the running loss gained since last seen to the interval (on the device).

        At ``on_train_epoch_end`` (the epoch's part is carried over) and at each read.
        """
        tracker = trainer.train_loss_tracker
        total = tracker.total_loss
        if total is None:
            return
        count = tracker.running_count
        seen_total, seen_count = self._seen
        gained = total if seen_total is None else total - seen_total
        self._loss = gained if self._loss is None else self._loss + gained
        self._count = self._count + (count - seen_count)
        self._seen = (total, count)

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
        self._update_lrs = [
            lr.clone() if isinstance(lr, torch.Tensor) else lr
            for lr in (group["lr"] for group in trainer.optimizer.param_groups)
        ]

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

        Nothing is read on the host: ``flush`` reads one or more snapshots at once.

        Returns:
            The logging point, or ``None`` if no update was made since the last one.
        """
        if trainer.global_num_updates == self._logged_at:
            return None
        self.end_epoch(trainer)
        lrs = self._update_lrs or [group["lr"] for group in trainer.optimizer.param_groups]
        logged = self._logged.take()
        parts: list[Any] = [0.0 if self._loss is None else self._loss, self._count]
        if self._grad_norm is not None:
            parts.append(self._grad_norm)
        parts += [lr for lr in lrs if isinstance(lr, torch.Tensor)]
        # the loss and sample count summed, the gradient norm and learning rates averaged
        # (the same on every process); the logged values are reduced as they were logged
        # (the trainer's running sums are replaced, never changed in place: kept as they are)
        reductions = ["sum", "sum"] + ["mean"] * (len(parts) - 2)
        point = _Point(
            step=trainer.global_num_updates,
            parts=parts,
            reductions=reductions,
            lrs=lrs,
            grad_norm=self._grad_norm is not None,
            logged=logged,
            seconds=time.perf_counter() - self._clock - self._paused,
            memory=_max_memory_allocated_gb(trainer.device),
        )
        self._reset_interval(time.perf_counter(), trainer.global_num_updates)
        return point

    def flush(
        self, points: list[_Point], across_processes: bool = True
    ) -> list[tuple[int, dict[str, float]]]:
        """Read logging points on the host, all at this one place.

        In one process (or with ``across_processes=False``: this process's values, for an
        exception), one host read for all of them. With several, each point's values and
        logged names are exchanged as ``read_with_logged`` does (every process must call it
        with the same points).

        Returns:
            ``(step, metrics)`` of each point, in order.
        """
        if not points:
            return []
        device = self._device or torch.device("cpu")
        if across_processes and group_size() > 1:
            rows = [read_with_logged(p.parts, p.reductions, p.logged, device) for p in points]
        else:
            flat: list[Any] = []
            sizes: list[int] = []
            for point in points:
                logged_parts, _ = point.logged.parts()
                flat += [*point.parts, *logged_parts]
                sizes.append(len(point.parts) + len(logged_parts))
            dtype = reduction_dtype(device)
            values = torch.stack(
                [torch.as_tensor(part).to(device, dtype) for part in flat]
            ).tolist()  # the one host read
            starts = [sum(sizes[:index]) for index in range(len(sizes))]
            rows = [values[start : start + size] for start, size in zip(starts, sizes, strict=True)]
        return [(point.step, _metrics(point, row)) for point, row in zip(points, rows, strict=True)]


def _metrics(point: _Point, values: list[float]) -> dict[str, float]:
    """A logging point's metrics by name, from its values read on the host."""
    loss_sum, count = values[0], values[1]
    metrics = {"train_loss_step": loss_sum / count if count else math.nan}
    tensor_lrs = iter(values[3 if point.grad_norm else 2 :])
    host_lrs = [next(tensor_lrs) if isinstance(lr, torch.Tensor) else lr for lr in point.lrs]
    metrics.update(_lr_names(host_lrs))
    if point.grad_norm:
        metrics["grad_norm"] = values[2]
    seconds = point.seconds
    metrics["samples_per_second"] = count / seconds if seconds > 0 else math.nan
    if point.memory is not None:
        metrics["max_memory_allocated_gb"] = point.memory
    logged = point.logged
    user = logged.results(values[len(values) - logged.num_parts :])
    metrics.update({logged_name("train_loss_step", name): value for name, value in user.items()})
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


def _max_memory_allocated_gb(device: torch.device) -> float | None:
    """The peak memory allocated on ``device`` in GiB, where torch tracks it (CUDA, XPU)."""
    if device.type not in ("cuda", "xpu"):
        return None
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
            if steps.is_due(trainer):
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

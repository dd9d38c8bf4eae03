"""Measure training throughput and the time spent waiting on data, per epoch."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.tracking import reduction_dtype

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["EpochThroughput", "ThroughputCallback"]


@dataclass(frozen=True)
class EpochThroughput:
    """What ``ThroughputCallback`` measured in one training epoch.

    Attributes:
        samples: Samples processed by all processes, including those accelerate repeats to
            even out the last batches.
        updates: Optimizer updates (per process; all processes take the same ones).
        seconds: Wall-clock time of the epoch, the slowest process's, without intermediate
            evaluations.
        data_wait_fraction: Fraction of the epoch spent waiting for batches, the largest of
            any process.
    """

    samples: int
    updates: int
    seconds: float
    data_wait_fraction: float


class ThroughputCallback(TrainerCallback):
    """Record samples/s, optimizer updates/s and the fraction of time spent waiting on data.

    At the end of each training epoch it records ``train_samples_per_second`` (over all
    processes), ``train_updates_per_second`` and ``train_data_wait_fraction``: the time from
    each ``on_train_step_end`` (and from the epoch's start) to the next
    ``on_train_step_start``, which is mostly the dataloader producing the next batch, divided
    by the epoch's wall-clock time. A fraction near 1 means the model waits on the input
    pipeline (more ``num_workers``, faster transforms); near 0, the steps dominate.

    It adds no host synchronisation to the steps: times come from ``time.perf_counter`` and
    batch sizes are Python ints; a tensor ``batch_output["batch_size"]`` is summed on the
    device and read once at the epoch's end. With several processes the counts are combined
    with one collective per epoch, so every process records the same values.

    On GPUs the steps only queue work: the device catches up when the epoch's loss is read
    (the trainer does that just before ``on_train_epoch_end``), so the epoch's wall-clock time,
    which ends at ``on_train_epoch_end``, includes that synchronisation, and the time inside
    a step is mostly the host enqueueing work. The rates are right over an epoch; the
    data-wait fraction can read high when the host runs ahead of the device (the wait then
    overlaps device work). Time spent in intermediate evaluations (a callback calling
    ``trainer.run_eval_epoch`` inside the epoch) is left out. Order ``90``: it records before
    ``LogMetricsCallback`` (100) logs the epoch's metrics. Its counts and clocks are part of
    the training state (``rank_state_dict``, one per process), so an epoch resumed in the
    middle reports the rates of the whole epoch, with the time before the save counted once
    and the restart not at all.

    Attributes:
        last_epoch: The raw measurements of the last epoch, or ``None`` before the first.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(*DEFAULT_CALLBACKS, ThroughputCallback()))
        trainer.train(train_dataset, num_epochs=3)
        trainer.run_history.get_latest_metric("train_samples_per_second")
        ```
    """

    order = 90
    may_stop_training = False

    def __init__(self) -> None:
        self.last_epoch: EpochThroughput | None = None
        self._reset(time.perf_counter(), 0)

    def _reset(self, now: float, updates: int) -> None:
        self._epoch_start = now
        self._waiting_since: float | None = now  # the first batch is waited for too
        self._wait = 0.0
        self._paused = 0.0
        self._pause_start: float | None = None
        self._steps = 0
        self._samples = 0
        self._tensor_samples: torch.Tensor | None = None
        self._updates_at_start = updates
        self._in_epoch = False

    def rank_state_dict(self) -> dict[str, Any]:
        """Return this process's counts and clock readings so far (saved in training states)."""
        now = time.perf_counter()
        samples = self._samples
        if self._tensor_samples is not None:  # read once, at the save
            samples += int(self._tensor_samples.sum().item())
        return {
            "in_epoch": self._in_epoch,
            "seconds": now - self._epoch_start - self._paused if self._in_epoch else 0.0,
            "wait": self._wait,
            "steps": self._steps,
            "samples": samples,
            "updates_at_start": self._updates_at_start,
        }

    def load_rank_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue the counts and clocks of a state returned by ``rank_state_dict``."""
        if not state_dict["in_epoch"]:
            return
        now = time.perf_counter()
        self._reset(now - float(state_dict["seconds"]), int(state_dict["updates_at_start"]))
        self._in_epoch = True
        self._wait = float(state_dict["wait"])
        self._steps = int(state_dict["steps"])
        self._samples = int(state_dict["samples"])

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the clocks and counters."""
        self._reset(time.perf_counter(), trainer.num_updates)
        self._in_epoch = True

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """End the wait for this batch."""
        now = time.perf_counter()
        if self._waiting_since is not None:
            self._wait += now - self._waiting_since
            self._waiting_since = None

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Count the batch's samples and start waiting for the next batch."""
        size = batch_output["batch_size"]
        if isinstance(size, torch.Tensor):
            total = self._tensor_samples
            self._tensor_samples = size.detach() if total is None else total + size.detach()
        else:
            self._samples += int(size)
        self._steps += 1
        self._waiting_since = time.perf_counter()

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Pause the clocks for an evaluation inside the training epoch."""
        if self._in_epoch:
            self._pause_start = time.perf_counter()

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Resume the clocks after an evaluation inside the training epoch."""
        if self._in_epoch and self._pause_start is not None:
            paused = time.perf_counter() - self._pause_start
            self._paused += paused
            if self._waiting_since is not None:  # the evaluation is not waiting on data
                self._waiting_since += paused
            self._pause_start = None

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Record the epoch's rates in the run history."""
        seconds = time.perf_counter() - self._epoch_start - self._paused
        self._in_epoch = False
        if self._steps == 0:  # stopped before the first step
            return
        updates = trainer.num_updates - self._updates_at_start
        samples, seconds, wait_fraction = self._combine(trainer, seconds, self._wait / seconds)
        self.last_epoch = EpochThroughput(samples, updates, seconds, wait_fraction)
        history = trainer.run_history
        history.update_metric("train_samples_per_second", samples / seconds)
        history.update_metric("train_updates_per_second", updates / seconds)
        history.update_metric("train_data_wait_fraction", wait_fraction)

    def _combine(
        self, trainer: Trainer, seconds: float, wait_fraction: float
    ) -> tuple[int, float, float]:
        """Total the samples and take the slowest process's time and wait (one collective).

        A single process with int batch sizes needs no tensor at all.
        """
        local = self._tensor_samples
        if trainer.accelerator.num_processes == 1 and local is None:
            return self._samples, seconds, wait_fraction
        device = trainer.device
        dtype = reduction_dtype(device)
        stats = torch.tensor([float(self._samples), seconds, wait_fraction], dtype=dtype)
        stats = stats.to(device)
        if local is not None:
            stats[0] += local.to(device, dtype).sum()
        if trainer.accelerator.num_processes > 1:
            stats = trainer.accelerator.gather(stats)
        stats = stats.reshape(-1, 3)
        combined = torch.cat([stats[:, 0].sum().reshape(1), stats[:, 1:].amax(dim=0)])
        samples, slowest_seconds, largest_wait = combined.tolist()
        return round(samples), slowest_seconds, largest_wait

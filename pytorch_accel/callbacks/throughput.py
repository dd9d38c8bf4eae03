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
    from pytorch_accel.protocols import TrainerLike

__all__ = ["EpochThroughput", "ThroughputCallback"]


@dataclass(frozen=True)
class EpochThroughput:
    """What ``ThroughputCallback`` measured in one training epoch.

    Attributes:
        samples: Samples processed by all processes (with those accelerate repeats).
        updates: Optimizer updates (the same on every process).
        seconds: The slowest process's wall-clock time, without intermediate evaluations.
        data_wait_fraction: The largest fraction of the epoch any process waited for batches.
    """

    samples: int
    updates: int
    seconds: float
    data_wait_fraction: float


class ThroughputCallback(TrainerCallback):
    """Record samples/s, optimizer updates/s and the fraction of time spent waiting on data.

    At the end of each training epoch it records ``train_samples_per_second`` (over all
    processes), ``train_updates_per_second`` and ``train_data_wait_fraction``: the time from
    each step's end (and the epoch's start) to the next step's start, mostly the dataloader
    producing the next batch, divided by the epoch's wall-clock time. Near 1, the model waits
    on the input pipeline (more ``num_workers``, faster transforms); near 0, the steps dominate.

    The steps make no host read: times come from ``time.perf_counter``, a tensor
    ``batch_output["batch_size"]`` is summed on the device and read at the epoch's end, and
    one collective per epoch combines the processes' counts, so all record the same values.
    On GPUs the device catches up when the epoch's loss is read, just before
    ``on_train_epoch_end``: the rates are right over an epoch, while the data-wait fraction
    can read high when the host runs ahead of the device. Intermediate evaluations are left
    out. Order ``90``: before ``LogMetricsCallback`` (100). Its counts and clocks are part of
    the training state (``rank_state_dict``), so an epoch resumed in the middle reports the
    rates of the whole epoch, without the restart.

    Attributes:
        last_epoch: The raw measurements of the last epoch, or ``None`` before the first.

    Example:
        ```python
        throughput = ThroughputCallback()
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, throughput))
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

    def on_train_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the clocks and counters."""
        self._reset(time.perf_counter(), trainer.num_updates)
        self._in_epoch = True

    def on_train_step_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """End the wait for this batch."""
        if self._waiting_since is not None:
            self._wait += time.perf_counter() - self._waiting_since
            self._waiting_since = None

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
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

    def on_eval_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Pause the clocks for an evaluation inside the training epoch."""
        if self._in_epoch:
            self._pause_start = time.perf_counter()

    def on_eval_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Resume the clocks after an evaluation inside the training epoch."""
        if self._in_epoch and self._pause_start is not None:
            paused = time.perf_counter() - self._pause_start
            self._paused += paused
            if self._waiting_since is not None:  # the evaluation is not waiting on data
                self._waiting_since += paused
            self._pause_start = None

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
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
        self, trainer: TrainerLike, seconds: float, wait_fraction: float
    ) -> tuple[int, float, float]:
        """Total the samples and take the slowest process's time and wait (one collective)."""
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

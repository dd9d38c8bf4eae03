"""The learning-rate range test: ``Trainer.find_lr``, its result, its suggestion and its plot.

The sweep runs through the trainer's own step methods (``calculate_train_batch_loss``,
``backward_step``, ``optimizer_step``, ``optimizer_zero_grad``), so an overridden step, a
dict batch or gradient accumulation behaves as in training. The losses stay on the device
between checks; each check averages them across processes (one collective), so all
processes stop at the same update and suggest the same rate.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.utils.data import DataLoader

from pytorch_accel._checks import (
    check_batch_output,
    check_callable,
    check_choice,
    check_mapping,
    check_number,
    check_positive_int,
    fail,
)
from pytorch_accel._entry_checks import (
    check_data,
    check_dataloader_settings,
    check_trainer_settings,
)
from pytorch_accel.dataloaders import epoch_batches
from pytorch_accel.distributed import reduce_across_processes
from pytorch_accel.tools._dry_run import Snapshot

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from pytorch_accel.tools._dry_run import ToolTrainer

__all__ = ["LRFinderResult", "SuggestionMethod", "find_lr", "steepest_index", "valley_index"]

SuggestionMethod = Literal["valley", "steepest", "minimum"]
"""How ``find_lr`` suggests a rate from the smoothed loss curve."""

_WHERE = "Trainer.find_lr"
_INSTALL_HINT = 'LRFinderResult.plot needs matplotlib: pip install "pytorch-accel[plot]".'


@dataclass(frozen=True)
class LRFinderResult:
    """What ``Trainer.find_lr`` measured: the same on every process.

    Attributes:
        lrs: The learning rate of each update of the sweep (every parameter group's).
        losses: The loss of each update (the mean over its micro-batches, averaged across
            processes).
        smoothed_losses: ``losses`` smoothed by a debiased exponential moving average (as
            fastai and Lightning do), the curve the suggestion and the divergence check use.
        suggestion: The suggested learning rate, by ``method``; ``None`` if the sweep was
            too short to suggest one (fewer than 2 points left after skipping its ends).
        method: ``"valley"`` (fastai's default), ``"steepest"`` (Lightning's) or
            ``"minimum"``.
        valley: fastai's valley suggestion (``None``: too short a sweep).
        steepest: The rate of the steepest descent of the smoothed curve before its lowest
            point (``None``: too short a sweep).
        minimum: A tenth of the rate of the lowest smoothed loss (fastai's ``minimum``).
        diverged_at: The index of the update whose smoothed loss passed ``divergence``
            times the best (or was not finite), where the sweep stopped; ``None`` if it ran
            to ``end_lr``.
    """

    lrs: list[float]
    losses: list[float]
    smoothed_losses: list[float]
    suggestion: float | None
    method: SuggestionMethod
    valley: float | None
    steepest: float | None
    minimum: float | None
    diverged_at: int | None

    def plot(
        self, ax: Axes | None = None, *, path: str | None = None, show_suggestion: bool = True
    ) -> Axes:
        """Draw the smoothed loss against the learning rate (log scale), with the suggestion.

        matplotlib is imported here, not with the package (the ``plot`` extra).

        Args:
            ax: The axes to draw on; a new figure's by default (without pyplot: no window
                opens, the global backend is untouched).
            path: Also save the figure to this file (format from its suffix).
            show_suggestion: Mark the suggested rate.

        Returns:
            The axes drawn on.

        Raises:
            ImportError: If matplotlib is not installed.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError(_INSTALL_HINT) from error
        if ax is None:
            ax = Figure(figsize=(6.0, 4.0), layout="constrained").subplots()
        ax.plot(self.lrs, self.smoothed_losses, label="smoothed loss")
        ax.set(xscale="log", xlabel="learning rate", ylabel="loss")
        ax.grid(alpha=0.3)
        if show_suggestion and self.suggestion is not None:
            index = self.lrs.index(self.suggestion)
            ax.plot(
                [self.suggestion],
                [self.smoothed_losses[index]],
                "o",
                color="red",
                label=f"{self.method}: {self.suggestion:.2e}",
            )
            ax.legend()
        if path is not None:
            ax.get_figure().savefig(path)  # type: ignore[union-attr]
        return ax

    def __str__(self) -> str:
        stop = (
            f"stopped at update {self.diverged_at + 1} (lr {self.lrs[self.diverged_at]:.2e}): "
            "the loss diverged"
            if self.diverged_at is not None
            else f"ran to lr {self.lrs[-1]:.2e} without diverging"
        )
        shown = "none" if self.suggestion is None else f"{self.suggestion:.2e}"
        return (
            f"LR range test: {len(self.lrs)} updates, {stop}; suggested lr ({self.method}): {shown}"
        )


def find_lr(
    trainer: ToolTrainer,
    train_dataset: Any,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    per_device_batch_size: int | None = None,
    gradient_accumulation_steps: int = 1,
    collate_fn: Callable[..., Any] | None = None,
    train_dataloader_kwargs: Mapping[str, Any] | None = None,
    max_grad_norm: float | None = None,
    gradient_clip_value: float | None = None,
    smoothing: float = 0.98,
    divergence: float | None = 4.0,
    method: SuggestionMethod = "valley",
    check_every: int = 10,
) -> LRFinderResult:
    """Run a learning-rate range test; leave the model, optimizer and random states as they were.

    Trains for up to ``num_steps`` optimizer updates with the learning rate of update ``i``
    (0-based) ``start_lr * (end_lr / start_lr) ** (i / (num_steps - 1))`` in every parameter
    group, through the trainer's step methods (no callback events fire, no scheduler is
    stepped, nothing is recorded in the run history), and stops once the smoothed loss exceeds
    ``divergence`` times its best. Then it puts back exactly the weights and buffers, the
    optimizer's state and rates, the scheduler and gradient scaler, the gradients, the modules'
    train/eval modes and the random states, so ``train()`` afterwards gives the same weights
    as without it. Every process must call it; all get the same result.

    Args:
        trainer: The trainer (``trainer.find_lr(...)`` passes it).
        train_dataset: A map-style dataset, or a ``DataLoader`` you built; read again from its
            start if the sweep needs more batches than it has.
        start_lr: The learning rate of the first update.
        end_lr: The learning rate of the last update, greater than ``start_lr``.
        num_steps: The most optimizer updates to sweep over (at least 2).
        per_device_batch_size: Batch size on each process, for a dataset (default 8).
        gradient_accumulation_steps: Micro-batches per update, as in ``train()``.
        collate_fn: The collate function, for a dataset.
        train_dataloader_kwargs: Override the ``DataLoader`` arguments, for a dataset.
        max_grad_norm: Clip the global gradient norm before each update, as ``train()``.
        gradient_clip_value: Clip each gradient element before each update, as ``train()``.
        smoothing: The moving average's ``beta`` in ``[0, 1)`` (0: no smoothing).
        divergence: Stop once the smoothed loss exceeds this many times its best (after the
            first update), or is not finite; ``None`` sweeps to ``end_lr`` whatever the loss.
        method: The suggestion returned as ``suggestion``: ``"valley"``, ``"steepest"`` or
            ``"minimum"`` (all three are in the result).
        check_every: Average the losses across processes and check for divergence every this
            many updates: the host waits for the device once per check, and the sweep may run
            up to ``check_every - 1`` updates past the divergence (discarded). 1 checks after
            every update, as fastai and Lightning do.

    Returns:
        The sweep's ``LRFinderResult`` (``print`` it, or call its ``plot``).

    Raises:
        ValueError: For a bad argument, or data that yields no batch.
        TypeError: For an argument of the wrong type.
        RuntimeError: If called while ``train()`` runs (from a callback).

    Example:
        ```python
        result = trainer.find_lr(train_dataset, per_device_batch_size=32)
        print(result)
        result.plot(path="lr_find.png")
        trainer.optimizer.param_groups[0]["lr"] = result.suggestion
        trainer.train(train_dataset, num_epochs=5)
        ```
    """
    check_number(_WHERE, "start_lr", start_lr, strict=True, finite=True)
    check_number(_WHERE, "end_lr", end_lr, strict=True, finite=True)
    if float(end_lr) <= float(start_lr):
        fail(
            ValueError,
            _WHERE,
            "end_lr",
            end_lr,
            f"greater than start_lr ({start_lr})",
            "The sweep rises from start_lr to end_lr, e.g. start_lr=1e-7, end_lr=10.",
        )
    check_positive_int(_WHERE, "num_steps", num_steps)
    if num_steps == 1:
        fail(ValueError, _WHERE, "num_steps", 1, "at least 2", "Pass e.g. num_steps=100.")
    check_positive_int(_WHERE, "per_device_batch_size", per_device_batch_size, allow_none=True)
    check_positive_int(_WHERE, "gradient_accumulation_steps", gradient_accumulation_steps)
    check_callable(_WHERE, "collate_fn", collate_fn, "Pass a function, or leave it out.")
    check_mapping(_WHERE, "train_dataloader_kwargs", train_dataloader_kwargs)
    check_number(_WHERE, "smoothing", smoothing, finite=True)
    if float(smoothing) >= 1:
        fail(ValueError, _WHERE, "smoothing", smoothing, "in [0, 1)", "Pass e.g. 0.98.")
    fix = "Pass e.g. divergence=4.0 (fastai's), or None to sweep to end_lr."
    check_number(_WHERE, "divergence", divergence, strict=True, allow_none=True, fix=fix)
    check_choice(
        _WHERE,
        "method",
        method,
        ("valley", "steepest", "minimum"),
        "'valley' is fastai's default suggestion, 'steepest' Lightning's, 'minimum' a "
        "tenth of the rate of the lowest loss.",
    )
    check_positive_int(_WHERE, "check_every", check_every)
    check_trainer_settings(_WHERE, trainer)
    check_data(_WHERE, "train_dataset", train_dataset, streams=True)
    check_dataloader_settings(
        _WHERE,
        train_dataset,
        data_name="train_dataset",
        per_device_batch_size=per_device_batch_size,
        collate_fn=collate_fn,
        train_dataloader_kwargs=train_dataloader_kwargs,
    )
    check_number(_WHERE, "max_grad_norm", max_grad_norm, strict=True, allow_none=True)
    check_number(_WHERE, "gradient_clip_value", gradient_clip_value, strict=True, allow_none=True)
    clip = _clipping(trainer, max_grad_norm, gradient_clip_value)
    trainer._preparation.prepare_model_and_optimizer(trainer)
    schedule = [start_lr * (end_lr / start_lr) ** (i / (num_steps - 1)) for i in range(num_steps)]
    sweep = _Sweep(schedule, smoothing, divergence, check_every)
    with Snapshot.taken(trainer):
        loader = _dataloader(
            trainer, train_dataset, per_device_batch_size, collate_fn, train_dataloader_kwargs
        )
        with trainer._preparation.prepared_for_prediction(loader) as prepared:  # shard, forget
            _run(trainer, sweep, prepared, gradient_accumulation_steps, clip)
    return sweep.result(method)


def _dataloader(
    trainer: ToolTrainer,
    data: Any,
    batch_size: int | None,
    collate_fn: Callable[..., Any] | None,
    dl_kwargs: Mapping[str, Any] | None,
) -> DataLoader[Any]:
    """``data`` itself, or a loader from the trainer's hook (its settings put back after)."""
    if isinstance(data, DataLoader):
        return data
    saved = (trainer.train_dataset, trainer.collate_fn, trainer._train_dl_kwargs)
    try:
        trainer.train_dataset, trainer.collate_fn = data, collate_fn
        return trainer.create_train_dataloader(batch_size or 8, dl_kwargs)
    finally:
        trainer.train_dataset, trainer.collate_fn, trainer._train_dl_kwargs = saved


def _clipping(
    trainer: ToolTrainer, max_grad_norm: float | None, clip_value: float | None
) -> Callable[[], None]:
    """The gradient clipping before each update, as ``train()`` clips (value first)."""
    accelerator = trainer.accelerator
    if clip_value is not None:
        return lambda: accelerator.clip_grad_value_(trainer.model.parameters(), clip_value)
    if max_grad_norm is not None:
        return lambda: accelerator.clip_grad_norm_(trainer.model.parameters(), max_grad_norm)
    return lambda: None


def _run(
    trainer: ToolTrainer,
    sweep: _Sweep,
    loader: DataLoader[Any],
    accumulation: int,
    clip: Callable[[], None],
) -> None:
    """Train with the sweep's rates, passing over ``loader`` again as needed, until it ends.

    An accumulation window left open at a pass's end continues in the next pass.
    """
    trainer.model.train()
    trainer.optimizer_zero_grad()
    while not sweep.done:
        used = 0
        with epoch_batches(loader, None) as batches:
            for batch in batches:
                used += 1
                if not sweep.window:
                    for group in trainer.optimizer.param_groups:
                        group["lr"] = sweep.next_lr
                last = len(sweep.window) + 1 == accumulation
                # inside an accumulation window: no gradient synchronisation, as in training
                synchronised = contextlib.nullcontext() if last else None
                with synchronised or trainer.accelerator.no_sync(trainer.model):
                    output = check_batch_output(
                        trainer.calculate_train_batch_loss(batch), "calculate_train_batch_loss"
                    )
                    loss = output["loss"]
                    trainer.backward_step(loss if accumulation == 1 else loss / accumulation)
                sweep.window.append(loss.detach().float())
                if last:
                    clip()
                    trainer.optimizer_step()
                    trainer.optimizer_zero_grad()
                    over = sweep.record(torch.stack(sweep.window).mean())
                    sweep.window.clear()
                    if over:
                        break
        if not used:
            fail(
                ValueError,
                _WHERE,
                "train_dataset",
                loader.dataset,
                "data that yields batches",
                "The dataloader yielded no batch: pass a dataset with samples (and a batch "
                "size no larger than it with drop_last).",
            )


class _Sweep:
    """The rates to try, the losses on the device, and the checks on the host."""

    def __init__(
        self, lrs: list[float], smoothing: float, divergence: float | None, check_every: int
    ) -> None:
        self.lrs, self.beta, self.divergence = lrs, smoothing, divergence
        self.check_every = check_every
        self.window: list[torch.Tensor] = []  # the micro-batch losses of the open update
        self.pending: list[torch.Tensor] = []  # on the device, not yet checked
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self._average, self._best = 0.0, math.inf
        self.diverged_at: int | None = None

    @property
    def done(self) -> bool:
        """Whether the sweep is over: every rate tried, or the loss diverged."""
        return self.diverged_at is not None or len(self.losses) == len(self.lrs)

    @property
    def next_lr(self) -> float:
        """The rate of the next update."""
        return self.lrs[len(self.losses) + len(self.pending)]

    def record(self, loss: torch.Tensor) -> bool:
        """Keep an update's loss, check every ``check_every`` and at the end; return ``done``."""
        self.pending.append(loss)
        tried = len(self.losses) + len(self.pending)
        if len(self.pending) >= self.check_every or tried == len(self.lrs):
            self._check()
        return self.done

    def _check(self) -> None:
        values = torch.stack(self.pending)
        self.pending = []
        averaged = reduce_across_processes(values, ["mean"] * len(values)).tolist()
        for loss in averaged:  # the same values on every process: the same decisions
            self.losses.append(float(loss))
            self._average = self.beta * self._average + (1 - self.beta) * loss
            smoothed = self._average / (1 - self.beta ** len(self.losses))
            self.smoothed.append(smoothed)
            above = len(self.losses) > 1 and smoothed > (self.divergence or 0) * self._best
            if self.divergence is not None and (not math.isfinite(smoothed) or above):
                self.diverged_at = len(self.losses) - 1
                return  # the updates after it are discarded
            self._best = min(self._best, smoothed)

    def result(self, method: SuggestionMethod) -> LRFinderResult:
        lrs = self.lrs[: len(self.losses)]
        lowest = _suggest(lambda losses: losses.index(min(losses)), lrs, self.smoothed)
        suggestions = {
            "valley": _suggest(valley_index, lrs, self.smoothed),
            "steepest": _suggest(steepest_index, lrs, self.smoothed, up_to_minimum=True),
            "minimum": None if lowest is None else lowest / 10,
        }
        return LRFinderResult(
            lrs=lrs,
            losses=self.losses,
            smoothed_losses=self.smoothed,
            suggestion=suggestions[method],
            method=method,
            diverged_at=self.diverged_at,
            **suggestions,
        )


def _suggest(
    index_of: Callable[[Sequence[float]], int],
    lrs: Sequence[float],
    smoothed: Sequence[float],
    up_to_minimum: bool = False,
) -> float | None:
    """The rate ``index_of`` picks on the curve without its first tenth and last 5 points.

    As fastai does: the first updates barely move the loss, the last ones diverge. Points
    that are not finite are left out; with ``up_to_minimum``, so are those after the lowest
    loss (a descent after a spike is no rate to train at). ``None`` if fewer than 2 remain.
    """
    start, end = len(smoothed) // 10, len(smoothed) - 5
    points = [(lr, loss) for lr, loss in zip(lrs[start:end], smoothed[start:end], strict=True)]
    points = [(lr, loss) for lr, loss in points if math.isfinite(loss)]
    if up_to_minimum and points:
        lowest = min(range(len(points)), key=lambda i: points[i][1])
        points = points[: lowest + 1]
    if len(points) < 2:
        return None
    return points[index_of([loss for _, loss in points])][0]


def steepest_index(losses: Sequence[float]) -> int:
    """The index of the steepest descent of ``losses`` (Lightning's suggestion).

    The slope at each point is ``numpy.gradient``'s: central differences inside, one-sided
    at the ends; the rates are evenly spaced in log scale, so this is the steepest descent
    against the log of the rate.
    """
    n = len(losses)
    slopes = [
        (losses[min(i + 1, n - 1)] - losses[max(i - 1, 0)]) / (min(i + 1, n - 1) - max(i - 1, 0))
        for i in range(n)
    ]
    return min(range(n), key=slopes.__getitem__)


def valley_index(losses: Sequence[float]) -> int:
    """The index fastai's ``valley`` suggests: half-way down the longest valley of ``losses``.

    The longest decreasing subsequence of ``losses`` (not necessarily contiguous) ends at
    ``end`` and starts ``start = end - its length``; with ``sections = (end - start) / 3`` the
    suggestion is ``start + int(sections) + int(sections / 2)``, as fastai computes it.
    """
    n = len(losses)
    longest = [1] * n
    start = end = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and longest[i] < longest[j] + 1:
                longest[i] = longest[j] + 1
            if longest[end] < longest[i]:
                end = i
                start = end - longest[end]
    sections = (end - start) / 3
    return start + int(sections) + int(sections / 2)

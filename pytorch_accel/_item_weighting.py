"""Token-exact gradient accumulation: each window's gradient is the mean over its loss elements.

A language model's loss is the mean over the batch's tokens (the labels that are not
``-100``), and batches hold different numbers of them. Scaling each micro-batch's mean by
``1 / window size`` weights every micro-batch alike, so ``N`` micro-batches are not one batch
of ``N`` times the size; across processes DDP's average does the same to the processes'
batches. When the step's ``batch_output`` carries ``num_items``, the number of loss elements
its ``loss`` is the mean of, the loop uses ``ItemWeighting`` instead:

- each micro-batch loss is back-propagated multiplied by ``num_items / reference`` (so the
  window's gradient is the sum over its elements, divided by ``reference``);
- at the window's end, before clipping, the gradients are multiplied by
  ``num_processes * reference / total``, ``total`` being the window's elements summed over
  micro-batches and processes (one all-reduce per window, with several processes): after
  DDP's average over the processes, the gradient is the mean over every element of the
  window, as one large batch gives.

``reference`` is a power of two agreed by every process: that of the previous window's mean
number of elements per micro-batch (for the run's first window, of the processes' mean count
of their first micro-batch: one more all-reduce per ``train()`` call). It keeps the back-propagated
values at the size of a mean (mixed precision gradient scalers do not overflow), and,
being a power of two, changes no bit of the result. Nothing here waits for the device: the
counts stay on it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from pytorch_accel.distributed import sum_across_processes
from pytorch_accel.tracking import reduction_dtype

__all__ = ["ItemWeighting", "check_num_items"]


def check_num_items(value: Any, method: str) -> None:
    """Raise unless ``value`` is a ``num_items`` the loop can weight by: a number or scalar tensor.

    Only the type and the shape are read: no host synchronisation.

    Raises:
        TypeError: If ``value`` is neither an int, a float nor a one-element tensor.
    """
    if type(value) in (int, float) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return
    shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
    raise TypeError(
        f"Trainer.{method}: batch_output['num_items'] must be the number of loss elements the "
        f"batch's loss is the mean of (an int, a float or a one-element tensor), got "
        f"{type(value).__name__}{shape}. Return e.g. (labels != -100).sum() for a token loss."
    )


class ItemWeighting:
    """Weights a window's micro-batches by their loss elements, summed over the processes.

    Attributes:
        in_use: Whether the current ``train()`` call weights by ``num_items`` (``None``
            until its first batch tells).
    """

    def __init__(self) -> None:
        self._num_processes = 1
        self._count: int | torch.Tensor = 0
        self._batches = 0
        self._reference: float | torch.Tensor | None = None
        self._device = torch.device("cpu")
        self.in_use: bool | None = None

    def start_run(self, num_processes: int, device: torch.device) -> None:
        """Start a ``train()`` call: its first batch decides whether it weights by ``num_items``.

        Args:
            num_processes: The processes whose gradients DDP averages.
            device: Where the processes exchange their counts (the trainer's device).
        """
        self._num_processes, self._device, self.in_use = num_processes, device, None
        self._count, self._batches, self._reference = 0, 0, None

    def start_unweighted(self, batch_output: Mapping[str, Any]) -> None:
        """Note that the run's first batch carries no ``num_items``: the run is not weighted.

        Code ported from pytorch-accelerated may return ``num_items_in_batch`` instead, which
        pytorch-accelerated read as a loss already divided by the count over all processes
        (and multiplied by the number of processes); it is pointed to ``num_items`` once.
        """
        self.in_use = False
        if "num_items_in_batch" in batch_output:
            warnings.warn(
                "Trainer.train: batch_output['num_items_in_batch'] is not interpreted (it was "
                "pytorch-accelerated's key). For token-exact gradient accumulation return "
                "'num_items', the number of loss elements the batch's mean loss averages "
                "(the loop then normalises each window by their total over all processes); "
                "else rename the key.",
                UserWarning,
                stacklevel=2,
            )

    def weight(self, num_items: Any, step: int, epoch_index: int) -> float | torch.Tensor:
        """Count a micro-batch's elements; return the factor its mean loss is multiplied by.

        The run's first batch turns the weighting on (``in_use``); the loop calls this for
        every batch that carries ``num_items``, and for every batch of a run that uses it.

        Args:
            num_items: The batch's ``batch_output.get("num_items")``.
            step: The batch's 0-based index in its epoch, for messages.
            epoch_index: Its epoch's 0-based index, for messages.

        Raises:
            ValueError: If some of the run's batches carry ``num_items`` and others do not.
            TypeError: If ``num_items`` is not a number or a one-element tensor.
        """
        if self.in_use is None:
            self.in_use = True
        if num_items is None or not self.in_use:
            first = "did not carry it" if num_items is not None else "carried it"
            raise ValueError(
                f"Trainer.train: batch_output['num_items'] is "
                f"{'missing' if num_items is None else 'present'} in batch {step + 1} of epoch "
                f"{epoch_index + 1}, but the run's first batch {first}: token-exact "
                "accumulation weights every batch by its loss elements, so it cannot mix with "
                "batches weighted by count. Return num_items from every "
                "calculate_train_batch_loss (or put num_items_in_batch in every dict batch), "
                "or from none."
            )
        check_num_items(num_items, "calculate_train_batch_loss")
        self._count = self._count + num_items
        self._batches += 1
        if self._reference is None:  # the run's first batch
            self._reference = self._first_reference(num_items)
        factor: float | torch.Tensor = num_items / self._reference
        return factor

    def scaled_loss(
        self, batch_output: Mapping[str, Any], scale: float, step: int, epoch_index: int
    ) -> torch.Tensor:
        """Return the micro-batch loss to back-propagate: weighted by ``num_items`` or scaled.

        A run whose batches carry ``num_items`` weights each by its count (``weight``); else
        the loss is multiplied by ``scale``, the micro-batch's share of its window.

        Args:
            batch_output: The micro-batch's checked ``batch_output``.
            scale: Its share of the accumulation window (``1 / window size``, or less).
            step: Its 0-based index in its epoch, for messages.
            epoch_index: Its epoch's 0-based index, for messages.
        """
        loss, num_items = batch_output["loss"], batch_output.get("num_items")
        if num_items is not None or self.in_use:  # token-exact: weighted by num_items
            return loss * self.weight(num_items, step, epoch_index)  # type: ignore[no-any-return]
        if self.in_use is None:  # the run's first batch: not weighted
            self.start_unweighted(batch_output)
        return loss if scale == 1.0 else loss * scale  # type: ignore[no-any-return]

    def snapshot(self) -> tuple[Any, ...]:
        """What ``restore`` puts back: the window's count so far (no copy, no host sync)."""
        return self._count, self._batches, self._reference, self.in_use

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Forget the micro-batches counted since ``snapshot`` (a step that ran out of memory)."""
        self._count, self._batches, self._reference, self.in_use = snapshot

    @property
    def agrees_on_reference(self) -> bool:
        """Whether the next ``weight`` exchanges the first reference with the other processes."""
        return self._reference is None and self._num_processes > 1

    def _first_reference(self, num_items: int | float | torch.Tensor) -> float | torch.Tensor:
        """The power of two of the processes' mean count of their first micro-batch."""
        if self._num_processes == 1 and not isinstance(num_items, torch.Tensor):
            return float(2.0 ** round(math.log2(max(num_items, 1))))
        count = torch.as_tensor(num_items).to(self._device, torch.float32).reshape(())
        if self._num_processes > 1:
            count = sum_across_processes(count.clone()) / self._num_processes
        return _power_of_two(count)

    def normalise(self, parameters: Iterable[torch.nn.Parameter], device: torch.device) -> None:
        """Divide the window's gradients by its elements over every process; start a new window.

        Call it on every process at the same point (the window's end, after DDP has averaged
        the gradients and before clipping).
        """
        if not self._batches:  # every batch of the window was skipped: no gradients
            return
        count = self._count
        if isinstance(count, torch.Tensor):
            total = count.to(device, reduction_dtype(device)).reshape(())
        else:  # a Python count: copied to the device without making the host wait
            host = torch.tensor(float(count), dtype=reduction_dtype(device))
            if device.type == "cuda":
                host = host.pin_memory()
            total = host.to(device, non_blocking=True)
        if self._num_processes > 1:
            total = sum_across_processes(total)
        total = total.clamp(min=1)
        assert self._reference is not None  # chosen by the window's first batch
        factor = (self._num_processes * self._reference) / total
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for parameter in parameters:
            if parameter.grad is not None:
                by_dtype.setdefault(parameter.grad.dtype, []).append(parameter.grad)
        for dtype, grads in by_dtype.items():
            torch._foreach_mul_(grads, factor.to(dtype))
        per_batch = total / (self._num_processes * self._batches)
        self._reference = _power_of_two(per_batch)
        self._count, self._batches = 0, 0

    def state_dict(self) -> dict[str, Any]:
        """Return the unfinished window's count and the reference, on the CPU (training states)."""
        return {
            "count": _to_cpu(self._count),
            "batches": self._batches,
            "reference": _to_cpu(self._reference),
            "in_use": self.in_use,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any], device: torch.device) -> None:
        """Restore what ``state_dict`` returned, with the tensors on ``device``."""
        count, reference = state_dict["count"], state_dict["reference"]
        self._count = count.to(device) if isinstance(count, torch.Tensor) else count
        self._batches = state_dict["batches"]
        self._reference = reference.to(device) if isinstance(reference, torch.Tensor) else reference
        self.in_use = state_dict["in_use"]


def _power_of_two(value: torch.Tensor) -> torch.Tensor:
    """The power of two nearest to ``value`` (at least 1), in float32, on its device."""
    return torch.exp2(torch.round(torch.log2(value.clamp(min=1)))).to(torch.float32)


def _to_cpu(value: int | float | torch.Tensor | None) -> int | float | torch.Tensor | None:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value

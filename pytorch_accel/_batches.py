"""What a batch holds and how it is weighted (the design: docs/hf-models.md).

**Accumulation windows** (``AccumulationPlan``): which micro-batches end an optimizer update,
and the ``1 / window size`` each one's loss is scaled by.

**Reading a batch**: ``(inputs, targets)``; a dict of the model's keyword arguments is read by
``_dict_batches``. Sizes come from tensor shapes: nothing here synchronises with the device.

**Token-exact gradient accumulation** (``ItemWeighting``), for steps whose ``batch_output``
carries ``num_items``: each micro-batch loss is back-propagated multiplied by
``num_items / reference``, and at the window's end, before clipping, the gradients are
multiplied by ``num_processes * reference / total`` (``total``: the window's elements summed
over micro-batches and processes, one all-reduce per window), so after DDP's average the
gradient is the mean over every element of the window. ``reference`` is a power of two agreed
by every process (of the previous window's mean count per micro-batch): it keeps the
back-propagated values at the size of a mean for gradient scalers, and changes no bit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pytorch_accel.distributed import reduce_across_processes
from pytorch_accel.tracking import reduction_dtype

__all__ = [
    "NUM_ITEMS_IN_BATCH",
    "AccumulationPlan",
    "ItemWeighting",
    "check_num_items",
    "inputs_and_targets",
]


NUM_ITEMS_IN_BATCH = "num_items_in_batch"
"""The key of a dict batch that counts its loss elements (Hugging Face's name for it)."""


def inputs_and_targets(batch: Any, method: str) -> tuple[Any, Any]:
    """Return ``batch[0], batch[1]``: the layout the default step methods read."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    layout = f"a {type(batch).__name__}" + (
        f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""
    )
    raise TypeError(
        f"Trainer.{method}: the default step reads batches as (inputs, targets), got {layout}. "
        f"Return (inputs, targets) from the dataset (or a collate_fn), or override {method} "
        "for other layouts (inputs only, several inputs); a dict batch is passed to the "
        "model as keyword arguments."
    )


def check_num_items(value: Any, method: str, name: str = "batch_output['num_items']") -> None:
    """Raise unless ``value`` is a count: a number at least 0, or a one-element tensor.

    No host synchronisation: a tensor's value is checked where the epoch's loss is read
    (``LoggedMetrics.end_epoch`` refuses a negative or NaN weight), a number here.

    Args:
        value: The count.
        method: The step method that returned it, for the message.
        name: How the message names it (``batch['num_items_in_batch']`` for a dict batch's).
    """
    if type(value) in (int, float):
        if value >= 0 and math.isfinite(value):
            return
        raise ValueError(
            f"Trainer.{method}: {name} must be the number of loss elements the batch's loss is "
            f"the mean of, at least 0, got {value!r}. Count them, e.g. (labels != -100).sum() "
            "for a token loss."
        )
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return
    shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise TypeError(
        f"Trainer.{method}: {name} must be the number of loss elements the batch's loss is "
        f"the mean of (an int, a float or a one-element tensor), got "
        f"{type(value).__name__}{shape} ({shown}). Return e.g. (labels != -100).sum() for a "
        "token loss."
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
        """Start a ``train()`` call, whose processes exchange their counts on ``device``."""
        self._num_processes, self._device, self.in_use = num_processes, device, None
        self._count, self._batches, self._reference = 0, 0, None

    def scaled_loss(
        self, batch_output: Mapping[str, Any], scale: float, step: int, epoch_index: int
    ) -> torch.Tensor:
        """Return the micro-batch loss to back-propagate: weighted by ``num_items`` or scaled.

        The run's first batch decides: if it carries ``num_items``, every batch is weighted by
        its count (and counted for ``normalise``); else each loss is multiplied by ``scale``,
        its share of the accumulation window. ``step`` and ``epoch_index`` are for messages.

        Raises:
            ValueError: If some of the run's batches carry ``num_items`` and others do not.
            TypeError: If ``num_items`` is not a number or a one-element tensor.
        """
        loss, num_items = batch_output["loss"], batch_output.get("num_items")
        if self.in_use is None:  # the run's first batch
            self.in_use = num_items is not None
            if not self.in_use and "num_items_in_batch" in batch_output:
                warnings.warn(
                    "Trainer.train: batch_output['num_items_in_batch'] is not interpreted (it "
                    "was pytorch-accelerated's key). For token-exact gradient accumulation "
                    "return 'num_items', the number of loss elements the batch's mean loss "
                    "averages (the loop then normalises each window by their total over all "
                    "processes); else rename the key.",
                    UserWarning,
                    stacklevel=2,
                )
        if num_items is None and not self.in_use:
            return loss if scale == 1.0 else loss * scale  # type: ignore[no-any-return]
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
        return loss * (num_items / self._reference)  # type: ignore[no-any-return]

    def snapshot(self) -> tuple[Any, ...]:
        """What ``restore`` puts back: the window's count so far (no copy, no host sync)."""
        return self._count, self._batches, self._reference, self.in_use

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Forget the micro-batches counted since ``snapshot`` (a step that ran out of memory)."""
        self._count, self._batches, self._reference, self.in_use = snapshot

    @property
    def agrees_on_reference(self) -> bool:
        """Whether the next weighted loss agrees on the first reference with the other processes."""
        return self._reference is None and self._num_processes > 1

    def _first_reference(self, num_items: int | float | torch.Tensor) -> float | torch.Tensor:
        """The power of two of the processes' mean count of their first micro-batch."""
        if self._num_processes == 1 and not isinstance(num_items, torch.Tensor):
            return float(2.0 ** round(math.log2(max(num_items, 1))))
        count = torch.as_tensor(num_items).to(self._device, torch.float32).reshape(())
        if self._num_processes > 1:
            count = reduce_across_processes(count.clone()) / self._num_processes
        return _power_of_two(count)

    def normalise(self, parameters: Iterable[torch.nn.Parameter], device: torch.device) -> None:
        """Divide the window's gradients by its elements over every process; start a new window.

        On every process at the window's end, after DDP has averaged and before clipping.
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
            total = reduce_across_processes(total)
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


@dataclass(frozen=True)
class AccumulationPlan:
    """The gradient accumulation windows of one epoch.

    Windows of ``steps`` micro-batches, the last holding the remainder, each ending in an
    update. Each loss is scaled by ``1 / len(its window)``, so the update follows the mean
    gradient of the window's batches, also for a short last window. Over data without a length
    every loss is scaled by ``1 / steps``.

    Args:
        num_batches: Micro-batches in the epoch, or ``None`` when it is not known.
        steps: Micro-batches per full window (``gradient_accumulation_steps``).
    """

    num_batches: int | None
    steps: int

    def is_update(self, step: int) -> bool:
        """Return whether micro-batch ``step`` (0-based) ends its window."""
        return (step + 1) % self.steps == 0 or step + 1 == self.num_batches

    def loss_scale(self, step: int) -> float:
        """Return the factor that scales micro-batch ``step``'s loss: 1 / window size."""
        if self.num_batches is None:
            return 1.0 / self.steps
        window_start = step - step % self.steps
        return 1.0 / min(self.steps, self.num_batches - window_start)

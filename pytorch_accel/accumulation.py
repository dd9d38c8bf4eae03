"""Gradient accumulation windows: which micro-batches update, and how each loss is scaled."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AccumulationPlan"]


@dataclass(frozen=True)
class AccumulationPlan:
    """The accumulation windows of one epoch.

    The epoch's micro-batches are cut into windows of ``steps`` batches; the last window holds
    the remainder. An optimizer update happens at the end of each window. Each micro-batch
    loss is scaled by ``1 / len(its window)``, so the update follows the mean gradient of the
    window's batches, also for a short last window.

    Over data without a length (``num_batches`` is ``None``, an ``IterableDataset``) every
    micro-batch loss is scaled by ``1 / steps``; the loop ends the last window of a pass early,
    when the dataloader says it yielded its last batch, so that window's update follows the
    sum of its gradients divided by ``steps``.

    Args:
        num_batches: Micro-batches in the epoch, or ``None`` when it is not known.
        steps: Micro-batches per full window (``gradient_accumulation_steps``).
    """

    num_batches: int | None
    steps: int

    @property
    def num_updates(self) -> int | None:
        """Optimizer updates in the epoch (``None`` when its length is not known)."""
        return None if self.num_batches is None else math.ceil(self.num_batches / self.steps)

    def is_update(self, step: int) -> bool:
        """Return whether micro-batch ``step`` (0-based) ends its window."""
        return (step + 1) % self.steps == 0 or step + 1 == self.num_batches

    def loss_scale(self, step: int) -> float:
        """Return the factor that scales micro-batch ``step``'s loss: 1 / window size."""
        if self.num_batches is None:
            return 1.0 / self.steps
        window_start = step - step % self.steps
        return 1.0 / min(self.steps, self.num_batches - window_start)

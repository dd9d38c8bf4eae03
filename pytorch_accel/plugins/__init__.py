"""Step guards beside the loop: plugins on the loop's one around-step hook.

The loop's training step reads straight through (forward, weighting, backward, update); when
``train()`` asks for a guard (``skip_failing_batches=...`` or ``on_oom="split"``), the loop
hands the step's parts (``TrainStep``) to the guard's ``run_step`` instead, and asks it at each
window's end whether the loop must synchronise the replicas and whether to update. A plain
``train()`` imports none of the modules here.

- ``failing_batches``: skip a batch whose step method fails (``FailingBatchGuard``).
- ``micro_batches``: on out-of-memory, run the step in more micro-batches
  (``MicroBatchSplitter``).
- ``nan_origin``: where a non-finite loss starts, for ``TerminateOnNaNCallback(report_origin=True)``
  (driven by the callback's step events, not by the step hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from pytorch_accel._batches import ItemWeighting

__all__ = ["StepGuard", "TrainStep"]


class TrainStep(Protocol):
    """The parts of one training step that the loop hands to a ``StepGuard``."""

    @property
    def item_weighting(self) -> ItemWeighting:
        """The run's weighting of losses (by ``num_items`` in a token-exact run)."""

    @property
    def model(self) -> torch.nn.Module:
        """The model being trained."""

    @property
    def num_updates(self) -> int:
        """The updates done in this ``train()`` call."""

    def position(self) -> str:
        """Where the step is, for messages: ``"step <n> of epoch <m>"``."""

    def forward(self, batch: Any) -> Any:
        """Run ``calculate_train_batch_loss`` on ``batch``; return its output, unchecked."""

    def scaled_loss(self, batch_output: dict[str, Any], scale: float) -> torch.Tensor:
        """Return the output's loss weighted for back-propagation (``scale``: its share)."""

    def backward(self, batch_output: dict[str, Any], scaled: torch.Tensor, batch: Any) -> None:
        """Back-propagate ``scaled`` (the output's weighted loss), with the backward events."""

    def track(self, batch_output: dict[str, Any]) -> None:
        """Track the step's loss and logged values."""


class StepGuard(Protocol):
    """A plugin that runs each training step of a ``train()`` call in the loop's stead."""

    def run_step(self, step: TrainStep, batch: Any, scale: float) -> dict[str, Any]:
        """Forward, track and back-propagate ``batch``; return the step's ``batch_output``."""

    def synchronises(self, model: torch.nn.Module) -> bool:
        """Whether the loop, not DDP, synchronises ``model``'s replicas at a window's end."""

    def end_window(self) -> bool:
        """Whether the window that ends here has gradients (the loop then updates)."""

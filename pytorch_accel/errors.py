"""The exception that ends a run cleanly, and the one that keeps ``predict``'s outputs.

``StopTrainingError`` is re-exported as ``pytorch_accel.callbacks.StopTrainingError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CallbackMethodNotImplementedError", "PredictOutputsError", "StopTrainingError"]


class StopTrainingError(Exception):
    """Raise in any trainer hook or callback to stop the run cleanly.

    The open epoch and run levels are closed (their end events fire), then
    ``on_stop_training_error`` and the run's end events fire. ``train()`` returns normally.
    """


class CallbackMethodNotImplementedError(Exception):
    """pytorch-accelerated's signal that a callback lacks an event's method; kept for ported code.

    pytorch-accel never raises it: a callback is called only for the events it defines.
    """


class PredictOutputsError(ValueError):
    """``Trainer.predict`` computed every batch, but their outputs cannot be concatenated.

    Raised when the batches' outputs differ in the dimensions after the first (sequences of
    varying length) or in structure. Nothing computed is lost: ``batches`` holds them.

    Attributes:
        batches: Every batch's outputs, in order, as ``predict`` gathered them (from every
            process, moved to its ``output_device``), ready to pad or write out.
    """

    def __init__(self, message: str, batches: list[Any]) -> None:
        super().__init__(message)
        self.batches = batches

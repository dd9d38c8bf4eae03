"""The exception that ends a run cleanly.

Part of the core: the loop catches it and every layer above may raise it. It is re-exported as
``pytorch_accel.callbacks.StopTrainingError``, where pytorch-accelerated users import it from.
"""

from __future__ import annotations

__all__ = ["CallbackMethodNotImplementedError", "StopTrainingError"]


class StopTrainingError(Exception):
    """Raise in any trainer hook or callback to stop the run cleanly.

    The open epoch and run levels are closed (their end events fire), then
    ``on_stop_training_error`` and the run's end events fire. ``train()`` returns normally.
    """


class CallbackMethodNotImplementedError(Exception):
    """pytorch-accelerated's signal that a callback lacks an event's method; kept for ported code.

    pytorch-accel never raises it: a callback is called only for the events it defines.
    """

"""``CallbackHandler`` under its earlier import path (defined in ``pytorch_accel.callback``)."""

from __future__ import annotations

from pytorch_accel.callback import CallbackHandler, CallbackLike

__all__ = ["CallbackHandler", "CallbackLike"]

"""The callback handler, where users import it from.

Defined in the core (``pytorch_accel.callback``), which the loop builds on; this module keeps
the import path of earlier releases.
"""

from __future__ import annotations

from pytorch_accel.callback import CallbackHandler, CallbackLike

__all__ = ["CallbackHandler", "CallbackLike"]

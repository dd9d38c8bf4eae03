"""The callback base class and the exception that stops training, where users import them.

Both are defined in the core (``pytorch_accel.callback`` and ``pytorch_accel.errors``), which
the loop builds on; this module keeps pytorch-accelerated's import path.
"""

from __future__ import annotations

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.errors import StopTrainingError

__all__ = ["StopTrainingError", "TrainerCallback"]

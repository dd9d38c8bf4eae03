"""``TrainerCallback`` and ``StopTrainingError`` under pytorch-accelerated's import path.

Both are defined in the core: ``pytorch_accel.callback`` and ``pytorch_accel.errors``.
"""

from __future__ import annotations

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.errors import StopTrainingError

__all__ = ["StopTrainingError", "TrainerCallback"]

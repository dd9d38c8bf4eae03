"""pytorch-accel: a callback-centric PyTorch Trainer on accelerate.

The API of pytorch-accelerated, with its known defects fixed: port code by changing the import.
"""

import logging

from accelerate import notebook_launcher
from accelerate.utils import set_seed

from pytorch_accel.errors import PredictOutputsError
from pytorch_accel.failing_batches import SkipFailingBatches
from pytorch_accel.placeholders import TrainerPlaceholderValues
from pytorch_accel.trainer import Trainer

__version__ = "0.1.0"

accelerate_notebook_launcher = notebook_launcher
"""pytorch-accelerated's name for accelerate's ``notebook_launcher``."""

logger = logging.getLogger("pytorch_accel")
"""The library's logger (pytorch-accelerated's ``logger``); configure it with ``logging``."""

__all__ = [
    "PredictOutputsError",
    "SkipFailingBatches",
    "Trainer",
    "TrainerPlaceholderValues",
    "__version__",
    "accelerate_notebook_launcher",
    "logger",
    "notebook_launcher",
    "set_seed",
]

"""pytorch-accel: a callback-centric PyTorch Trainer on accelerate.

The API of pytorch-accelerated, with its known defects fixed: port code by changing the import.
"""

from accelerate import notebook_launcher
from accelerate.utils import set_seed

from pytorch_accel.placeholders import TrainerPlaceholderValues
from pytorch_accel.trainer import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "TrainerPlaceholderValues", "__version__", "notebook_launcher", "set_seed"]

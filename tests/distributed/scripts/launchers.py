"""Multi-process CPU runs configure themselves, or fail with the exact fix."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from accelerate import Accelerator
from common import flat_params, report_and_exit
from helpers import make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ConvertSyncBatchNormCallback


class PlainAcceleratorTrainer(Trainer):
    def _create_accelerator(self) -> Accelerator:
        return Accelerator()


def automatic() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(
            model,
            nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            callbacks=(ConvertSyncBatchNormCallback(),),
        )
    trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    return {
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "params": flat_params(trainer.get_model()),
        "batchnorm": type(trainer.get_model()[1]).__name__,
        "warnings": [str(w.message) for w in caught if "SyncBatchNorm" in str(w.message)],
    }


def mismatch() -> dict[str, Any]:
    model = nn.Linear(4, 1)
    try:
        PlainAcceleratorTrainer(
            model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ()
        )
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


if __name__ == "__main__":
    report_and_exit(automatic() if sys.argv[2] == "automatic" else mismatch())

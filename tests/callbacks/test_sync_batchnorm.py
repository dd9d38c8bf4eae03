"""ConvertSyncBatchNormCallback in one process (the 2-process case is in tests/distributed)."""

from __future__ import annotations

import torch
from helpers import make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ConvertSyncBatchNormCallback


def test_single_process_leaves_batchnorm_and_trains() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(ConvertSyncBatchNormCallback(),),
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert type(trainer.get_model()[1]) is nn.BatchNorm1d
    assert trainer.callback_handler.callback_list == ["ConvertSyncBatchNormCallback"]

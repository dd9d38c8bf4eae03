"""Loss spikes across 2 processes: one spike on rank 1's batch; both skip or roll back (argv[2]).

Each rank trains 8 updates of 4 samples (Adam, unshuffled); rank 1's 6th batch has huge
targets. The ranks report what the callback did, their weights, and (computed on each) the
weights of one process training on the same updates' 8 samples without the skipped batches.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

import torch
from common import flat_params, report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import LossSpikeCallback

RANK = int(os.environ["RANK"])
SPIKE = 6  # rank 1's 6th batch (update 6)


class SpikeOnRankOne(Trainer):
    """Adds 1e4 to the targets of rank 1's ``SPIKE``-th batch."""

    calls = 0

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.calls += 1
        if RANK == 1 and self.calls == SPIKE:
            batch = (batch[0], batch[1] + 1e4)
        return super().calculate_train_batch_loss(batch)


def reference(skipped: set[int]) -> list[float]:
    """One process, Adam, each update on the 8 samples the 2 ranks' batches hold."""
    model = copy.deepcopy(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    inputs, targets = make_regression_dataset(64).tensors
    for index in range(8):
        if index + 1 in skipped:
            continue
        part = slice(index * 8, (index + 1) * 8)
        nn.MSELoss()(model(inputs[part]), targets[part]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_params(model)


def run(action: str) -> dict[str, Any]:
    model = make_model()
    spikes = LossSpikeCallback(action, factor=5.0, window=8, min_history=3, check_every_n_updates=2)
    trainer = SpikeOnRankOne(
        model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=0.01), callbacks=(spikes,)
    )
    trainer.train(
        make_regression_dataset(64),
        num_epochs=1,
        per_device_batch_size=4,
        train_dataloader_kwargs={"shuffle": False},
    )
    skipped = {SPIKE} if action == "skip" else {SPIKE - 1, SPIKE}
    return {
        "updates": trainer.num_updates,
        "skipped_updates": spikes.skipped_updates,
        "rollbacks": spikes.rollbacks,
        "params": flat_params(trainer.get_model()),
        "reference": reference(skipped),
    }


def main() -> None:
    report_and_exit({"result": run(sys.argv[2])})


if __name__ == "__main__":
    main()

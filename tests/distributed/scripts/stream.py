"""An IterableDataset in 2 processes: accelerate reads it on the main process and shares each
batch out; the run equals one process training on the combined batches."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from common import max_difference, report_and_exit
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel import Trainer

INPUTS = torch.linspace(-1, 1, 24 * 4).reshape(24, 4)
TARGETS = INPUTS.sum(dim=1, keepdim=True)


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from zip(INPUTS, TARGETS, strict=True)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.train(Stream(), max_num_train_steps=7, per_device_batch_size=4)
    # one process, the two processes' batches side by side: 8 samples per update
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    done = 0
    while done < 7:
        for inputs, targets in DataLoader(Stream(), batch_size=8):
            nn.functional.mse_loss(reference(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == 7:
                break
    report_and_exit(
        {
            "num_updates": trainer.num_updates,
            "passes": len(trainer.run_history.get_metric_values("train_loss_epoch")),
            "difference": max_difference(trainer.get_model(), reference),
        }
    )


if __name__ == "__main__":
    main()

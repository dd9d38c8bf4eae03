"""``on_oom="split"`` and ``find_batch_size`` over 2 processes, out of memory on rank 1 only.

One launch: a reference run that never runs out of memory, the same run where rank 1 runs out
of memory half-way through a backward pass inside an accumulation window (every rank must
split with it, none may wait in DDP), then a batch-size search where only rank 1 is limited.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import make_regression_dataset
from test_micro_batches import OutOfMemoryAbove
from torch import nn

from pytorch_accel import Trainer

RANK = int(os.environ["RANK"])


def trainer_for(model: nn.Module) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=())


def train(limit: int, on_oom: str) -> dict[str, Any]:
    trainer = trainer_for(OutOfMemoryAbove(limit, in_backward=True, from_call=4))
    trainer.train(
        make_regression_dataset(128),
        num_epochs=2,
        per_device_batch_size=16,
        gradient_accumulation_steps=2,
        on_oom=on_oom,  # type: ignore[arg-type]
    )
    splitter = trainer._state.micro_batches
    return {
        "params": flat_params(trainer.model),
        "updates": trainer.num_updates,
        "splits": None if splitter is None else splitter.splits,
    }


def main() -> None:
    reference = train(1_000, "raise")
    split = train(5 if RANK == 1 else 1_000, "split")
    search = trainer_for(OutOfMemoryAbove(12 if RANK == 1 else 1_000, in_backward=True))
    found = search.find_batch_size(make_regression_dataset(128), mode="binsearch")
    report_and_exit({"reference": reference, "split": split, "found": found})


if __name__ == "__main__":
    main()

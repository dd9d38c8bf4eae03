"""A stream that saves its position, in 2 processes: stopped mid-pass and resumed, the run
equals the uninterrupted one bitwise, and the resumed run reads none of the samples trained on.

Each process reads the whole stream and keeps its part of each round of 2 batches (accelerate's
``IterableDatasetShard``, on the CPU). Modes: the dataset's own ``state_dict`` read by the
trainer; torchdata's ``StatefulDataLoader``; the same with 2 workers (replayed: each worker's
shard completes its last round with its own first samples).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DataLoaderConfiguration
from common import report_and_exit
from torch import nn
from torch.utils.data import IterableDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.errors import StopTrainingError

INPUTS = torch.linspace(-1, 1, 24 * 4).reshape(24, 4)
TARGETS = INPUTS.sum(dim=1, keepdim=True)


class PositionedStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """INPUTS in an order drawn per pass from its own seed; split between workers."""

    def __init__(self) -> None:
        self.epoch, self.index, self.loaded = 0, 0, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        order = torch.randperm(24, generator=torch.Generator().manual_seed(self.epoch))
        while self.index < 24:
            index, self.index = int(order[self.index]), self.index + 1
            if (self.index - 1) % workers == worker:
                self.loaded += 1
                yield INPUTS[index], TARGETS[index]
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


class StopAfter(TrainerCallback):
    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step, self.seen = path, step, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.step:
            trainer.save_training_state(self.path)
            raise StopTrainingError("stopped to resume")


def run(mode: str, *callbacks: TrainerCallback, resume_from: Path | None = None) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    config = DataLoaderConfiguration(use_stateful_dataloader=mode != "dataset")
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks,
        accelerator_kwargs={"dataloader_config": config},
    )
    dataset = PositionedStream()
    trainer.train(
        dataset,
        max_num_train_steps=7,
        per_device_batch_size=4,
        resume_from=resume_from,
        train_dataloader_kwargs={"num_workers": 2 if mode == "workers" else 0},
    )
    trainer.loaded = dataset.loaded  # type: ignore[attr-defined]
    return trainer


def main() -> None:
    out = Path(sys.argv[1])
    results: dict[str, Any] = {}
    for mode in ("dataset", "stateful", "workers"):
        uninterrupted = run(mode)
        path = out / f"state-{mode}"
        run(mode, StopAfter(path, 5))  # the 2nd round of the 2nd pass (3 rounds per pass)
        resumed = run(mode, resume_from=path)
        results[mode] = {
            "equal": all(
                torch.equal(a, b)
                for a, b in zip(
                    resumed.get_model().parameters(),
                    uninterrupted.get_model().parameters(),
                    strict=True,
                )
            ),
            "num_updates": resumed.num_updates,
            "loaded": resumed.loaded,  # type: ignore[attr-defined]
        }
    report_and_exit(results)


if __name__ == "__main__":
    main()

"""Several training sets over 2 processes: each split across them, per-set losses, exact resume."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback


def regression_data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 4, generator=generator)
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))


SETS = {"a": regression_data(20, 1), "b": regression_data(9, 2)}
SAMPLE_IDS = {
    tuple(row.tolist()): [name, index]
    for name, data in SETS.items()
    for index, row in enumerate(data.tensors[0])
}


class StepRecorder(TrainerCallback):
    """Records each step's samples (by set and index) and its loss, read on the host."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        inputs = batch[0]
        self.steps.append(
            {
                "epoch": trainer.run_history.current_epoch - 1,  # 1-based
                "samples": [SAMPLE_IDS[tuple(row.tolist())] for row in inputs.cpu()],
                "loss": batch_output["loss"].item(),
            }
        )


class SaveAndStop(TrainerCallback):
    order = 1000

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step, self.seen = path, step, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.step:
            trainer.save_training_state(self.path)
            raise StopTrainingError("")


def trainer(*callbacks: TrainerCallback) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks)


def main() -> None:
    out_dir = Path(sys.argv[1])
    arguments: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 2, "seed": 4}
    recorder = StepRecorder()
    whole = trainer(recorder)
    whole.train(SETS, **arguments)
    history = whole.run_history
    names = ("train_loss_epoch", "train_loss_a_epoch", "train_loss_b_epoch")
    # 15 batches per epoch: 8 per process; save after 3 steps of the second epoch
    trainer(SaveAndStop(out_dir / "state", 8 + 3)).train(SETS, **arguments)
    resumed = trainer()
    resumed.train(SETS, resume_from=out_dir / "state", **arguments)
    pairs = zip(whole.model.parameters(), resumed.model.parameters(), strict=True)
    report_and_exit(
        {
            "steps": recorder.steps,
            "metrics": {name: history.get_metric_values(name) for name in names},
            "resumed_metrics": {
                name: resumed.run_history.get_metric_values(name) for name in names
            },
            "resumed_equal": all(torch.equal(a, b) for a, b in pairs),
        }
    )


if __name__ == "__main__":
    main()

"""A stop raised on one process stops every process at the same point; files written once."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import RecordingCallback, make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TerminateOnNaNCallback, TrainerCallback

RANK = int(os.environ["RANK"])


class StopOnRankOne(TrainerCallback):
    def __init__(self, event: str, at: int) -> None:
        self.event, self.at, self.calls = event, at, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._maybe("on_train_step_end")

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._maybe("on_training_run_epoch_end")

    def _maybe(self, event: str) -> None:
        if event == self.event:
            self.calls += 1
            if RANK == 1 and self.calls == self.at:
                raise StopTrainingError("rank-local stop")


class NaNOnRankOne(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.mse_loss(predictions, targets)
        return loss * math.nan if RANK == 1 and self.calls == 3 else loss


def run(
    callbacks: tuple[Any, ...], loss: nn.Module | None = None, epochs: int = 3
) -> dict[str, Any]:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    recorder = RecordingCallback()
    model = make_model()
    trainer = Trainer(
        model,
        loss or nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*callbacks, recorder),
    )
    trainer.train(
        make_regression_dataset(64),
        num_epochs=epochs,
        eval_dataset=make_regression_dataset(10),
        per_device_batch_size=4,
    )
    return {
        "updates": trainer.num_updates,
        "tail": recorder.events[-3:],
        "epochs_started": recorder.events.count("on_train_epoch_start"),
    }


def checkpoint_and_print(out_dir: Path) -> dict[str, Any]:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=()
    )
    trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    path = out_dir / "model.pt"
    trainer.save_checkpoint(path)
    trained = flat_params(trainer.get_model())
    other_model = make_model(seed=3)
    other = Trainer(
        other_model, nn.MSELoss(), torch.optim.SGD(other_model.parameters(), lr=0.05), ()
    )
    other.load_checkpoint(path)
    trainer.print("PRINTED-ONCE")
    files = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("rank"))
    return {"loaded_equal": flat_params(other.get_model()) == trained, "files": files}


def main() -> None:
    out_dir = Path(os.sys.argv[1])
    report_and_exit(
        {
            "step_stop": run((StopOnRankOne("on_train_step_end", 3),)),
            "epoch_stop": run((StopOnRankOne("on_training_run_epoch_end", 1),)),
            "nan_stop": run((TerminateOnNaNCallback(check_every_n_steps=1),), loss=NaNOnRankOne()),
            # read from the epoch loss, the same on every process: agreed without an exchange
            "nan_epoch_stop": run((TerminateOnNaNCallback(),), loss=NaNOnRankOne()),
            "checkpoint": checkpoint_and_print(out_dir),
        }
    )


if __name__ == "__main__":
    main()

"""``Trainer.log`` in two processes: the values combined across them, and the collectives.

Each rank logs ``10 * rank + s`` at its local step ``s`` (0 to 7) of each epoch, as a mean, a
sum and a maximum, and returns a loss component equal to its rank; a callback logs the rank
between epochs. The collectives are counted as in ``collectives.py`` (same counter), once
with step logging alone and once with the logging above.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from collectives import COUNTER, Phases
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrackingCallback, TrainerCallback

RANK = int(os.environ["RANK"])


class LogsRankValues(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        value = torch.tensor(10.0 * RANK + self._state.step)  # the local step in the epoch
        self.log("value", value)
        self.log("value_sum", value, reduce="sum")
        self.log_dict({"value_max": value, "loss_max": output["loss"]}, reduce="max")
        return {**output, "rank_part": torch.tensor(float(RANK))}


class LogsBetweenEpochs(TrainerCallback):
    may_stop_training = False  # else the trainer would agree on stops after it

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.log("rank", float(RANK))


def run(trainer_class: type[Trainer], out_dir: Path, *callbacks: Any) -> dict[str, Any]:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    model.register_forward_pre_hook(COUNTER.mark)
    tracking = TrackingCallback(
        log_with=(), csv_path=out_dir / "metrics.csv", log_every_n_updates=4
    )
    trainer = trainer_class(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, tracking, *callbacks, Phases()),
    )
    COUNTER.marks = []
    before = len(COUNTER.calls)
    trainer.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    history = trainer.run_history
    steps_csv = out_dir / "metrics_steps.csv"
    return {
        "collectives": len(COUNTER.calls) - before,
        "train": COUNTER.per_batch("train1") + COUNTER.per_batch("train2"),
        "history": {name: history.get_metric_values(name) for name in history.get_metric_names()},
        "steps": list(csv.DictReader(steps_csv.open())) if RANK == 0 else [],
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    COUNTER.install()
    results = {
        "plain": run(Trainer, out_dir / "plain"),
        "logging": run(LogsRankValues, out_dir / "logging", LogsBetweenEpochs()),
    }
    report_and_exit(results)


if __name__ == "__main__":
    main()

"""Three train() calls continuing one run, in 2 processes: one step series, stage 3's model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    RunRecordCallback,
    SaveBestModelCallback,
    TrainerCallback,
)


class ScriptedScore(TrainerCallback):
    """The same scripted score on every process; the first epoch's is the best."""

    may_stop_training = False

    def __init__(self) -> None:
        self.values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        self.last_weights: list[float] = []

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.run_history.update_metric("score", self.values.pop(0))
        self.last_weights = [float(p.sum()) for p in trainer.get_model().parameters()]


def main() -> None:
    out = Path(sys.argv[1])
    model = make_model()
    scores = ScriptedScore()
    saver = SaveBestModelCallback(
        out / "best.pt", watch_metric="score", greater_is_better=False, reset_on_train=False
    )
    record = RunRecordCallback(out / "run", log_every_n_updates=3, plot=False)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, scores, saver, record),
    )
    counts = []
    for stage in range(3):
        trainer.train(
            make_regression_dataset(32),  # 4 updates per epoch on each of 2 processes
            num_epochs=2,
            eval_dataset=make_regression_dataset(12, seed=1),
            per_device_batch_size=4,
            reset_run_history=stage == 0,
        )
        counts.append([trainer.num_updates, trainer.global_num_updates])
    record.finish()
    print("AFTER-TRAINING", flush=True)
    report_and_exit(
        {
            "counts": counts,
            "final_weights": [float(p.sum()) for p in trainer.get_model().parameters()],
            "last_epoch_weights": scores.last_weights,
            "best_epoch": saver.best_metric_epoch,
        }
    )


if __name__ == "__main__":
    main()

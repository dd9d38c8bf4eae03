"""A run record in a 2-process run: written once, by the main process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, RunRecordCallback


def main() -> None:
    out = Path(sys.argv[1])
    model = make_model()
    record = RunRecordCallback(out / "run", {"lr": 0.05, "seed": 0}, log_every_n_updates=4)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, record),
    )
    trainer.train(
        make_regression_dataset(32),  # 4 updates per epoch on each of 2 processes
        num_epochs=2,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=4,
    )
    print("AFTER-TRAINING", flush=True)
    history = trainer.run_history
    open_trackers = len(record.trackers)  # open while the run may continue
    record.finish()
    report_and_exit(
        {
            "train_loss_epoch": list(history.get_metric_values("train_loss_epoch")),
            "num_updates": trainer.num_updates,
            "trackers": open_trackers,
            "trackers_after_finish": len(record.trackers),
        }
    )


if __name__ == "__main__":
    main()

"""One run directory in a 2-process run, though the processes' local clocks differ."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TrackingCallback,
)

# each rank's local time is in another time zone: names drawn on each would differ by hours
os.environ["TZ"] = "UTC" if os.environ["RANK"] == "0" else "Asia/Tokyo"
time.tzset()


def make(output_dir: Path) -> Trainer:
    model = make_model()
    callbacks = (
        *DEFAULT_CALLBACKS,
        SaveTrainingStateCallback(save_every_n_epochs=1),
        SaveBestModelCallback(),
        TrackingCallback(log_with=()),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks, output_dir=output_dir)


def train(trainer: Trainer, num_epochs: int, **kwargs: object) -> None:
    trainer.train(
        make_regression_dataset(32),
        num_epochs=num_epochs,
        eval_dataset=make_regression_dataset(8, seed=1),
        per_device_batch_size=4,
        **kwargs,
    )


def main() -> None:
    output_dir = Path(sys.argv[1]) / "runs"
    first = make(output_dir)
    drawn = str(first.run_dir)
    train(first, num_epochs=1)
    relaunched = make(output_dir)  # a second launch of the job, resuming the first
    drawn_again = str(relaunched.run_dir)
    train(relaunched, num_epochs=2, resume_from="latest")
    # a new run given the first run's name, not resuming: refused on every process
    refused = ""
    try:
        train(make(output_dir), num_epochs=1, run_name=first.run_dir.name)  # type: ignore[union-attr]
    except ValueError as error:
        refused = str(error)
    print("AFTER-TRAINING", flush=True)
    report_and_exit(
        {
            "local_hour": time.strftime("%H"),
            "drawn": drawn,
            "after_first": str(first.run_dir),
            "drawn_again": drawn_again,
            "after_resume": str(relaunched.run_dir),
            "resumed_from": str(relaunched.resumed_from),
            "refused": refused,
        }
    )


if __name__ == "__main__":
    main()

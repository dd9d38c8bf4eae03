"""Ctrl-C in a 2-process run: argv[2] is "save" (save_on_interrupt) or "plain".

Each rank writes ``started<RANK>`` once it trained a few steps; the test then sends SIGINT to
the whole process group (torchrun and its workers), as a terminal's Ctrl-C does. Each rank
reports the exceptions its ``on_exception`` received and how ``train()`` ended.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.training_state import find_training_states

RANK = int(os.environ["RANK"])
OUT = Path(sys.argv[1])


class Report(TrainerCallback):
    may_stop_training = False

    def __init__(self) -> None:
        self.steps, self.seen = 0, []

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps += 1
        time.sleep(0.01)
        if self.steps == 5:
            (OUT / f"started{RANK}").write_text("yes")

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self.seen.append(type(exception).__name__)


def main() -> None:
    save = sys.argv[2] == "save"
    report = Report()
    callbacks: list[TrainerCallback] = [report]
    if save:
        callbacks.append(
            SaveTrainingStateCallback(
                OUT / "states", save_on_interrupt=True, preemption_check_interval=0.05
            )
        )
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks)
    outcome = "returned"
    try:
        trainer.train(make_regression_dataset(4096), num_epochs=50, per_device_batch_size=4)
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    states = [path.name for path in find_training_states(OUT / "states")] if save else []
    result = {"seen": report.seen, "outcome": outcome, "updates": trainer.num_updates}
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**result, "states": states}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

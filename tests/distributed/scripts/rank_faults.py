"""One process does what the others do not: log a name, log another name, fail in a step.

``argv[2]`` names the scenario. Each rank records the error that ended its ``train()`` (type
and message) and the seconds it took, writes ``rank<N>.json`` and exits without touching the
process group again (a failed run leaves it unusable).
"""

from __future__ import annotations

import csv
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
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    StepLoggingCallback,
    StopTrainingError,
    TrackingCallback,
)

RANK = int(os.environ["RANK"])
SCENARIO = sys.argv[2]


class Faulty(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        step = self._state.step
        if SCENARIO == "log_one_rank" and RANK == 1 and step == 2:
            self.log("rare_event", 1.0)
        if SCENARIO == "log_other_names":
            self.log("a" if RANK == 0 else "b", 1.0 if RANK == 0 else 3.0)
        if SCENARIO == "log_one_rank_steps" and RANK == 0 and step == 1:
            self.log("rare_event", 1.0)
        if SCENARIO == "log_many_names":  # more than an interval's exchange has room for
            self.log_dict({f"n{index}": float(RANK + index) for index in range(10)})
        if SCENARIO == "stop_in_step" and RANK == 1 and step == 3:
            raise StopTrainingError("rank 1 has seen enough")
        if SCENARIO == "raise_in_step" and RANK == 1 and step == 3:
            raise ValueError("rank 1's batch is bad")
        return output

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_eval_batch_loss(batch)
        if SCENARIO == "log_one_rank_eval" and RANK == 0:
            self.log("eval_only_here", 2.0)
        return output


def main() -> None:
    out_dir = Path(sys.argv[1])
    model = make_model()
    callbacks: tuple[Any, ...] = DEFAULT_CALLBACKS
    if SCENARIO == "log_one_rank_steps":
        callbacks = (*callbacks, StepLoggingCallback(log_every_n_updates=2))
    if SCENARIO == "log_many_names":
        csv_path = out_dir / "metrics.csv"
        callbacks = (
            *callbacks,
            TrackingCallback(log_with=(), csv_path=csv_path, log_every_n_updates=2),
        )
    trainer = Faulty(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks
    )
    report: dict[str, Any] = {"rank": RANK}
    started = time.monotonic()
    try:
        trainer.train(
            make_regression_dataset(64),
            num_epochs=2,
            per_device_batch_size=4,
            eval_dataset=make_regression_dataset(16) if SCENARIO.endswith("eval") else None,
        )
        report["error"] = None
    except BaseException as error:  # recorded for the test to judge
        report["error"] = type(error).__name__
        report["message"] = str(error)
    report["seconds"] = time.monotonic() - started
    steps_csv = out_dir / "metrics_steps.csv"
    if RANK == 0 and steps_csv.exists():
        report["steps"] = list(csv.DictReader(steps_csv.open()))
    report["history"] = {
        name: trainer.run_history.get_metric_values(name)
        for name in trainer.run_history.get_metric_names()
    }
    Path(out_dir, f"rank{RANK}.json").write_text(json.dumps(report))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if report["error"] else 0)


if __name__ == "__main__":
    main()

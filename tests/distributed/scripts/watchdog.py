"""One process stalls (``argv[2]``: the scenario); the watchdog names it and ends the job.

Scenarios, on process 1 (the only one with ``single``), at its 4th batch of epoch 1:

- ``sigstop``: inside the step it stops itself with ``SIGSTOP`` (it can no longer write);
- ``sleep``: it sleeps 60 s inside ``calculate_train_batch_loss``;
- ``worker``: its data loader's worker blocks 60 s in ``__getitem__`` (``num_workers=1``);
- ``single``: one process, no torchrun, sleeps 60 s inside the step;
- ``evaluate``: one process, no torchrun, sleeps 60 s in its 3rd batch of ``evaluate()``;
- ``healthy``: no stall; process 1 is slower in every step (a straggler) and each evaluation
  takes longer than the watchdog's timeout, its steps each shorter: nothing fires.

Before stalling, the process writes ``stall.json`` (the wall-clock time) in the output
directory. The watchdog writes into ``<out_dir>/watchdog``; a healthy run writes
``rank<N>.json`` with its run history.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.utils.data import Dataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, WatchdogCallback

RANK = int(os.environ.get("RANK", "0"))
SCENARIO = sys.argv[2]
OUT = Path(sys.argv[1])
STALLING = 0 if SCENARIO in ("single", "evaluate") else 1
STALL_AT = 3  # the 4th batch of the first epoch


def stall_mark() -> None:
    (OUT / "stall.json").write_text(json.dumps({"time": time.time(), "rank": RANK}))


class Stalling(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        stalls = RANK == STALLING and self.run_history.current_epoch == 1
        if stalls and SCENARIO == "healthy":
            time.sleep(0.05)  # a straggler: every step of this process is slower
        elif stalls and SCENARIO != "worker" and self._state.step == STALL_AT:
            stall_mark()
            if SCENARIO == "sigstop":  # its heartbeat says where it is, then it stops
                time.sleep(1.5)
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(60)
        return super().calculate_train_batch_loss(batch)

    eval_batches = 0

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.eval_batches += 1
        if SCENARIO == "evaluate" and self.eval_batches == 3:
            stall_mark()
            time.sleep(60)
        if SCENARIO == "healthy" and self.run_history.current_epoch == 1:
            time.sleep(0.6)  # 6 eval batches: 3.6 s, longer than the timeout
        return super().calculate_eval_batch_loss(batch)


class BlockingData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Its worker on process 1 blocks at its 13th item (inside the 4th batch of 4)."""

    def __init__(self) -> None:
        self.data = make_regression_dataset(64)
        self.calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        if RANK == STALLING and self.calls == 4 * STALL_AT + 1:
            stall_mark()
            time.sleep(60)
        return self.data[index]  # type: ignore[no-any-return]


def main() -> None:
    watchdog = WatchdogCallback(timeout_s=3, directory=OUT / "watchdog")
    model = make_model()
    trainer = Stalling(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, watchdog),
    )
    if SCENARIO == "evaluate":
        trainer.evaluate(make_regression_dataset(32), per_device_batch_size=4)
    worker = SCENARIO == "worker"
    trainer.train(
        BlockingData() if worker else make_regression_dataset(64),
        num_epochs=2,
        per_device_batch_size=4,
        eval_dataset=make_regression_dataset(48) if SCENARIO == "healthy" else None,
        eval_dataloader_kwargs={"batch_size": 4},
        train_dataloader_kwargs={"num_workers": 1, "shuffle": False} if worker else None,
    )
    history = trainer.run_history
    report_and_exit({name: history.get_metric_values(name) for name in history.get_metric_names()})


if __name__ == "__main__":
    main()

"""Count the collectives the trainer issues per training step, eval batch and predict batch.

Every ``torch.distributed`` collective is wrapped to record its name and whether it blocks
(``async_op=False``). A forward pre-hook on the model marks each batch; the collectives
between two consecutive batches of the same phase (a training epoch, an eval epoch, a
prediction run) are those of one step. DDP's own gradient all-reduce runs in C++ (its reducer)
and is not counted: what is counted is what the trainer and its callbacks add.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState, GradientState
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.distributed import distributed_c10d

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    EarlyStoppingCallback,
    SaveTrainingStateCallback,
    TimeBudgetCallback,
    TrainerCallback,
)

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)


class Counter:
    """Records every collective call, and marks where each batch of each phase starts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.phase = "setup"
        self.marks: list[tuple[str, int]] = []  # (phase, number of calls when a batch starts)

    def install(self) -> None:
        for name in COLLECTIVES:
            original = getattr(distributed_c10d, name)
            wrapped = functools.wraps(original)(self._counted(name, original))
            setattr(distributed_c10d, name, wrapped)
            setattr(dist, name, wrapped)

    def _counted(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, not kwargs.get("async_op", False)))
            return original(*args, **kwargs)

        return counted

    def mark(self, *args: Any) -> None:
        self.marks.append((self.phase, len(self.calls)))

    def per_batch(self, phase: str) -> list[dict[str, int]]:
        """Blocking and asynchronous collectives between consecutive batches of ``phase``."""
        counts = []
        for (first, start), (second, end) in itertools.pairwise(self.marks):
            if first == second == phase:
                window = self.calls[start:end]
                blocking = sum(1 for _, blocks in window if blocks)
                counts.append({"blocking": blocking, "async": len(window) - blocking})
        return counts


COUNTER = Counter()


class Phases(TrainerCallback):
    """Tells the counter which phase the next batches belong to; a new epoch starts afresh."""

    may_stop_training = False

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        COUNTER.phase = f"train{trainer.run_history.current_epoch}"

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        COUNTER.phase = f"eval{trainer.run_history.current_epoch}"

    def on_predict_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        COUNTER.phase = "predict"

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        COUNTER.phase = "between"


class MayStopEveryStep(TrainerCallback):
    """A user callback that may stop after any step: the trainer agrees after each one."""

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        pass


class SignalOnRankOne(TrainerCallback):
    """Sends SIGTERM to rank 1 itself at the end of its third step (before the saver runs)."""

    may_stop_training = False

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if os.environ["RANK"] == "1" and trainer.num_updates == 3:
            signal.raise_signal(signal.SIGTERM)


def preempted_on_one_rank(save_dir: Path) -> dict[str, Any]:
    """Only rank 1 gets the signal; both must save the same step and stop there."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    saver = SaveTrainingStateCallback(
        save_dir, save_at_end=False, exit_on_preemption=False, preemption_check_interval=0
    )
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, SignalOnRankOne(), saver),
    )
    trainer.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    return {
        "updates": trainer.num_updates,
        "preempted_by": saver.preempted_by.name if saver.preempted_by else None,
        "states": sorted(path.name for path in save_dir.iterdir()),
    }


def scenario(callbacks: tuple[Any, ...]) -> dict[str, Any]:
    """Train 2 epochs of 8 steps per process (with evaluation), then predict."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    model.register_forward_pre_hook(COUNTER.mark)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, *callbacks, Phases()),
    )
    COUNTER.marks = []
    before = len(COUNTER.calls)
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        eval_dataset=make_regression_dataset(40),
        per_device_batch_size=4,
    )
    per_train_call = len(COUNTER.calls) - before
    trainer.predict(make_regression_dataset(40), per_device_batch_size=4)
    return {
        "per_train_call": per_train_call,  # all of them, for the record (2 epochs, 2 evals)
        "train": COUNTER.per_batch("train1") + COUNTER.per_batch("train2"),
        "eval": COUNTER.per_batch("eval1") + COUNTER.per_batch("eval2"),
        "predict": COUNTER.per_batch("predict"),
        "updates": trainer.num_updates,
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    COUNTER.install()
    results = {
        "default": scenario(()),
        "preemption": scenario((SaveTrainingStateCallback(out_dir / "states", save_at_end=False),)),
        "preemption_every_step": scenario(
            (
                SaveTrainingStateCallback(
                    out_dir / "every", save_at_end=False, preemption_check_interval=0
                ),
            )
        ),
        "early_stopping": scenario((EarlyStoppingCallback(early_stopping_patience=50),)),
        "time_budget": scenario((TimeBudgetCallback(3600.0),)),
        "may_stop_every_step": scenario((MayStopEveryStep(),)),
        "preempted_on_one_rank": preempted_on_one_rank(out_dir / "preempted"),
    }
    report_and_exit(results)


if __name__ == "__main__":
    main()

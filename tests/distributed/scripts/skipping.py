"""Skipping failing batches across 2 processes: one scenario per launch (argv[2]).

Each scenario trains a small BatchNorm model (its buffers make DDP broadcast before a
forward pass) with ``skip_failing_batches`` and reports the updates, the skipped batches,
the stop and the parameters, which must be equal on both ranks.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import make_regression_dataset
from torch import nn

from pytorch_accel import SkipFailingBatches, Trainer
from pytorch_accel.errors import StopTrainingError

RANK = int(os.environ["RANK"])


class Failing(nn.Module):
    """A BatchNorm model whose forward pass runs out of memory at chosen calls on chosen ranks."""

    def __init__(self, fail_at: dict[int, set[int]]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
        self.fail_at, self.calls = fail_at, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.fail_at.get(RANK, set()):
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, rank {RANK})")
        return self.model(inputs)  # type: ignore[no-any-return]


class FailsBeforeForward(Trainer):
    """Raises ``error`` in ``calculate_train_batch_loss`` before the model, on rank 1 only."""

    error: type[Exception] = torch.OutOfMemoryError
    at_call = 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loss_calls = 0

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.loss_calls += 1
        if RANK == 1 and self.loss_calls == self.at_call:
            raise self.error("failed before the forward pass (rank 1)")
        return super().calculate_train_batch_loss(batch)


class StopsBeforeForward(FailsBeforeForward):
    error = StopTrainingError


class RaisesBeforeForward(FailsBeforeForward):
    error = ValueError  # not skipped by the default policy


SCENARIOS: dict[str, dict[str, Any]] = {
    # OOM on rank 1 at the last micro-batch of the first and the third window
    "end_of_window_one_rank": {"fail_at": {1: {2, 6}}, "accumulation": 2},
    # the last micro-batch of a window fails on both ranks
    "end_of_window_both": {"fail_at": {0: {2}, 1: {2}}, "accumulation": 2},
    # the first micro-batch of a window fails on both ranks
    "start_of_window_both": {"fail_at": {0: {3}, 1: {3}}, "accumulation": 2},
    # calculate_train_batch_loss fails before the model is called, on rank 1
    "before_forward_one_rank": {"trainer": FailsBeforeForward, "accumulation": 1},
    "before_forward_end_of_window": {"trainer": FailsBeforeForward, "accumulation": 2},
    # calculate_train_batch_loss raises StopTrainingError on rank 1, whatever the policy skips
    "stop_one_rank": {"trainer": StopsBeforeForward, "accumulation": 1, "every": True},
    # an error the policy does not skip, on rank 1: every rank raises
    "error_one_rank": {"trainer": RaisesBeforeForward, "accumulation": 1},
}


def run(name: str) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = Failing(scenario.get("fail_at", {}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer_class = scenario.get("trainer", Trainer)
    trainer = trainer_class(model, nn.MSELoss(), optimizer, callbacks=())
    policy = SkipFailingBatches(max_skipped=3)
    if scenario.get("every"):
        policy = SkipFailingBatches(max_skipped=3, exceptions=(Exception,))
    try:
        trainer.train(
            make_regression_dataset(64),
            num_epochs=2,
            per_device_batch_size=4,
            gradient_accumulation_steps=scenario["accumulation"],
            skip_failing_batches=policy,
        )
    except Exception as error:  # reported, so that the ranks still leave together
        return {"error": f"{type(error).__name__}: {error}", "updates": trainer.num_updates}
    return {
        "updates": trainer.num_updates,
        "skipped": trainer.run_history.get_metric_values("train_skipped_batches"),
        "stopped_by": None if trainer.stopped_by is None else str(trainer.stopped_by),
        "params": flat_params(trainer.model),
    }


def main() -> None:
    report_and_exit({"result": run(sys.argv[2])})


if __name__ == "__main__":
    main()

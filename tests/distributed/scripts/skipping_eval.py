"""Skipping failing evaluation and prediction batches across 2 processes, in one launch.

A BatchNorm model (DDP broadcasts its buffers before the first forward after training) whose
step methods fail, before the model is called, on one rank only: the first eval batch of
``train()``'s eval epoch on rank 1, the first batch of ``evaluate()`` (after an unguarded
``train()``) on rank 1, the third batch of ``predict()`` on rank 0. Every rank must skip the
same batches and agree on the results.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
from accelerate.state import AcceleratorState, GradientState
from common import report_and_exit
from helpers import make_regression_dataset
from torch import nn

from pytorch_accel import Trainer

RANK = int(os.environ["RANK"])


class FailsOnOneRank(Trainer):
    """Raises out-of-memory before the forward at chosen calls of each step method."""

    fail_at: ClassVar[dict[str, tuple[int, int]]] = {}  # kind: (rank, 1-based call)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {}

    def _maybe_fail(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        rank, call = self.fail_at.get(kind, (-1, -1))
        if rank == RANK and self.calls[kind] == call:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated {kind}, rank {RANK})")

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        self._maybe_fail("eval" if self.is_training else "evaluate")
        return super().calculate_eval_batch_loss(batch)

    def calculate_predict_batch(self, batch: Any) -> Any:
        self._maybe_fail("predict")
        return super().calculate_predict_batch(batch)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))


def run() -> dict[str, Any]:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    net = model()
    trainer_class = type(
        "Failing",
        (FailsOnOneRank,),
        {"fail_at": {"eval": (1, 1), "evaluate": (1, 1), "predict": (0, 3)}},
    )
    trainer = trainer_class(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.05), ())
    trainer.train(
        make_regression_dataset(32),
        num_epochs=1,
        eval_dataset=make_regression_dataset(32, seed=1),
        per_device_batch_size=4,
        skip_failing_batches=3,
    )
    history = trainer.run_history
    eval_skipped = history.get_metric_values("eval_skipped_batches")
    eval_loss = history.get_metric_values("eval_loss_epoch")
    # an unguarded run: DDP's next forward would broadcast the buffers, and the first batch of
    # evaluate() fails before the forward on rank 1
    trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    evaluated = trainer.evaluate(
        make_regression_dataset(32, seed=2), per_device_batch_size=4, skip_failing_batches=3
    )
    data = make_regression_dataset(48, seed=3)
    predictions = trainer.predict(data, per_device_batch_size=4, skip_failing_batches=3)
    everything = trainer.predict(data, per_device_batch_size=4)
    return {
        "eval_skipped": eval_skipped,
        "eval_loss": eval_loss,
        "evaluate": evaluated,
        "predict_skipped": trainer.run_history.get_latest_metric("predict_skipped_batches"),
        "predictions": predictions.flatten().tolist(),
        "everything": everything.flatten().tolist(),
    }


def main() -> None:
    report_and_exit({"result": run()})


if __name__ == "__main__":
    main()

"""Run set-up across processes: a time budget or a failing batch on one rank only, seeds, LR."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TimeBudgetCallback
from pytorch_accel.training_state import find_training_states

RANK = int(os.environ["RANK"])
SETTINGS: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 4}


def trainer(*callbacks: Any) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)


def time_budget(out_dir: Path) -> dict[str, Any]:
    """Rank 1 is over budget at once, rank 0 never: both stop after update 2, then resume."""
    dataset = make_regression_dataset(64)
    reference = trainer()
    reference.train(dataset, **SETTINGS)
    save_dir = out_dir / "states"
    saver = SaveTrainingStateCallback(save_dir, preemption_signals=())
    budget = TimeBudgetCallback(1e-9 if RANK == 1 else 3600.0, check_every_n_steps=2)
    first = trainer(saver, budget)
    first.train(dataset, **SETTINGS)
    stopped = {"updates": first.num_updates, "stopped": budget.stopped}
    stopped["states"] = [path.name for path in find_training_states(save_dir)]
    resumed = trainer(SaveTrainingStateCallback(save_dir, preemption_signals=()))
    resumed.train(dataset, **SETTINGS, resume_from="latest")
    return {
        **stopped,
        "resumed_from": str(resumed.resumed_from),
        "resumed_equals_reference": flat_params(resumed.model) == flat_params(reference.model),
        "updates_after_resume": resumed.num_updates,
    }


def seeding_and_scaling() -> dict[str, Any]:
    """Per-rank seeds differ by the process index; the LR scales with 2 processes."""
    per_rank = trainer()
    per_rank.train(make_regression_dataset(32), **SETTINGS, seed=5, seed_per_rank=True)
    per_rank_seed = torch.initial_seed()
    shared = trainer()
    shared.train(make_regression_dataset(32), **SETTINGS, seed=5)
    shared_seed = torch.initial_seed()
    scaled = trainer()
    scaled.train(
        make_regression_dataset(32), **SETTINGS, gradient_accumulation_steps=2, auto_scale_lr=8
    )
    assert scaled.run_config is not None
    return {
        "per_rank_seed": per_rank_seed,
        "shared_seed": shared_seed,
        "lr": scaled.optimizer.param_groups[0]["lr"],
        "factor": scaled.run_config.lr_scale_factor,
    }


class OutOfMemoryOnRankOne(nn.Module):
    """Runs out of memory in its 3rd forward pass, on rank 1 only."""

    def __init__(self) -> None:
        super().__init__()
        self.model, self.calls = make_model(), 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if RANK == 1 and self.calls == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, rank 1)")
        return self.model(inputs)  # type: ignore[no-any-return]


def failing_batch() -> dict[str, Any]:
    """A batch fails on rank 1 only: both ranks skip that step, and nobody hangs."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = OutOfMemoryOnRankOne()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guarded = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    guarded.train(make_regression_dataset(64), **SETTINGS, skip_failing_batches=2)
    return {
        "updates": guarded.num_updates,
        "skipped": guarded.run_history.get_metric_values("train_skipped_batches"),
        "params": flat_params(guarded.model),
    }


def dry_run(out_dir: Path) -> dict[str, Any]:
    """A dry run in 2 processes: one temporary directory for both, nothing of the user's."""
    save_dir = out_dir / "dry-states"
    checked = trainer(SaveTrainingStateCallback(save_dir, save_every_n_steps=1))
    before = flat_params(checked.model)
    checked.train(make_regression_dataset(64), **SETTINGS, dry_run=True)
    return {
        "updates": checked.num_updates,
        "unchanged": flat_params(checked.model) == before,
        "user_dir_exists": save_dir.exists(),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    report_and_exit(
        {
            "time_budget": time_budget(out_dir),
            "seeding_and_scaling": seeding_and_scaling(),
            "failing_batch": failing_batch(),
            "dry_run": dry_run(out_dir),
        }
    )


if __name__ == "__main__":
    main()

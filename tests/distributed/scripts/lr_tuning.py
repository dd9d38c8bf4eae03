"""find_lr and a metric-driven scheduler in two processes: what each rank sees."""

from __future__ import annotations

import functools
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import LearningRateRecorder, make_regression_dataset
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.schedulers import SchedulerStepping

DATA = make_regression_dataset(128)


def fresh(*callbacks: Any) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)


def lr_finder_run() -> dict[str, Any]:
    trainer = fresh()
    before = flat_params(trainer.model)
    rng = torch.get_rng_state()
    result = trainer.find_lr(DATA, per_device_batch_size=8, end_lr=1e3, num_steps=40)
    restored = flat_params(trainer.get_model()) == before
    restored = restored and torch.equal(rng, torch.get_rng_state())
    accumulated = trainer.find_lr(
        DATA, per_device_batch_size=4, gradient_accumulation_steps=2, num_steps=20, divergence=None
    )
    restored = restored and flat_params(trainer.get_model()) == before
    trainer.train(DATA, num_epochs=2, per_device_batch_size=8)
    after_sweep = flat_params(trainer.get_model())
    alone = fresh()
    alone.train(DATA, num_epochs=2, per_device_batch_size=8)
    return {
        "lrs": result.lrs,
        "losses": result.losses,
        "suggestion": result.suggestion,
        "diverged_at": result.diverged_at,
        "restored": restored,
        "accumulated_losses": accumulated.losses,
        "lr_after": trainer.optimizer.param_groups[0]["lr"],
        "same_training": after_sweep == flat_params(alone.get_model()),
    }


class RankScore(TrainerCallback):
    """Records ``score``, a different value on each process: the main process's must decide."""

    may_stop_training = False

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        rank = trainer.accelerator.process_index
        score = 1.0 if rank == 0 else 1.0 / epoch  # rank 0: a plateau; rank 1: improving
        trainer.run_history.update_metric("score", score)


def plateau_run() -> dict[str, Any]:
    recorder = LearningRateRecorder()
    trainer = fresh(RankScore(), recorder)
    plateau = functools.partial(ReduceLROnPlateau, factor=0.5, patience=0)
    trainer.train(
        DATA,
        num_epochs=4,
        eval_dataset=make_regression_dataset(16, seed=1),
        per_device_batch_size=16,
        create_scheduler_fn=SchedulerStepping.create_scheduler_fn(plateau, monitor="score"),
    )
    return {"lrs": recorder.first_group, "scores": trainer.run_history.get_metric_values("score")}


def main() -> None:
    report_and_exit(
        {
            "num_processes": fresh().accelerator.num_processes,
            "lr_finder": lr_finder_run(),
            "plateau": plateau_run(),
        }
    )


if __name__ == "__main__":
    main()

"""Two processes with batch b train like one process with batch 2b; schedules end exactly."""

from __future__ import annotations

import functools
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import max_difference, report_and_exit
from helpers import hand_written_loop, make_model, make_regression_dataset
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR

from pytorch_accel import Trainer
from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.callbacks import TrainerCallback

UNSHUFFLED = {"shuffle": False}


def fresh_trainer(model: nn.Module, callbacks: tuple[Any, ...] = ()) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks)


def parity(samples: int, **options: Any) -> float:
    """Max |weight difference| between 2x batch 4 and the 1-process batch-8 reference."""
    dataset = make_regression_dataset(samples)
    reference_options = {
        "accumulation_steps": options.get("gradient_accumulation_steps", 1),
        "max_grad_norm": options.get("max_grad_norm"),
    }
    reference = hand_written_loop(
        make_model(), dataset, batch_size=8, num_epochs=2, **reference_options
    )
    trainer = fresh_trainer(make_model())
    trainer.train(
        dataset,
        num_epochs=2,
        per_device_batch_size=4,
        train_dataloader_kwargs=UNSHUFFLED,
        **options,
    )
    return max_difference(trainer.get_model(), reference)


class LrLog(TrainerCallback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def one_cycle_run() -> dict[str, Any]:
    log = LrLog()
    trainer = fresh_trainer(make_model(), (log,))
    trainer.train(
        make_regression_dataset(56),
        num_epochs=3,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        create_scheduler_fn=functools.partial(
            OneCycleLR,
            max_lr=0.1,
            epochs=P.NUM_EPOCHS,
            steps_per_epoch=P.NUM_UPDATE_STEPS_PER_EPOCH,
        ),
    )
    scheduler = trainer.scheduler
    return {
        "updates": len(log.lrs),
        "last_epoch": scheduler.last_epoch,
        "total_steps": scheduler.total_steps,
        "last_lr": log.lrs[-1],
        "min_lr": 0.1 / 25 / 1e4,
    }


def max_steps_run() -> int:
    trainer = fresh_trainer(make_model())
    trainer.train(
        make_regression_dataset(64), num_epochs=10, per_device_batch_size=4, max_num_train_steps=11
    )
    return trainer.num_updates


def unfreeze_run() -> float:
    """Stage 1 trains the first layer; stage 2 unfreezes the head (the model must be re-wrapped)."""
    dataset = make_regression_dataset(32)
    model = make_model()
    for parameter in model[2].parameters():
        parameter.requires_grad_(False)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model[0].parameters(), lr=0.05), ())
    trainer.train(
        dataset, num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs=UNSHUFFLED
    )
    for parameter in model[2].parameters():
        parameter.requires_grad_(True)
    trainer.optimizer.add_param_group({"params": list(model[2].parameters())})
    trainer.train(
        dataset, num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs=UNSHUFFLED
    )

    reference = make_model()
    for parameter in reference[2].parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.SGD(reference[0].parameters(), lr=0.05)
    for stage in range(2):
        if stage == 1:
            for parameter in reference[2].parameters():
                parameter.requires_grad_(True)
            optimizer.add_param_group({"params": list(reference[2].parameters())})
        for inputs, targets in torch.utils.data.DataLoader(dataset, batch_size=8):
            nn.functional.mse_loss(reference(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
    return max_difference(trainer.get_model(), reference)


def main() -> None:
    results: dict[str, Any] = {
        "num_processes": fresh_trainer(make_model()).accelerator.num_processes,
        "plain": parity(64),
        "accumulation_short_last_window": parity(56, gradient_accumulation_steps=3),
        "clip_norm": parity(64, gradient_accumulation_steps=2, max_grad_norm=0.05),
        "one_cycle": one_cycle_run(),
        "max_steps_updates": max_steps_run(),
        "unfreeze": unfreeze_run(),
    }
    report_and_exit(results)


if __name__ == "__main__":
    main()

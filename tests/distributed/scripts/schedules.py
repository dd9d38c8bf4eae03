"""Schedulers, the timm trainer, WSD checkpoints and staged fine-tuning in two processes."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import LearningRateRecorder, make_model, make_regression_dataset
from timm.scheduler import CosineLRScheduler
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.callbacks.wsd_checkpoint import WSDCheckpointCallback
from pytorch_accel.finetuning import ModelFreezer
from pytorch_accel.schedulers import CosineLrScheduler, WSDLrScheduler
from pytorch_accel.timm_trainer import TrainerWithTimmScheduler

ACCUMULATION = {"num_epochs": 5, "per_device_batch_size": 2, "gradient_accumulation_steps": 3}
"""44 samples: 11 batches per process and epoch, windows of 3, 3, 3, 2: 4 updates per epoch."""


def fresh(
    callbacks: tuple[Any, ...],
    trainer_class: type[Trainer] = Trainer,
    model: nn.Module | None = None,
    parameters: list[nn.Parameter] | None = None,
) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model() if model is None else model
    parameters = list(model.parameters()) if parameters is None else parameters
    optimizer = torch.optim.SGD(parameters, lr=0.1)
    return trainer_class(model, nn.MSELoss(), optimizer, callbacks)


def cosine_run() -> dict[str, Any]:
    recorder = LearningRateRecorder()
    trainer = fresh((recorder,))
    trainer.train(
        make_regression_dataset(44),
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, num_cooldown_epochs=1, lr_min=1e-3, warmup_starting_lr=0.0
        ),
        **ACCUMULATION,
    )
    return {
        "lrs": recorder.first_group,
        "updates": [trainer.num_updates, trainer.scheduler.num_updates],
        "per_epoch": trainer.run_config.num_update_steps_per_epoch,
    }


def wsd_run(save_dir: Path) -> dict[str, Any]:
    recorder, callback = LearningRateRecorder(), WSDCheckpointCallback(save_dir)
    trainer = fresh((recorder, callback))
    trainer.train(
        make_regression_dataset(44),
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
            num_checkpoints=2, decay_phase_ratio=0.25, lr_min=0.01
        ),
        **ACCUMULATION,
    )
    return {
        "lrs": recorder.first_group,
        "checkpoint_steps": trainer.scheduler.get_checkpoint_steps(),
        "saved": [path.name for path in callback.saved_checkpoints],
        "final_params": flat_params(trainer.get_model()),
    }


def timm_run() -> list[float]:
    recorder = LearningRateRecorder()
    trainer = fresh((recorder,), TrainerWithTimmScheduler)
    trainer.train(
        make_regression_dataset(44),
        create_scheduler_fn=functools.partial(
            CosineLRScheduler,
            t_initial=P.TOTAL_NUM_UPDATE_STEPS,
            warmup_t=P.NUM_UPDATE_STEPS_PER_EPOCH,
            warmup_lr_init=1e-3,
            lr_min=1e-4,
            t_in_epochs=False,
        ),
        **ACCUMULATION,
    )
    return recorder.first_group


def staged_run() -> dict[str, Any]:
    """Train the head with the rest frozen, then unfreeze (the DDP wrapper is rebuilt)."""
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze()
    first_layer = flat_params(model[0])
    trainer = fresh((), model=model, parameters=freezer.get_trainable_parameters())
    dataset = make_regression_dataset(32)
    trainer.train(dataset, num_epochs=1, per_device_batch_size=4)
    unchanged = flat_params(model[0]) == first_layer
    for group in freezer.unfreeze().values():
        trainer.optimizer.add_param_group({**group, "lr": 0.01})
    trainer.train(dataset, num_epochs=1, per_device_batch_size=4, reset_run_history=False)
    return {
        "frozen_layer_unchanged": unchanged,
        "changed_after_unfreezing": flat_params(model[0]) != first_layer,
        "params": flat_params(trainer.get_model()),
    }


def main() -> None:
    out_dir = Path(sys.argv[1])
    report_and_exit(
        {
            "num_processes": fresh(()).accelerator.num_processes,
            "cosine": cosine_run(),
            "wsd": wsd_run(out_dir / "wsd"),
            "timm": timm_run(),
            "staged": staged_run(),
        }
    )


if __name__ == "__main__":
    main()

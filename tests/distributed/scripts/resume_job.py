"""One training job for the resume tests, in one process (python) or several (torchrun).

Trains a small dropout MLP on a shuffled map-style dataset with dataloader workers, AdamW,
OneCycleLR from placeholders, an eval set, EarlyStopping and EMA (stateful callbacks). It can
save a training state at a chosen micro-step or epoch end and then die at once, save
periodically, pause inside a save, resume, and report the final weights, optimizer state,
learning rate and run history to ``<out_dir>/rank<RANK>.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import Dataset

from pytorch_accel import Trainer, TrainerPlaceholderValues, set_seed
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    EarlyStoppingCallback,
    ModelEmaCallback,
    SaveTrainingStateCallback,
    StepLoggingCallback,
    TrainerCallback,
)


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, num_samples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(num_samples, 4, generator=generator)
        self.targets = self.inputs @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]])

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


class SaveThenDie(TrainerCallback):
    """Save a training state at micro-step ``step`` (1-based, whole run) or at an epoch end."""

    order = 2000

    def __init__(self, save_dir: Path, step: int | None, epoch: int | None) -> None:
        self.save_dir, self.step, self.epoch, self.seen = save_dir, step, epoch, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.step:
            self._save_and_die(trainer)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.run_history.current_epoch == self.epoch:
            self._save_and_die(trainer)

    def _save_and_die(self, trainer: Trainer) -> None:
        trainer.save_training_state(self.save_dir / "state")
        sys.stdout.flush()
        os._exit(0)


class Pace(TrainerCallback):
    """Slow each step down and note progress, so a test can kill or signal mid-run."""

    def __init__(self, seconds: float, out_dir: Path) -> None:
        self.seconds, self.out_dir = seconds, out_dir

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        rank = trainer.accelerator.process_index
        (self.out_dir / f"progress{rank}").write_text(f"{os.getpid()} {trainer.num_updates}")
        time.sleep(self.seconds)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--save-dir", type=Path)
    parser.add_argument("--die-after-step", type=int)
    parser.add_argument("--die-after-epoch", type=int)
    parser.add_argument("--resume-from")
    parser.add_argument("--every-n-steps", type=int)
    parser.add_argument("--max-checkpoints", type=int)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--pause-in-save", type=float, default=0.0)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--mixed", action="store_true")  # two training sets, by weight
    return parser.parse_args()


class StepLosses(StepLoggingCallback):
    """The interval loss of every update (a per-process state: each rank's running sums)."""

    def __init__(self) -> None:
        super().__init__(log_every_n_updates=1)
        self.losses: dict[str, float] = {}

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.losses[str(step)] = metrics["train_loss_step"]


def callbacks(args: argparse.Namespace) -> list[TrainerCallback]:
    chosen: list[Any] = [
        *DEFAULT_CALLBACKS,
        EarlyStoppingCallback(early_stopping_patience=50),
        ModelEmaCallback(decay=0.9, save_path=args.out_dir / "ema_model.pt"),
        StepLosses(),
    ]
    if args.save_dir is not None:
        chosen.append(
            SaveTrainingStateCallback(
                args.save_dir,
                save_every_n_steps=args.every_n_steps,
                max_checkpoints=args.max_checkpoints,
                save_at_end=False,
                async_save=args.async_save,
            )
        )
    if args.die_after_step is not None or args.die_after_epoch is not None:
        chosen.append(SaveThenDie(args.save_dir, args.die_after_step, args.die_after_epoch))
    if args.pace:
        chosen.append(Pace(args.pace, args.out_dir))
    return chosen


def main() -> None:
    args = parse()
    set_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    if args.resume_from not in (None, "latest"):
        set_seed(123)  # the resumed run must not depend on how this process started
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks(args))
    if args.pause_in_save:
        trainer.accelerator.register_save_state_pre_hook(lambda *_: time.sleep(args.pause_in_save))
    schedule = functools.partial(
        torch.optim.lr_scheduler.OneCycleLR,
        max_lr=0.05,
        total_steps=TrainerPlaceholderValues.TOTAL_NUM_UPDATE_STEPS,
    )
    workers = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    data: Any = Regression(38, seed=0)
    if args.mixed:
        from pytorch_accel.mixing import TrainingSets

        sets = {"a": data, "b": Regression(14, seed=2)}
        data = TrainingSets(sets, weights={"a": 1.0, "b": 1.0})
    trainer.train(
        data,
        num_epochs=args.epochs,
        eval_dataset=Regression(10, seed=1),
        per_device_batch_size=4,
        gradient_accumulation_steps=args.accumulation,
        create_scheduler_fn=schedule,
        train_dataloader_kwargs=workers,
        resume_from=args.resume_from,
    )
    weights = torch.cat([p.detach().flatten() for p in trainer.get_model().parameters()])
    optimizer_state = trainer.optimizer.state_dict()
    moments = [
        torch.cat([state[key].flatten() for key in ("exp_avg", "exp_avg_sq")]).tolist()
        for state in optimizer_state["state"].values()
    ]
    report_and_exit(
        {
            "weights": weights.tolist(),
            "moments": moments,
            "lr": optimizer_state["param_groups"][0]["lr"],
            "history": trainer.run_history.state_dict(),
            "num_updates": trainer.num_updates,
            "resumed_from": None if trainer.resumed_from is None else str(trainer.resumed_from),
            "ema": ema_weights(trainer),
            "step_losses": next(
                cb for cb in trainer.callback_handler if isinstance(cb, StepLosses)
            ).losses,
            "device": trainer.device.type,
        }
    )


def ema_weights(trainer: Trainer) -> list[float]:
    ema = next(cb for cb in trainer.callback_handler if isinstance(cb, ModelEmaCallback))
    tensors = ema.state_dict()["ema_state_dict"].values()
    return torch.cat([tensor.flatten().float() for tensor in tensors]).tolist()


if __name__ == "__main__":
    main()

"""Fine-tune a pretrained network in two stages: the new head first, then everything.

1. Pretrained weights: `--pretrained PATH` (a `Trainer.save_checkpoint` file or a saved
   state dict), or, without it, a quick pretraining on a generated 4-class task, saved as
   `<output_dir>/pretrained.pt`.
2. A model for the new 3-class task is built and `load_pretrained_weights` loads everything
   but the classifier, whose shape differs (it reports the mismatch).
3. Stage 1: `ModelFreezer` freezes every layer group but the head (batch norms included, kept
   in eval mode by a small callback); only the head trains, with a cosine schedule.
4. Stage 2: `unfreeze()` returns the backbone's parameters as groups for
   `optimizer.add_param_group`, with a 10x lower learning rate; training continues with
   `reset_run_history=False`, and a new cosine schedule decays every group to 1% of its LR.

Run it with `python examples/finetune_in_stages.py --quick` (a few seconds on a CPU).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.finetuning import LoadResult, ModelFreezer, load_pretrained_weights
from pytorch_accel.schedulers import CosineLrScheduler
from pytorch_accel.trainer import DEFAULT_CALLBACKS

QUICK = {"num_samples": 64, "pretrain_epochs": 1, "stage_one_epochs": 2, "stage_two_epochs": 2}
"""The settings of `--quick`."""


class SmallConvNet(nn.Module):
    """A small CNN whose direct children are the layer groups: stem, stage, pool, head.

    Args:
        num_classes: Number of output logits.
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.stage = nn.Sequential(
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Return logits `(N, num_classes)` for images `(N, 3, H, W)`."""
        logits: torch.Tensor = self.head(self.pool(self.stage(self.stem(images))))
        return logits


def colour_task(num_samples: int, num_classes: int, seed: int) -> TensorDataset:
    """Return 16x16 noisy images whose mean colour encodes one of `num_classes` classes."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % num_classes
    colours = torch.rand(num_classes, 3, 1, 1, generator=generator) * 2 - 1
    images = colours[labels] + 0.5 * torch.randn(num_samples, 3, 16, 16, generator=generator)
    return TensorDataset(images, labels)


def split(dataset: TensorDataset) -> tuple[TensorDataset, TensorDataset]:
    """Split a dataset 80/20 into train and eval sets."""
    images, labels = dataset.tensors
    cut = math.ceil(0.8 * len(labels))
    return TensorDataset(images[:cut], labels[:cut]), TensorDataset(images[cut:], labels[cut:])


def pretrain(path: Path, args: argparse.Namespace) -> Path:
    """Train a 4-class model on the source task and save it with `Trainer.save_checkpoint`."""
    model = SmallConvNet(num_classes=4)
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=args.lr)
    )
    source = colour_task(args.num_samples, num_classes=4, seed=1)
    trainer.train(source, num_epochs=args.pretrain_epochs, per_device_batch_size=args.batch_size)
    trainer.save_checkpoint(path, save_optimizer=False)
    return path


class KeepFrozenModulesInEval(TrainerCallback):
    """Put the frozen modules back in eval mode after `Trainer` calls `model.train()`.

    Args:
        freezer: The freezer that froze them with `set_modules_as_eval=True`.
    """

    may_stop_training = False

    def __init__(self, freezer: ModelFreezer) -> None:
        self.freezer = freezer

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Restore the eval mode of the frozen modules."""
        self.freezer.restore_eval_modes()


def stage_one(model: nn.Module, args: argparse.Namespace) -> tuple[Trainer, ModelFreezer]:
    """Freeze all but the head (batch norms in eval mode) and train the head."""
    freezer = ModelFreezer(model, freeze_batch_norms=True)
    freezer.freeze(set_modules_as_eval=True)
    optimizer = torch.optim.AdamW(freezer.get_trainable_parameters(), lr=args.lr)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        callbacks=(*DEFAULT_CALLBACKS, KeepFrozenModulesInEval(freezer)),
    )
    run_stage(trainer, args.stage_one_epochs, args, reset_run_history=True)
    return trainer, freezer


def stage_two(trainer: Trainer, freezer: ModelFreezer, args: argparse.Namespace) -> None:
    """Unfreeze everything, add the backbone with a 10x lower LR, and continue training."""
    for param_group in freezer.unfreeze().values():
        trainer.optimizer.add_param_group({**param_group, "lr": args.lr / 10})
    run_stage(trainer, args.stage_two_epochs, args, reset_run_history=False)


def run_stage(
    trainer: Trainer, num_epochs: int, args: argparse.Namespace, *, reset_run_history: bool
) -> None:
    """Train on the target task with a cosine schedule that ends at 1% of each group's LR."""
    train_set, eval_set = split(colour_task(args.num_samples, num_classes=3, seed=2))
    trainer.train(
        train_set,
        num_epochs=num_epochs,
        eval_dataset=eval_set,
        per_device_batch_size=args.batch_size,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1 if num_epochs > 1 else 0, min_lr_ratio=0.01
        ),
        reset_run_history=reset_run_history,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `--quick` overrides the sizes with `QUICK`."""
    parser = argparse.ArgumentParser(description="Fine-tune in two stages with pytorch_accel.")
    parser.add_argument("--pretrained", default=None, help="weights file (default: pretrain)")
    parser.add_argument(
        "--output_dir", default="finetune_output", help="where the pretraining is saved"
    )
    parser.add_argument("--num_samples", type=int, default=512)
    parser.add_argument("--pretrain_epochs", type=int, default=3)
    parser.add_argument("--stage_one_epochs", type=int, default=3)
    parser.add_argument("--stage_two_epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="a tiny run of a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the recipe and return what happened.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        `trainer`, `load_result` (a `LoadResult`), `trainable` (trainable parameter counts
        of stage 1 and stage 2) and `eval_loss` (the last eval loss of each stage).
    """
    args = parse_args(argv)
    set_seed(args.seed)
    path = Path(args.pretrained or pretrain(Path(args.output_dir, "pretrained.pt"), args))
    model = SmallConvNet(num_classes=3)
    load_result: LoadResult = load_pretrained_weights(model, path)
    PartialState().print(load_result.summary())
    trainer, freezer = stage_one(model, args)
    trainable = [len(freezer.get_trainable_parameters())]
    eval_losses = [float(trainer.run_history.get_latest_metric("eval_loss_epoch"))]
    stage_two(trainer, freezer, args)
    trainable.append(len(freezer.get_trainable_parameters()))
    eval_losses.append(float(trainer.run_history.get_latest_metric("eval_loss_epoch")))
    trainer.print(f"eval loss after stage 1: {eval_losses[0]:.3f}, stage 2: {eval_losses[1]:.3f}")
    return {
        "trainer": trainer,
        "load_result": load_result,
        "trainable": trainable,
        "eval_loss": eval_losses,
    }


if __name__ == "__main__":
    main()

"""Train a timm image classifier with a timm scheduler, using `TrainerWithTimmScheduler`.

The model comes from `timm.create_model(..., pretrained=False)`: nothing is downloaded. The
data is either an image folder (`--data_dir`, one sub-directory per class, or `train/` and
`val/` directories of those) or, without `--data_dir`, small generated images whose colour
depends on the class, so the model has something to learn.

The learning rate follows timm's `CosineLRScheduler` with a linear warmup, stepped after every
optimizer update (`t_in_epochs=False`); its lengths are placeholders the trainer fills in.

Run it with `python examples/train_timm_model.py --quick` (a few seconds on a CPU), or e.g.:

    python examples/train_timm_model.py --data_dir ~/data/flowers --model resnet18 \
        --image_size 128 --num_epochs 10

or on several processes with `accelerate launch examples/train_timm_model.py ...`.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.utils.data import Dataset, TensorDataset, random_split
from torchmetrics.classification import MulticlassAccuracy
from torchvision import datasets, transforms

from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel import set_seed
from pytorch_accel.callbacks import MetricsCallback
from pytorch_accel.timm_trainer import TrainerWithTimmScheduler
from pytorch_accel.trainer import DEFAULT_CALLBACKS, Trainer

QUICK = {"image_size": 32, "num_samples": 48, "num_epochs": 2, "batch_size": 8, "num_workers": 0}
"""The settings of `--quick`: a few seconds on one CPU core."""


def generated_datasets(
    num_samples: int, num_classes: int, image_size: int, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """Return train and eval sets of noisy images whose mean colour encodes the class.

    Args:
        num_samples: Images in both sets together (80% train).
        num_classes: Number of classes.
        image_size: Height and width of the square images.
        seed: Seed of the generator (the data does not depend on the training seed).

    Returns:
        The train and eval datasets of `(images (N, 3, S, S), labels (N,))`.
    """
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % num_classes
    colours = torch.rand(num_classes, 3, 1, 1, generator=generator) * 2 - 1
    noise = torch.randn(num_samples, 3, image_size, image_size, generator=generator)
    images = colours[labels] + 0.5 * noise
    num_train = math.ceil(0.8 * num_samples)
    return (
        TensorDataset(images[:num_train], labels[:num_train]),
        TensorDataset(images[num_train:], labels[num_train:]),
    )


def image_folder_datasets(data_dir: Path, image_size: int) -> tuple[Dataset[Any], Dataset[Any]]:
    """Load an image folder: `train/` and `val/` if present, else split 80/20 (seeded).

    Args:
        data_dir: A directory with one sub-directory of images per class, or `train/` and
            `val/` directories laid out that way.
        image_size: Images are resized to `image_size x image_size`.

    Returns:
        The train and eval datasets of `(image tensor, class index)`.
    """
    transform = transforms.Compose(
        [
            transforms.Resize((image_size, image_size)),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
        ]
    )
    if (data_dir / "train").is_dir() and (data_dir / "val").is_dir():
        return (
            datasets.ImageFolder(data_dir / "train", transform=transform),
            datasets.ImageFolder(data_dir / "val", transform=transform),
        )
    full = datasets.ImageFolder(data_dir, transform=transform)
    num_train = math.ceil(0.8 * len(full))
    split = random_split(
        full, [num_train, len(full) - num_train], generator=torch.Generator().manual_seed(0)
    )
    return split[0], split[1]


def count_classes(dataset: Dataset[Any]) -> int:
    """Return the number of classes of an image folder (or of a split of one)."""
    inner = getattr(dataset, "dataset", dataset)
    return len(inner.classes)


def create_scheduler_fn(warmup_epochs: int) -> functools.partial[CosineLRScheduler]:
    """Return timm's cosine schedule over the run's updates, after `warmup_epochs` of warmup."""
    return functools.partial(
        CosineLRScheduler,
        t_initial=P.TOTAL_NUM_UPDATE_STEPS,
        warmup_t=P.NUM_UPDATE_STEPS_PER_EPOCH * warmup_epochs,
        warmup_lr_init=1e-5,
        lr_min=1e-6,
        t_in_epochs=False,
    )


def train(args: argparse.Namespace) -> Trainer:
    """Build the data, the timm model, optimizer and trainer, and train.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer after training.
    """
    set_seed(args.seed)
    if args.data_dir is None:
        train_set, eval_set = generated_datasets(
            args.num_samples, args.num_classes, args.image_size
        )
        num_classes = args.num_classes
    else:
        train_set, eval_set = image_folder_datasets(Path(args.data_dir), args.image_size)
        num_classes = count_classes(train_set)
    accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")
    model = timm.create_model(args.model, pretrained=False, num_classes=num_classes)
    optimizer = create_optimizer_v2(model, "adamw", lr=args.lr, weight_decay=0.05)
    trainer = TrainerWithTimmScheduler(
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        callbacks=(*DEFAULT_CALLBACKS, MetricsCallback(accuracy, name="accuracy")),
    )
    loader_options: dict[str, Any] = {"drop_last": True}  # no batch of 1 for batch norm
    if args.num_workers is not None:
        loader_options["num_workers"] = args.num_workers
    trainer.train(
        train_set,
        num_epochs=args.num_epochs,
        eval_dataset=eval_set,
        per_device_batch_size=args.batch_size,
        create_scheduler_fn=create_scheduler_fn(args.warmup_epochs),
        train_dataloader_kwargs=loader_options,
        eval_dataloader_kwargs={k: v for k, v in loader_options.items() if k != "drop_last"},
    )
    return trainer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `--quick` overrides the sizes with `QUICK`."""
    parser = argparse.ArgumentParser(description="Train a timm model with pytorch_accel.")
    parser.add_argument("--model", default="mobilenetv3_small_050", help="a timm model name")
    parser.add_argument("--data_dir", default=None, help="an image folder (default: generated)")
    parser.add_argument("--num_classes", type=int, default=4, help="classes of generated data")
    parser.add_argument("--num_samples", type=int, default=512, help="generated images")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--warmup_epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--num_workers", type=int, default=None, help="dataloader workers")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="a tiny run of a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    if min(args.num_classes, args.num_samples, args.image_size, args.batch_size) < 1:
        parser.error("sizes and counts must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Train and return the final `eval_loss`, `accuracy` and last learning rate.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        `{"eval_loss": ..., "accuracy": ..., "last_lr": ..., "num_updates": ...}`.
    """
    trainer = train(parse_args(argv))
    history = trainer.run_history
    results = {
        "eval_loss": float(history.get_latest_metric("eval_loss_epoch")),
        "accuracy": float(history.get_latest_metric("accuracy")),
        "last_lr": float(trainer.optimizer.param_groups[0]["lr"]),
        "num_updates": float(trainer.num_updates),
    }
    trainer.print(f"final eval accuracy: {results['accuracy']:.3f}")
    return results


if __name__ == "__main__":
    main()

r"""Progressive resizing: train a timm model in stages of growing image size.

Small images early make the first epochs cheap; larger ones later recover the detail. Each
stage is one `train()` call on the same trainer with `reset_run_history=False`: one run, whose
history, epoch count and update count (`trainer.global_num_updates`) carry across stages, so
the curves (and, with `--log_dir`, the TensorBoard run and the CSV files) are one series. Each
stage gets its own `OneCycleLR` built from placeholders, so it ends exactly at the stage's last
update whatever the image size or data size.

The validation accuracy of a stage is measured at that stage's image size, so it does not rank
epochs across stages: `SaveBestModelCallback` and `EarlyStoppingCallback` start afresh at each
stage (`reset_on_train=True`). Each stage ends with its own best weights, which the next stage
starts from, and the model handed back is the best of the last, full-size stage (its
checkpoint in `--output`).

The data are a folder of images with one subfolder per class, split into `train/` and `val/`:

    <data_dir>/train/<class name>/<image>.png
    <data_dir>/val/<class name>/<image>.png

They are read with `torchvision.datasets.ImageFolder`. The model comes from timm with
`pretrained=False`: nothing is downloaded. Accuracy is a torchmetrics metric recorded by
`MetricsCallback`; `EarlyStoppingCallback` and `SaveBestModelCallback` watch it.

Run it with:

    python examples/progressive_resizing.py --data_dir data/imagenette
    accelerate launch examples/progressive_resizing.py --data_dir data/imagenette \\
        --image_sizes 128 160 224
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import timm
import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torchmetrics.classification import MulticlassAccuracy
from torchvision import datasets, transforms

from pytorch_accel import Trainer, TrainerPlaceholderValues, set_seed
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    EarlyStoppingCallback,
    MetricsCallback,
    SaveBestModelCallback,
    TrackingCallback,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, required=True)
    parser.add_argument("--model", default="resnet18", help="a timm model name")
    parser.add_argument("--image_sizes", type=int, nargs="+", default=[128, 160, 224])
    parser.add_argument("--epochs_per_stage", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--output", type=Path, default=Path("best_model.pt"))
    parser.add_argument("--num_workers", type=int, default=None)
    parser.add_argument("--log_dir", type=Path, default=None, help="TensorBoard run and CSVs")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def image_folders(data_dir: Path, image_size: int) -> tuple[datasets.ImageFolder, ...]:
    """The train and val image folders, resized to `image_size`."""
    normalise = transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    train = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=(0.6, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalise,
        ]
    )
    evaluate = transforms.Compose(
        [
            transforms.Resize(image_size),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            normalise,
        ]
    )
    return (
        datasets.ImageFolder(str(data_dir / "train"), transform=train),
        datasets.ImageFolder(str(data_dir / "val"), transform=evaluate),
    )


def build_trainer(args: argparse.Namespace, num_classes: int) -> Trainer:
    """A timm model (no pretrained weights) with accuracy, early stopping and best-model saving.

    Both rank the epochs of each stage on their own (see the module's docstring).
    """
    model = timm.create_model(args.model, pretrained=False, num_classes=num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    callbacks = (
        *DEFAULT_CALLBACKS,
        MetricsCallback(
            MulticlassAccuracy(num_classes=num_classes, average="micro"), name="accuracy"
        ),
        EarlyStoppingCallback(
            early_stopping_patience=args.patience,
            early_stopping_threshold=0.001,
            watch_metric="accuracy",
            greater_is_better=True,
            reset_on_train=True,
        ),
        SaveBestModelCallback(
            save_path=args.output,
            watch_metric="accuracy",
            greater_is_better=True,
            reset_on_train=True,
            load_saved_checkpoint=True,
        ),
    )
    if args.log_dir is not None:  # one TensorBoard run and one step series for all stages
        callbacks += (
            TrackingCallback(
                logging_dir=args.log_dir,
                csv_path=args.log_dir / "metrics.csv",
                project_name="progressive_resizing",
                epoch_x_axis="update",
            ),
        )
    return Trainer(model, nn.CrossEntropyLoss(label_smoothing=0.1), optimizer, callbacks=callbacks)


def train_in_stages(args: argparse.Namespace) -> Trainer:
    """One `train()` per image size, continuing the run history between stages."""
    trainer: Trainer | None = None
    for stage, image_size in enumerate(args.image_sizes):
        train_set, val_set = image_folders(args.data_dir, image_size)
        trainer = trainer or build_trainer(args, num_classes=len(train_set.classes))
        trainer.print(f"\nStage {stage + 1}: {image_size}x{image_size} images")
        loader_kwargs = {} if args.num_workers is None else {"num_workers": args.num_workers}
        trainer.train(
            train_set,
            num_epochs=args.epochs_per_stage,
            eval_dataset=val_set,
            per_device_batch_size=args.batch_size,
            reset_run_history=stage == 0,
            train_dataloader_kwargs=loader_kwargs,
            eval_dataloader_kwargs=loader_kwargs,
            create_scheduler_fn=functools.partial(
                OneCycleLR,
                max_lr=args.lr,
                epochs=TrainerPlaceholderValues.NUM_EPOCHS,
                steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
            ),
        )
    assert trainer is not None
    return trainer


def main(argv: list[str] | None = None) -> float:
    """Train in stages; return the last stage's best eval accuracy (the weights handed back)."""
    args = parse_args(argv)
    set_seed(args.seed)
    trainer = train_in_stages(args)
    saver = next(
        callback
        for callback in trainer.callback_handler.callbacks
        if isinstance(callback, SaveBestModelCallback)
    )
    best = saver.best_metric  # the last stage's: the ranking starts afresh at each stage
    assert best is not None
    trainer.print(f"best eval accuracy of the last stage: {best:.3f} (checkpoint: {args.output})")
    return float(best)


if __name__ == "__main__":
    main()

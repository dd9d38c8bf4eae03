r"""Log sample predictions to TensorBoard at each epoch end, with a record of the run.

A callback draws the first few eval images of scikit-learn's digits data set with a green
border where the model's prediction is right and a red one where it is wrong, and sends them
to TensorBoard through the run record's trackers (``TrackingCallback.log_images``) at the end
of each evaluation epoch, next to a text line of the predicted and true labels. The
``RunRecordCallback`` keeps the rest: the config, hyper-parameters, environment, model summary,
log file, per-epoch and per-step metrics (every 10 updates here) and their plots.

Run it with::

    python examples/log_sample_predictions.py --output_dir runs/digits
    tensorboard --logdir runs/digits/tensorboard     # the IMAGES tab: one grid per epoch

``--subset N`` trains on the first N samples only, for quick checks; ``--help`` lists every
option. Needs the ``examples`` and ``tracking`` extras (scikit-learn, tensorboard).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    RunRecordCallback,
    TrackingCallback,
    TrainerCallback,
)

SCALE = 4
"""Each 8x8 digit is drawn at 32x32 pixels."""

GREEN, RED = (0.1, 0.8, 0.1), (0.9, 0.1, 0.1)


def load_datasets(subset: int | None = None) -> tuple[TensorDataset, TensorDataset]:
    """The digits as ``(N, 1, 8, 8)`` images in ``[0, 1]`` and int labels, split 80/20."""
    digits = load_digits()
    images = np.asarray(digits.images[:subset], dtype=np.float32) / 16.0
    labels = np.asarray(digits.target[:subset], dtype=np.int64)
    train_x, eval_x, train_y, eval_y = train_test_split(
        images, labels, test_size=0.2, random_state=0
    )
    return tuple(  # type: ignore[return-value]
        TensorDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y))
        for x, y in ((train_x, train_y), (eval_x, eval_y))
    )


def draw_predictions(
    images: torch.Tensor, predictions: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Grey digits, enlarged, framed green (right) or red (wrong): ``(N, 3, H, W)`` in [0, 1]."""
    pixels = images.repeat_interleave(SCALE, dim=-1).repeat_interleave(SCALE, dim=-2)
    pixels = nn.functional.pad(pixels.expand(-1, 3, -1, -1), (2, 2, 2, 2), value=0.0)
    right = (predictions == labels).tolist()
    for picture, is_right in zip(pixels, right, strict=True):
        colour = torch.tensor(GREEN if is_right else RED).view(3, 1, 1)
        frame = torch.ones_like(picture[:1], dtype=torch.bool)
        frame[:, 2:-2, 2:-2] = False
        picture.copy_(torch.where(frame, colour, picture))
    return pixels


class SamplePredictionsCallback(TrainerCallback):
    """Send the predictions on a few fixed eval images to the trackers at each eval epoch end.

    Only the main process draws (it holds the trackers); the images go through
    ``tracking.log_images`` with step = the epoch, so TensorBoard shows one grid per epoch.

    Args:
        tracking: The callback that holds the trackers (a ``TrackingCallback`` or
            ``RunRecordCallback``).
        images: The images to predict, ``(N, 1, 8, 8)``.
        labels: Their labels.
    """

    def __init__(self, tracking: TrackingCallback, images: torch.Tensor, labels: torch.Tensor):
        self.tracking, self.images, self.labels = tracking, images, labels

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Predict, draw and send (skipped for evaluations inside an epoch)."""
        if kwargs.get("is_intermediate") or not trainer.accelerator.is_main_process:
            return
        with torch.no_grad():  # the model is in eval mode during the eval epoch
            logits = trainer.get_model()(self.images.to(trainer.device))
        predictions = logits.argmax(dim=-1).cpu()
        epoch = trainer.run_history.current_epoch
        grid = draw_predictions(self.images, predictions, self.labels)
        self.tracking.log_images({"sample_predictions": grid}, step=epoch)
        pairs = zip(predictions.tolist(), self.labels.tolist(), strict=True)
        text = " ".join(f"{predicted}/{true}" for predicted, true in pairs)
        for tracker in self.tracking.trackers:
            tracker.log({"sample_predictions (predicted/true)": text}, step=epoch)


def train(args: argparse.Namespace) -> Trainer:
    """Train a small MLP on the digits with a run record and the sample-prediction images."""
    set_seed(args.seed)
    train_dataset, eval_dataset = load_datasets(args.subset)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    hyperparameters = {"lr": args.lr, "batch_size": args.batch_size, "hidden": 64}
    record = RunRecordCallback(args.output_dir, hyperparameters, log_every_n_updates=10)
    images, labels = eval_dataset[: args.num_images]
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), lr=args.lr),
        callbacks=(*DEFAULT_CALLBACKS, record, SamplePredictionsCallback(record, images, labels)),
    )
    trainer.train(
        train_dataset,
        num_epochs=args.num_epochs,
        eval_dataset=eval_dataset,
        per_device_batch_size=args.batch_size,
    )
    return trainer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", type=Path, default=Path("runs/sample_predictions"))
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--num_images", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=None, metavar="N")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Train, and return the run record's directory."""
    args = parse_args(argv)
    trainer = train(args)
    loss = trainer.run_history.get_latest_metric("eval_loss_epoch")
    trainer.print(f"final eval loss: {loss:.4f}; run record in {args.output_dir}")
    return Path(args.output_dir)


if __name__ == "__main__":
    main()

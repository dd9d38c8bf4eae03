r"""Track torchmetrics metrics in a callback, without subclassing the `Trainer`.

`ClassificationMetricsCallback` holds a torchmetrics `MetricCollection` (accuracy and macro F1)
and records its values in the trainer's run history after every evaluation epoch:

- at the start of each training or evaluation run it moves the metrics to `trainer.device`
  (they are not trainer attributes, so no default callback moves them);
- at the end of each eval step it gathers predictions and targets from every process with
  `trainer.gather_for_metrics`, which drops the samples repeated to even out the last batch;
- at the end of each eval epoch it computes the metrics into the run history and resets them.

The data are scikit-learn's bundled handwritten digits (8x8 images, nothing is downloaded),
split into train, eval and test sets; a small MLP classifies them. After training, the test set
is evaluated with `trainer.evaluate(..., metric_prefix="test_")`, so the same callback records
`test_accuracy` and `test_f1` next to `test_loss`, apart from the validation series.

Run it with:

    python examples/train_with_metrics_in_callback.py
    accelerate launch examples/train_with_metrics_in_callback.py

and on 2 CPU processes with `torchrun --nproc_per_node 2
examples/train_with_metrics_in_callback.py`. `--subset N` trains on the first N samples only,
for a run of a few seconds; `--help` lists every option.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback

NUM_CLASSES = 10
SPLIT_SEED = 0
"""Seed of the train/eval/test split: the same samples on every run and every process."""


class ClassificationMetricsCallback(TrainerCallback):
    """Record accuracy and macro F1 of every evaluation epoch in the run history.

    The metrics are recorded under the names of the collection (`accuracy` and `f1`), with the
    run history's prefix prepended. The callback keeps the default `order` (0), so
    `LogMetricsCallback` (`order = 100`) logs them with the epoch's eval loss.

    Args:
        num_classes: Number of classes of the task.
    """

    may_stop_training = False  # it never raises StopTrainingError: no per-step agreement

    def __init__(self, num_classes: int) -> None:
        self.metrics = MetricCollection(
            {
                "accuracy": MulticlassAccuracy(num_classes=num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes=num_classes, average="macro"),
            }
        )

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Move the metric states to the trainer's device."""
        self.metrics.to(trainer.device)

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Move the metric states to the trainer's device."""
        self.metrics.to(trainer.device)

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Update the metrics with the batch's predictions, gathered from every process."""
        predictions = batch_output["model_outputs"].argmax(dim=-1)
        predictions, targets = trainer.gather_for_metrics((predictions, batch[1]))
        self.metrics.update(predictions, targets)

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Record the epoch's metric values in the run history, then reset the metrics."""
        for name, value in self.metrics.compute().items():
            trainer.run_history.update_metric(name, value.item())
        self.metrics.reset()


def load_datasets(subset: int | None = None) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Load the digits and split them 60/20/20 into train, eval and test sets.

    Args:
        subset: Use only the first `subset` samples; `None` uses all 1,797.

    Returns:
        The train, eval and test datasets of `(features, labels)`: float32 features of shape
        `(N, 64)` scaled to `[0, 1]`, and int64 labels.
    """
    digits = load_digits()
    features = torch.tensor(digits.data[:subset], dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target[:subset], dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    num_held_out = len(labels) // 5
    test, held_out, train = order.split(
        [num_held_out, num_held_out, len(labels) - 2 * num_held_out]
    )
    return (
        TensorDataset(features[train], labels[train]),
        TensorDataset(features[held_out], labels[held_out]),
        TensorDataset(features[test], labels[test]),
    )


def create_model(hidden_size: int = 128) -> nn.Module:
    """Return an MLP from the 64 pixel values to 10 class logits."""
    return nn.Sequential(nn.Linear(64, hidden_size), nn.ReLU(), nn.Linear(hidden_size, NUM_CLASSES))


def train(args: argparse.Namespace) -> Trainer:
    """Train on the digits with the metrics callback, then evaluate the test set.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer. Its run history holds `accuracy` and `f1` for every epoch, and
        `test_accuracy`, `test_f1` and `test_loss` from the test evaluation.
    """
    set_seed(args.seed)
    train_dataset, eval_dataset, test_dataset = load_datasets(args.subset)
    model = create_model()
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=(*DEFAULT_CALLBACKS, ClassificationMetricsCallback(NUM_CLASSES)),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        num_epochs=args.num_epochs,
        per_device_batch_size=args.batch_size,
    )
    # test_loss, test_accuracy, test_f1: apart from the validation series
    trainer.evaluate(test_dataset, per_device_batch_size=args.batch_size, metric_prefix="test_")
    return trainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.

    Returns:
        The options: `num_epochs`, `batch_size`, `lr`, `seed` and `subset`.
    """
    parser = argparse.ArgumentParser(
        description="Track accuracy and F1 with torchmetrics in a callback (digits data)."
    )
    parser.add_argument("--num_epochs", type=int, default=8, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size per process")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate of AdamW")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument(
        "--subset",
        type=int,
        default=None,
        metavar="N",
        help="use only the first N samples of the data set (for quick checks)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train, evaluate the test set, and return the final metrics.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        `accuracy` and `f1` of the last eval epoch, and `test_accuracy` and `test_f1`.
    """
    trainer = train(parse_args(argv))
    names = ("accuracy", "f1", "test_accuracy", "test_f1")
    results = {name: float(trainer.run_history.get_latest_metric(name)) for name in names}
    trainer.print(", ".join(f"{name}: {value:.3f}" for name, value in results.items()))
    return results


if __name__ == "__main__":
    main()

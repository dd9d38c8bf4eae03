r"""Evaluate several eval sets while training, then evaluate and predict on a test set.

The digits data set (8x8 images of the digits 0-9) ships inside scikit-learn, so nothing is
downloaded. It is split into train, validation and test sets, and a "noisy" copy of the
validation set (Gaussian noise added to every pixel) stands for data the model was not
trained on. The example shows:

- ``train(..., eval_dataset={"val": ..., "noisy": ...})``: both sets are evaluated after every
  second epoch (``eval_every_n_epochs=2``, and always after the last), each set's loss and
  accuracy recorded under its name (``val_eval_loss_epoch``, ``noisy_accuracy``) by the same
  ``MetricsCallback``; a sanity evaluation of two batches per set before training
  (``sanity_eval_batches=2``) checks the evaluation path first;
- ``SaveBestModelCallback`` watching one set's metric (``val_accuracy``) and reloading the
  best weights at the end;
- ``trainer.evaluate(test_set, metric_prefix="test_")``, which returns the test metrics as a
  dict and leaves the validation series alone;
- ``trainer.predict(test_set)``: the logits of every test sample, in order, gathered from
  every process, from which the test accuracy is computed again by hand.

Run it with::

    python examples/evaluate_and_predict.py
    ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 \
        examples/evaluate_and_predict.py

``--subset N`` uses the first N samples only, for quick checks; ``--help`` lists every option.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import MetricsCallback, SaveBestModelCallback
from pytorch_accel.trainer import DEFAULT_CALLBACKS

NUM_CLASSES = 10


def load_datasets(
    subset: int | None = None, noise: float = 0.3
) -> tuple[TensorDataset, dict[str, TensorDataset], TensorDataset]:
    """Split the digits 60/20/20 into train, validation and test sets, plus a noisy validation.

    Args:
        subset: Use only the first ``subset`` samples; ``None`` uses all 1,797.
        noise: Standard deviation of the Gaussian noise of the ``noisy`` set (pixels in [0, 1]).

    Returns:
        The train set, the eval sets by name (``val``, ``noisy``), and the test set; images
        are float32 ``(N, 64)`` scaled to ``[0, 1]``, labels int64.
    """
    digits = load_digits()
    images = np.asarray(digits.data[:subset], dtype=np.float32) / 16.0
    labels = np.asarray(digits.target[:subset], dtype=np.int64)
    train_x, rest_x, train_y, rest_y = train_test_split(
        images, labels, test_size=0.4, random_state=0
    )
    val_x, test_x, val_y, test_y = train_test_split(rest_x, rest_y, test_size=0.5, random_state=0)
    generator = np.random.default_rng(0)
    noisy_x = np.clip(val_x + generator.normal(0, noise, val_x.shape), 0, 1).astype(np.float32)
    eval_sets = {"val": _dataset(val_x, val_y), "noisy": _dataset(noisy_x, val_y)}
    return _dataset(train_x, train_y), eval_sets, _dataset(test_x, test_y)


def _dataset(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))


def create_model() -> nn.Module:
    """A small MLP for the flattened 8x8 images."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES))


def train(args: argparse.Namespace, save_dir: Path) -> tuple[Trainer, dict[str, Any]]:
    """Train with two eval sets, keep the best model on ``val_accuracy``, evaluate the test set.

    Args:
        args: The parsed command line (see ``parse_args``).
        save_dir: Where the best checkpoint is written.

    Returns:
        The trainer (with the best weights loaded) and the test metrics ``evaluate`` returned.
    """
    set_seed(args.seed)
    train_dataset, eval_sets, test_dataset = load_datasets(args.subset)
    model = create_model()
    accuracy = MetricsCallback(
        MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro"), name="accuracy"
    )
    save_best = SaveBestModelCallback(
        save_path=save_dir / "best.pt", watch_metric="val_accuracy", greater_is_better=True
    )
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=(*DEFAULT_CALLBACKS, accuracy, save_best),
    )
    trainer.train(
        train_dataset,
        num_epochs=args.num_epochs,
        eval_dataset=eval_sets,
        per_device_batch_size=args.batch_size,
        eval_every_n_epochs=2,
        sanity_eval_batches=2,
    )
    test_metrics = trainer.evaluate(
        test_dataset, per_device_batch_size=args.batch_size, metric_prefix="test_"
    )
    return trainer, test_metrics


def predicted_accuracy(trainer: Trainer, dataset: TensorDataset, batch_size: int) -> float:
    """Return the accuracy of ``trainer.predict``'s logits on ``dataset``, computed by hand."""
    logits = trainer.predict(dataset, per_device_batch_size=batch_size)
    labels = dataset.tensors[1]
    assert logits.shape == (len(labels), NUM_CLASSES)  # every sample once, in order
    return float((logits.argmax(dim=1) == labels).float().mean())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments, without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The options: ``num_epochs``, ``batch_size``, ``lr``, ``seed``, ``subset`` and
        ``save_dir``.
    """
    parser = argparse.ArgumentParser(
        description="Several eval sets, then evaluate() and predict() on a test set (digits)."
    )
    parser.add_argument("--num_epochs", type=int, default=10, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size per process")
    parser.add_argument("--lr", type=float, default=2e-3, help="learning rate of AdamW")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument(
        "--subset", type=int, default=None, metavar="N", help="use only the first N samples"
    )
    parser.add_argument(
        "--save_dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "pytorch_accel_evaluate_and_predict",
        help="where the best checkpoint is written (the same path for every process)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train, evaluate and predict; print and return the final metrics.

    Args:
        argv: Command-line arguments (see ``--help``); ``None`` reads ``sys.argv``.

    Returns:
        The last ``val_accuracy`` and ``noisy_accuracy``, the test metrics ``evaluate``
        returned (``test_loss``, ``test_accuracy``), and ``predicted_accuracy``.
    """
    args = parse_args(argv)
    trainer, test_metrics = train(args, args.save_dir)
    history = trainer.run_history
    names = ("val_accuracy", "noisy_accuracy")
    results = {name: float(history.get_latest_metric(name)) for name in names}
    results |= {name: float(value) for name, value in test_metrics.items()}
    test_dataset = load_datasets(args.subset)[2]
    results["predicted_accuracy"] = predicted_accuracy(trainer, test_dataset, args.batch_size)
    trainer.print("  ".join(f"{name} {value:.4g}" for name, value in results.items()))
    return results


if __name__ == "__main__":
    main()

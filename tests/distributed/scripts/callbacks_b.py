"""Metrics, tracking and throughput callbacks in a 2-process run (odd-sized data sets)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.callbacks.metrics import MetricsCallback
from pytorch_accel.callbacks.throughput import ThroughputCallback
from pytorch_accel.callbacks.trackers import TrackingCallback

TRAIN_SAMPLES, EVAL_SAMPLES, BATCH = 30, 21, 4


class CountSamples(Metric):
    """Counts the targets it is given; torchmetrics would sum it over processes if it synced."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.count += targets.shape[0]

    def compute(self) -> torch.Tensor:
        return self.count


class TrackerCount(TrainerCallback):
    """Notes how many trackers the tracking callback holds on this process, each epoch."""

    order = 200

    def __init__(self, tracking: TrackingCallback) -> None:
        self.tracking = tracking
        self.counts: list[int] = []

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.counts.append(len(self.tracking.trackers))


def classification_data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(samples, 4, generator=generator),
        torch.randint(0, 3, (samples,), generator=generator),
    )


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    metrics = MetricsCallback(
        {"accuracy": MulticlassAccuracy(num_classes=3, average="micro"), "n": CountSamples()},
        train=True,
    )
    tracking = TrackingCallback(logging_dir=out / "runs", csv_path=out / "metrics.csv")
    throughput, tracker_count = ThroughputCallback(), TrackerCount(tracking)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(metrics, tracking, throughput, tracker_count),
    )
    eval_set = classification_data(EVAL_SAMPLES, seed=1)
    trainer.train(
        classification_data(TRAIN_SAMPLES, seed=0),
        num_epochs=2,
        eval_dataset=eval_set,
        per_device_batch_size=BATCH,
    )
    inputs, targets = eval_set.tensors
    with torch.no_grad():
        expected = (trainer.get_model()(inputs).argmax(-1) == targets).float().mean().item()
    history = trainer.run_history
    assert throughput.last_epoch is not None
    report_and_exit(
        {
            "history": {
                name: history.get_metric_values(name) for name in history.get_metric_names()
            },
            "expected_accuracy": expected,
            "tracker_counts": tracker_count.counts,
            "throughput_samples": throughput.last_epoch.samples,
            "throughput_updates": throughput.last_epoch.updates,
        }
    )


if __name__ == "__main__":
    main()

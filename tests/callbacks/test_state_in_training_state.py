"""Callbacks that accumulate across batches resume mid-epoch exactly: real training, a save in
the middle of an epoch, a new trainer resuming from it, and the uninterrupted run to compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SaveAtStep
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    MetricsCallback,
    StepLoggingCallback,
    ThroughputCallback,
)


def classification_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(64, 4, generator=generator)
    return TensorDataset(inputs, (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0).long())


class StepLosses(StepLoggingCallback):
    """Keep the interval losses it would log, by update."""

    def __init__(self) -> None:
        super().__init__(log_every_n_updates=3)
        self.losses: dict[int, float] = {}

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.losses[step] = metrics["train_loss_step"]


def run(*extra: Any, resume_from: Path | None = None) -> tuple[Trainer, Any, StepLosses]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    # accuracy and precision share torchmetrics' compute group (the same tp/fp/tn/fn states)
    metrics = MetricsCallback(
        MetricCollection(
            {"acc": MulticlassAccuracy(num_classes=3), "prec": MulticlassPrecision(num_classes=3)}
        ),
        train=True,
    )
    throughput, steps = ThroughputCallback(), StepLosses()
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.5),
        callbacks=(metrics, throughput, steps, *extra),
    )
    trainer.train(
        classification_data(),
        num_epochs=2,
        eval_dataset=classification_data(),
        per_device_batch_size=8,
        resume_from=resume_from,
    )
    return trainer, throughput, steps


@pytest.mark.parametrize("step", [3, 13])  # mid epoch 1, mid epoch 2
def test_a_mid_epoch_resume_records_the_same_callback_metrics(tmp_path: Path, step: int) -> None:
    uninterrupted, _, all_steps = run()
    run(SaveAtStep(tmp_path / "state", step))
    resumed, throughput, steps = run(resume_from=tmp_path / "state")
    expected = uninterrupted.run_history.state_dict()["metrics"]
    got = resumed.run_history.state_dict()["metrics"]
    for name in ("train_acc", "train_prec", "acc", "prec", "train_loss_epoch"):
        assert got[name] == expected[name], name
    assert throughput.last_epoch is not None
    assert throughput.last_epoch.samples == 64  # the whole epoch, counted once
    assert throughput.last_epoch.updates == 8
    # the interval in progress at the save continues: the same interval losses after it
    assert steps.losses == {update: all_steps.losses[update] for update in steps.losses}
    assert min(steps.losses) == 3 * (step // 3 + 1)  # the first logging point after the save

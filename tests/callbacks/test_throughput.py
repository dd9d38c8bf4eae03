"""ThroughputCallback in real training runs: counts, rates, data wait, no host reads per step."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from host_reads import HostReads
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.callbacks.throughput import ThroughputCallback

METRICS = ("train_samples_per_second", "train_updates_per_second", "train_data_wait_fraction")


def test_counts_and_rates_per_epoch() -> None:
    throughput = ThroughputCallback()
    trainer = make_trainer(callbacks=(throughput,))
    trainer.train(
        make_regression_dataset(30),
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
    )
    last = throughput.last_epoch
    assert last is not None
    assert (last.samples, last.updates) == (30, 3)  # 8 batches, windows of 3
    history = trainer.run_history
    assert all(len(history.get_metric_values(name)) == 2 for name in METRICS)
    assert history.get_latest_metric("train_samples_per_second") == 30 / last.seconds
    assert history.get_latest_metric("train_updates_per_second") == 3 / last.seconds
    assert 0.0 < last.data_wait_fraction < 1.0
    assert history.get_latest_metric("train_data_wait_fraction") == last.data_wait_fraction


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sleeps for every sample it returns: a slow input pipeline."""

    def __init__(self, dataset: TensorDataset, seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.seconds)
        return self.dataset[index]


class SlowLoss(nn.MSELoss):
    """Sleeps at every call: a slow model step."""

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return super().forward(predictions, targets)


def wait_fraction(dataset: Any, loss: nn.Module) -> float:
    throughput = ThroughputCallback()
    model = make_model()
    trainer = Trainer(
        model, loss, torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(throughput,)
    )
    trainer.train(dataset, num_epochs=1, per_device_batch_size=4)
    return float(trainer.run_history.get_latest_metric("train_data_wait_fraction"))


def test_data_wait_fraction_tells_a_slow_pipeline_from_a_slow_step() -> None:
    dataset = make_regression_dataset(24)
    assert wait_fraction(SlowDataset(dataset, seconds=0.0025), nn.MSELoss()) > 0.6
    assert wait_fraction(dataset, SlowLoss()) < 0.4


class TensorBatchSizeTrainer(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        return {**output, "batch_size": torch.tensor(output["batch_size"])}


class EvaluateMidEpoch(TrainerCallback):
    """A slow intermediate evaluation after the first step, started after the throughput
    callback's step end: in the time it counts as waiting for the next batch."""

    order = 100

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if kwargs["step"] == 0:
            trainer.run_eval_epoch()

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        time.sleep(0.25)


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> HostReads:
    return HostReads(monkeypatch)


def test_tensor_batch_sizes_are_summed_on_the_device_without_host_reads(
    host_reads: HostReads,
) -> None:
    throughput = ThroughputCallback()
    model = make_model()
    trainer = TensorBatchSizeTrainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(throughput, *host_reads.callbacks),
    )
    trainer.train(make_regression_dataset(30), num_epochs=1, per_device_batch_size=4)
    assert throughput.last_epoch is not None
    assert throughput.last_epoch.samples == 30
    assert host_reads.calls == []


def test_intermediate_evaluations_are_left_out_of_the_epoch_time() -> None:
    throughput = ThroughputCallback()
    trainer = make_trainer(callbacks=(EvaluateMidEpoch(), throughput))
    started = time.perf_counter()
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        eval_dataset=make_regression_dataset(8),
        per_device_batch_size=4,
    )
    elapsed = time.perf_counter() - started
    assert throughput.last_epoch is not None
    epoch = throughput.last_epoch
    assert epoch.seconds < elapsed - 0.4  # the evaluation's 0.5 s is out
    # and not counted as waiting (in seconds, not as a fraction: on a loaded machine the
    # waits between tiny steps can be half of a short epoch)
    assert epoch.data_wait_fraction * epoch.seconds < 0.25

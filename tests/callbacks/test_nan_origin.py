"""TerminateOnNaNCallback(report_origin=True): where the first non-finite loss started."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from host_reads import HostReads
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TerminateOnNaNCallback, TrainerCallback


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class GatedModel(nn.Module):
    """``gate`` takes the log of feature 3: NaN for the one sample where it is negative."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.gate = Log()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.drop(self.norm(self.encoder(x)))
        return self.head(hidden * self.gate(x[:, 3:]))


def gated_dataset(bad_sample: int, value: float = -1.0, column: int = 3) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(64, 4, generator=generator) + 0.5
    inputs[bad_sample, column] = value
    return TensorDataset(inputs, torch.randn(64, 1, generator=generator))


def run(
    model: nn.Module, dataset: Dataset[Any], callback: TerminateOnNaNCallback, *extra: Any
) -> Trainer:
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(callback, *extra),
    )
    trainer.train(
        dataset, num_epochs=2, per_device_batch_size=8, train_dataloader_kwargs={"shuffle": False}
    )
    return trainer


def test_the_first_module_with_a_non_finite_output_is_named() -> None:
    callback = TerminateOnNaNCallback(report_origin=True)
    with pytest.warns(RuntimeWarning) as warned:
        trainer = run(GatedModel(), gated_dataset(bad_sample=27), callback)
    expected = (
        "the loss was nan in epoch 1 after 3 updates, on process 0: first non-finite output: "
        "gate (Log), 1 of 8 values NaN; the batch is finite"
    )
    assert callback.origin == expected
    (warning,) = [w for w in warned if "TerminateOnNaNCallback" in str(w.message)]
    assert str(warning.message) == f"TerminateOnNaNCallback: {expected}"
    assert isinstance(trainer.stopped_by, StopTrainingError)
    assert str(trainer.stopped_by).endswith(f"Where it started: {expected}.")
    # the update of that step spread the NaN into every weight: a re-run at the epoch's end
    # (where the default check stops) would have blamed the first layer
    assert not torch.isfinite(trainer.model.encoder[0].weight).any()


def test_a_non_finite_batch_is_said_to_be_one() -> None:
    callback = TerminateOnNaNCallback(report_origin=True)
    with pytest.warns(RuntimeWarning):
        run(GatedModel(), gated_dataset(bad_sample=9, value=float("nan"), column=0), callback)
    assert callback.origin == (
        "the loss was nan in epoch 1 after 1 updates, on process 0: first non-finite output: "
        "encoder.0 (Linear), 8 of 64 values NaN; the batch itself is not finite (batch[0]: 1 of "
        "32 values NaN)"
    )


class Probe(TrainerCallback):
    """Records the random state and batch-norm statistics at each ``on_backward_start``."""

    def __init__(self, order: int) -> None:
        self.order, self.seen = order, []  # type: ignore[misc]

    def on_backward_start(self, trainer: Trainer, **kwargs: Any) -> None:
        norm = trainer.model.norm
        self.seen.append((torch.get_rng_state(), norm.running_mean.clone(), norm.training))


def test_the_re_run_puts_back_the_random_state_and_the_buffers() -> None:
    before, after = Probe(order=-1000), Probe(order=1000)
    with pytest.warns(RuntimeWarning):
        run(
            GatedModel(),
            gated_dataset(bad_sample=27),
            TerminateOnNaNCallback(report_origin=True),
            before,
            after,
        )
    assert len(before.seen) == len(after.seen) == 8
    for (rng, mean, training), (rng_after, mean_after, training_after) in zip(
        before.seen, after.seen, strict=True
    ):
        assert torch.equal(rng, rng_after)
        torch.testing.assert_close(mean, mean_after, rtol=0, atol=0, equal_nan=True)
        assert training
        assert training_after


class DictBatches(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, bad_sample: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.features = torch.randn(32, 6, generator=generator)
        self.labels = torch.randint(0, 3, (32,), generator=generator)
        self.features[bad_sample] *= 1e4

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"features": self.features[index], "labels": self.labels[index]}


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.abs().sum(-1, keepdim=True) < 1e3).float()  # x, or x / 0 for a large row


class HFStyleModel(nn.Module):
    """Takes keyword arguments and returns its loss and logits, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), Scale(), nn.Linear(16, 3))

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> Mapping[str, torch.Tensor]:
        logits = self.body(features)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_dict_batches_of_a_model_computing_its_own_loss() -> None:
    model = HFStyleModel()
    callback = TerminateOnNaNCallback(report_origin=True)
    trainer = Trainer(
        model, None, torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(callback,)
    )
    with pytest.warns(RuntimeWarning):
        trainer.train(
            DictBatches(20),
            num_epochs=1,
            per_device_batch_size=8,
            train_dataloader_kwargs={"shuffle": False},
        )
    assert callback.origin is not None
    assert callback.origin.startswith(
        "the loss was nan in epoch 1 after 2 updates, on process 0: first non-finite output: "
        "body.2 (Scale), "
    )
    assert callback.origin.endswith("; the batch is finite")


@pytest.mark.parametrize(("report_origin", "reads"), [(False, 0), (True, 16)])
def test_the_report_costs_one_host_read_per_step_and_nothing_without_it(
    monkeypatch: pytest.MonkeyPatch, report_origin: bool, reads: int
) -> None:
    counted = HostReads(monkeypatch)
    callback = TerminateOnNaNCallback(report_origin=report_origin)
    run(GatedModel(), gated_dataset(bad_sample=0, value=1.0), callback, *counted.callbacks)
    assert counted.calls == ["__bool__"] * reads  # 2 epochs of 8 steps, every loss finite
    assert callback.origin is None


@pytest.mark.cuda
def test_on_cuda_the_origin_is_the_same() -> None:
    callback = TerminateOnNaNCallback(report_origin=True)
    with pytest.warns(RuntimeWarning):
        trainer = run(GatedModel(), gated_dataset(bad_sample=27), callback)
    assert trainer.device.type == "cuda"
    assert callback.origin == (
        "the loss was nan in epoch 1 after 3 updates, on process 0: first non-finite output: "
        "gate (Log), 1 of 8 values NaN; the batch is finite"
    )


class GatedModelOutOfMemoryAbove(GatedModel):
    """``GatedModel``, which "runs out of memory" on batches of more than 4 rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            raise torch.OutOfMemoryError(f"CUDA out of memory. ({x.shape[0]} rows, simulated)")
        return super().forward(x)


def test_a_batch_split_into_micro_batches_reports_the_micro_batch() -> None:
    model = GatedModelOutOfMemoryAbove()
    callback = TerminateOnNaNCallback(report_origin=True)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(callback,)
    )
    with pytest.warns(RuntimeWarning):
        trainer.train(
            gated_dataset(bad_sample=27),
            num_epochs=1,
            per_device_batch_size=8,
            train_dataloader_kwargs={"shuffle": False},
            on_oom="split",
        )
    assert callback.origin == (
        "the loss was nan in epoch 1 after 3 updates, on process 0: first non-finite output: "
        "gate (Log), 1 of 4 values NaN; the batch is finite"
    )

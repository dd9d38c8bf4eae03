"""Mixed precision through accelerate on CPU, in one process."""

from __future__ import annotations

import pytest
import torch
from helpers import hand_written_loop, make_model, make_trainer
from torch.utils.data import TensorDataset

UNSHUFFLED = {"shuffle": False}


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_bf16_autocasts_and_stays_close_to_fp32(
    monkeypatch: pytest.MonkeyPatch, regression_dataset: TensorDataset
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=2)
    trainer = make_trainer(model)
    assert trainer.run_config is None
    trainer.train(regression_dataset, num_epochs=2, train_dataloader_kwargs=UNSHUFFLED)
    assert trainer.run_config is not None
    assert trainer.run_config.mixed_precision == "bf16"
    difference = max_difference(trainer.get_model(), reference)
    assert 0 < difference < 1e-2  # autocast really ran in bf16, within the documented tolerance


def test_fp16_is_ignored_on_cpu(
    monkeypatch: pytest.MonkeyPatch, regression_dataset: TensorDataset
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=1)
    trainer = make_trainer(model)
    trainer.train(regression_dataset, num_epochs=1, train_dataloader_kwargs=UNSHUFFLED)
    assert trainer.accelerator.mixed_precision == "fp16"
    assert (
        trainer.accelerator.scaler is None
    )  # accelerate uses no grad scaler and no autocast on CPU
    assert max_difference(trainer.get_model(), reference) == 0.0

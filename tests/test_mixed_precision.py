"""Mixed precision through accelerate on CPU, in one process."""

from __future__ import annotations

import pytest
import torch
from helpers import hand_written_loop, make_model, make_trainer
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer

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
    with pytest.warns(UserWarning, match=r"'fp16' has no effect on the CPU"):
        trainer = make_trainer(model)
    trainer.train(regression_dataset, num_epochs=1, train_dataloader_kwargs=UNSHUFFLED)
    assert trainer.accelerator.mixed_precision == "fp16"
    assert (
        trainer.accelerator.scaler is None
    )  # accelerate uses no grad scaler and no autocast on CPU
    assert max_difference(trainer.get_model(), reference) == 0.0


def test_bf16_from_the_constructor(regression_dataset: TensorDataset) -> None:
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=2)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        (),
        accelerator_kwargs={"mixed_precision": "bf16"},
    )
    trainer.train(regression_dataset, num_epochs=2, train_dataloader_kwargs=UNSHUFFLED)
    assert trainer.run_config is not None
    assert trainer.run_config.mixed_precision == "bf16"
    assert 0 < max_difference(trainer.get_model(), reference) < 1e-2  # autocast ran in bf16


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("accelerator_kwargs", "error", "message"),
    [
        (
            {"mixed_precison": "bf16"},
            TypeError,
            r"Trainer: accelerator_kwargs must be a mapping of accelerate\.Accelerator's "
            r"arguments, got \{'mixed_precison': '\.\.\.'\} \(dict\)\. Did you mean "
            r"'mixed_precision'\?",
        ),
        (["bf16"], TypeError, r"Trainer: accelerator_kwargs must be a dict or None"),
        (
            {"gradient_accumulation_steps": 4},
            ValueError,
            r"gradient_accumulation_steps must be 1 on the Accelerator, got 4",
        ),
    ],
)
def test_bad_accelerator_kwargs(accelerator_kwargs: object, error: type, message: str) -> None:
    model = make_model()
    with pytest.raises(error, match=message):
        Trainer(
            model,
            nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            accelerator_kwargs=accelerator_kwargs,  # type: ignore[arg-type]
        )

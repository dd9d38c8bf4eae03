"""What ``Trainer(...)`` says about accelerate settings it cannot honour (issue 41).

An FSDP version accelerate does not implement, fp16 on the CPU (accepted by accelerate, and
ignored), and a second trainer in one process with another precision.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer


def trainer_with(**accelerator_kwargs: object) -> Trainer:
    model = make_model()
    return Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        (),
        accelerator_kwargs=accelerator_kwargs,
    )


@pytest.mark.bad_input
def test_an_fsdp_version_accelerate_does_not_implement_is_refused_at_the_trainer() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=3)
    with pytest.raises(
        ValueError,
        match=r"Trainer: accelerator_kwargs: fsdp_plugin\.fsdp_version must be 1 or 2 .*got 3 "
        r"\(int\)\. Pass FullyShardedDataParallelPlugin\(fsdp_version=2\)",
    ):
        trainer_with(fsdp_plugin=plugin)


@pytest.mark.bad_input
def test_an_fsdp_version_from_the_launcher_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "3")
    with pytest.raises(ValueError, match=r"FSDP_VERSION must be 1 or 2 .*got 3"):
        trainer_with()


@pytest.mark.bad_input
def test_fp16_on_the_cpu_warns_and_the_run_config_says_float32() -> None:
    with pytest.warns(UserWarning, match=r"mixed_precision='fp16' has no effect on the CPU.*bf16"):
        trainer = trainer_with(mixed_precision="fp16")
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=8)
    assert trainer.accelerator.mixed_precision == "fp16"  # what accelerate was asked for
    assert trainer.run_config is not None
    assert trainer.run_config.mixed_precision == "no"  # what training ran in


def test_bf16_on_the_cpu_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer = trainer_with(mixed_precision="bf16")
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=8)
    assert trainer.run_config is not None
    assert trainer.run_config.mixed_precision == "bf16"


@pytest.mark.bad_input
def test_a_second_trainer_with_another_precision_names_both_and_the_fix() -> None:
    trainer_with(mixed_precision="bf16")
    with pytest.raises(
        ValueError,
        match=r"Trainer: accelerator_kwargs asks for mixed_precision='no', but a trainer created "
        r"earlier in this process set up accelerate with mixed_precision='bf16'.*same "
        r"mixed_precision.*a process of its own",
    ):
        trainer_with(mixed_precision="no")
    trainer_with(mixed_precision="bf16")  # the same setting: a second trainer is fine

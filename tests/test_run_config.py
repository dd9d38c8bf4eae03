"""TrainerRunConfig: the values a run exposes, and to_dict."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from torch.utils.data import RandomSampler


def test_run_config_values_and_to_dict_with_eval() -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(50),
        num_epochs=3,
        eval_dataset=make_regression_dataset(10),
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        max_grad_norm=1.0,
    )
    config = trainer.run_config
    assert config is not None
    assert (config.num_epochs, config.train_dataloader_len) == (3, 13)
    assert config.num_update_steps_per_epoch == config.num_local_update_steps_per_epoch == 5
    assert config.total_num_update_steps == 15
    assert config.train_total_batch_size == 12
    assert config.eval_total_batch_size == 4
    assert (config.num_processes, config.is_distributed, config.mixed_precision) == (1, False, "no")
    assert config.is_world_process_zero
    assert config.is_local_process_zero
    as_dict = config.to_dict()
    assert as_dict["max_grad_norm"] == 1.0
    assert as_dict["eval_dl_kwargs"]["shuffle"] is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_epochs = 1  # type: ignore[misc]


def test_to_dict_without_eval_and_with_a_sampler() -> None:
    dataset = make_regression_dataset(16)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    trainer = make_trainer()
    trainer.train(dataset, num_epochs=1, train_dataloader_kwargs={"sampler": sampler})
    as_dict = trainer.run_config.to_dict()  # type: ignore[union-attr]
    assert as_dict["eval_dl_kwargs"] == {}
    assert as_dict["train_dl_kwargs"]["sampler"] is sampler
    assert "shuffle" not in as_dict["train_dl_kwargs"]


def test_evaluate_run_config() -> None:
    trainer = make_trainer()
    trainer.evaluate(make_regression_dataset(10), per_device_batch_size=5)
    config = trainer.run_config
    assert config is not None
    assert (config.num_epochs, config.train_dataloader_len, config.eval_per_device_batch_size) == (
        1,
        0,
        5,
    )


def test_evaluate_after_train_does_not_report_the_old_train_batch_size() -> None:
    trainer = make_trainer()
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    trainer.evaluate(make_regression_dataset(10), per_device_batch_size=5)
    config = trainer.run_config
    assert config is not None
    assert (config.train_per_device_batch_size, config.train_dl_kwargs) == (0, {})


def test_a_run_without_eval_does_not_report_the_previous_eval_loader() -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(16), num_epochs=1, eval_dataset=make_regression_dataset(8)
    )
    trainer.train(make_regression_dataset(16), num_epochs=1)
    config = trainer.run_config
    assert config is not None
    assert config.eval_dl_kwargs == {}
    assert trainer.eval_dataloader is None

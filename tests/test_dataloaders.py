"""Dataloader defaults and how user kwargs override them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from torch.utils.data import Dataset, SequentialSampler

from pytorch_accel.dataloaders import (
    default_dataloader_kwargs,
    default_num_workers,
    merge_dataloader_kwargs,
    seed_worker,
)


class ListDataset(Dataset[Any]):
    def __init__(self, size: int) -> None:
        self.data = make_regression_dataset(size)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return self.data[index]


def test_defaults_shuffle_train_not_eval_and_use_no_workers_for_tensors() -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_dataset(16), num_epochs=1, eval_dataset=make_regression_dataset(8)
    )
    config = trainer.run_config
    assert config is not None
    assert config.train_dl_kwargs["shuffle"] is True
    assert config.eval_dl_kwargs["shuffle"] is False
    assert config.train_dl_kwargs["num_workers"] == 0
    assert config.train_dl_kwargs["pin_memory"] is (trainer.device.type == "cuda")


@pytest.mark.parametrize(("device", "pinned"), [("cuda", True), ("cpu", False)])
def test_memory_is_pinned_only_for_a_cuda_device(device: str, pinned: bool) -> None:
    kwargs = default_dataloader_kwargs(
        ListDataset(4), 2, shuffle=True, num_local_processes=1, device=torch.device(device)
    )
    assert kwargs["pin_memory"] is pinned


def test_worker_defaults_for_other_datasets() -> None:
    workers = default_num_workers(ListDataset(4), num_local_processes=1)
    assert 0 <= workers <= 4
    trainer = make_trainer()
    trainer.train_dataset = ListDataset(4)
    kwargs = trainer.get_default_train_dl_kwargs(2)
    assert kwargs["num_workers"] == workers
    assert kwargs.get("persistent_workers", False) is (workers > 0)


def test_training_with_persistent_workers_end_to_end() -> None:
    trainer = make_trainer()
    trainer.train(
        ListDataset(16),
        num_epochs=2,
        eval_dataset=ListDataset(8),
        train_dataloader_kwargs={"num_workers": 1},
        eval_dataloader_kwargs={"num_workers": 1},
    )
    config = trainer.run_config
    assert config is not None
    assert config.train_dl_kwargs["persistent_workers"] is True
    assert len(trainer.run_history.get_metric_values("eval_loss_epoch")) == 2


def test_user_kwargs_override_and_a_sampler_removes_shuffle() -> None:
    defaults = {
        "shuffle": True,
        "batch_size": 8,
        "num_workers": 2,
        "persistent_workers": True,
        "worker_init_fn": seed_worker,
    }
    sampler = SequentialSampler(range(4))
    merged = merge_dataloader_kwargs(defaults, {"sampler": sampler, "batch_size": 2})
    assert "shuffle" not in merged
    assert merged["sampler"] is sampler
    assert merged["batch_size"] == 2
    batch_sampler = merge_dataloader_kwargs(defaults, {"batch_sampler": [[0, 1]]})
    assert "batch_size" not in batch_sampler
    assert "shuffle" not in batch_sampler
    no_workers = merge_dataloader_kwargs(defaults, {"num_workers": 0})
    assert "persistent_workers" not in no_workers
    assert "worker_init_fn" not in no_workers
    assert merge_dataloader_kwargs(defaults, None) == defaults

"""Dataloader defaults and how user kwargs override them."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from torch.utils.data import Dataset, SequentialSampler, Subset

from pytorch_accel.dataloaders import (
    default_dataloader_kwargs,
    default_num_workers,
    items_are_stored,
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


class BuiltDataset(Dataset[Any]):
    """Builds each item anew at every read, as decoding a file does."""

    def __init__(self, size: int) -> None:
        self.data = make_regression_dataset(size)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        inputs, targets = self.data[index]
        return inputs.clone(), targets.clone()


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
    workers = default_num_workers(BuiltDataset(4), num_local_processes=1)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert workers == max(0, min(4, (cpus or 1) - 1))
    trainer = make_trainer()
    trainer.train_dataset = BuiltDataset(4)
    kwargs = trainer.get_default_train_dl_kwargs(2)
    assert kwargs["num_workers"] == workers
    assert kwargs.get("persistent_workers", False) is (workers > 0)


def test_training_with_persistent_workers_end_to_end() -> None:
    trainer = make_trainer()
    trainer.train(
        BuiltDataset(16),
        num_epochs=2,
        eval_dataset=BuiltDataset(8),
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


def _tokenised(size: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.arange(size * 6).reshape(size, 6)
    labels = ids.float()
    return [
        {"input_ids": row, "attention_mask": torch.ones(6), "labels": label}
        for row, label in zip(ids, labels, strict=True)
    ]


@pytest.mark.parametrize(
    "dataset",
    [
        ListDataset(4),  # a Dataset indexing tensors it holds
        _tokenised(4),  # tokenised text: a list of dicts of tensors
        Subset(make_regression_dataset(4), [2, 3]),
        [(np.arange(3.0), 1), (np.arange(3.0), 0)],  # NumPy arrays and labels
        ["some raw text", "to tokenise in collate_fn"],
    ],
    ids=["indexing", "tokenised", "subset", "numpy", "strings"],
)
def test_no_workers_for_items_already_in_memory(dataset: Any) -> None:
    """A worker's hand-over costs more per batch than reading a stored item (issue 44)."""
    assert items_are_stored(dataset)
    assert default_num_workers(dataset, num_local_processes=1) == 0


class RandomCrop(Dataset[Any]):
    """A random transform of stored tensors: a new tensor, and draws, at every read."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        start = int(torch.randint(0, 2, ()))
        return torch.arange(8.0)[start : start + 4] * random.random()


class Unreadable(Dataset[Any]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        raise KeyError(index)


@pytest.mark.parametrize("dataset", [BuiltDataset(4), RandomCrop(), Unreadable(), []])
def test_items_built_at_each_read_are_not_stored(dataset: Any) -> None:
    assert not items_are_stored(dataset)


def test_the_check_leaves_the_random_states_as_they_were() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert not items_are_stored(RandomCrop())
    drawn = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(drawn[0], expected[0])
    assert drawn[1:] == expected[1:]


def test_tokenised_text_trains_without_workers() -> None:
    """Dict batches of tokenised text: the main process loads them (HF Trainer's default too)."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(64, 4)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.embedding(input_ids).mean(-1)

    model = Model()
    trainer = make_trainer(model=model)
    trainer.train(_tokenised(8), num_epochs=1, per_device_batch_size=4)
    config = trainer.run_config
    assert config is not None
    assert config.train_dl_kwargs["num_workers"] == 0
    assert "persistent_workers" not in config.train_dl_kwargs

"""The trainer's iteration of prepared dataloaders matches accelerate's, batch for batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderShard, skip_first_batches
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel._resumable import make_resumable
from pytorch_accel.dataloaders import epoch_batches, iterate, passes_batches_through

Observation = tuple[list[torch.Tensor], bool, bool, bool]


def _prepared(accelerator: Accelerator, dataset: TensorDataset, by_epoch: bool = False) -> Any:
    """A shuffled loader; ``by_epoch``: its order comes from the epoch set by ``set_epoch``."""
    if by_epoch:
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
        loader = DataLoader(dataset, batch_size=5, sampler=sampler)
    else:
        loader = DataLoader(dataset, batch_size=5, shuffle=True)
    return accelerator.prepare_data_loader(loader, device_placement=False)


def _observe(
    accelerator: Accelerator, dataloader: Any, iterator_of: Callable[[Any], Iterator[Any]]
) -> tuple[list[Observation], int, bool, torch.Tensor]:
    """Iterate two epochs; record each batch and the state accelerate exposes while it is out."""
    state = accelerator.gradient_state
    seen: list[Observation] = []
    for _ in range(2):
        for batch in iterator_of(dataloader):
            active = state.active_dataloader is dataloader
            seen.append((batch, dataloader.end_of_dataloader, state.end_of_dataloader, active))
    return seen, dataloader.iteration, state.active_dataloader is None, torch.get_rng_state()


def _assert_same(
    ours: tuple[list[Observation], int, bool, torch.Tensor],
    theirs: tuple[list[Observation], int, bool, torch.Tensor],
) -> None:
    assert len(ours[0]) == len(theirs[0]) == 2 * 5
    for (batch, *flags), (their_batch, *their_flags) in zip(ours[0], theirs[0], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(batch, their_batch, strict=True))
        assert flags == their_flags
    assert ours[1:3] == theirs[1:3] == (2, True)
    assert torch.equal(ours[3], theirs[3])


@pytest.mark.parametrize("by_epoch", [False, True], ids=["random-sampler", "set-epoch-sampler"])
def test_passing_through_matches_accelerates_own_iteration(
    regression_dataset: TensorDataset, by_epoch: bool
) -> None:
    dataset = TensorDataset(*(tensor[:23] for tensor in regression_dataset.tensors))
    accelerator = Accelerator(cpu=True)
    runs = []
    for iterator_of in (iterate, iter):
        torch.manual_seed(0)
        dataloader = _prepared(accelerator, dataset, by_epoch)
        assert passes_batches_through(dataloader)
        runs.append(_observe(accelerator, dataloader, iterator_of))
    _assert_same(*runs)
    ends = [end for _, end, _, _ in runs[0][0]]
    assert ends == [False] * 4 + [True] + [False] * 4 + [True]  # set before the last batch


def test_the_resumable_train_loader_passes_through_with_the_same_batches(
    regression_dataset: TensorDataset,
) -> None:
    accelerator = Accelerator(cpu=True)
    runs = []
    for iterator_of in (iterate, iter):
        torch.manual_seed(0)
        resumable = make_resumable(_prepared(accelerator, regression_dataset))
        assert resumable is not None
        assert passes_batches_through(resumable.dataloader)
        runs.append(_observe(accelerator, resumable.dataloader, iterator_of))
    assert len(runs[0][0]) == 2 * 13
    for (batch, *flags), (their_batch, *their_flags) in zip(runs[0][0], runs[1][0], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(batch, their_batch, strict=True))
        assert flags == their_flags


class _Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(12.0).split(1))


def test_only_loaders_whose_batches_pass_through_untouched_take_the_short_path(
    regression_dataset: TensorDataset,
) -> None:
    accelerator = Accelerator(cpu=True)
    placed = accelerator.prepare_data_loader(DataLoader(regression_dataset, batch_size=5))
    stream = accelerator.prepare_data_loader(
        DataLoader(_Stream(), batch_size=2), device_placement=False
    )
    skipping = skip_first_batches(stream, 2)
    stateful = _prepared(accelerator, regression_dataset)
    stateful.base_dataloader.state_dict = dict  # as a stateful dataloader has one to snapshot
    assert type(placed) is DataLoaderShard
    assert placed.device is not None
    assert type(skipping) is DataLoaderShard
    assert skipping.skip_batches == 2
    for dataloader in (placed, skipping, stateful, DataLoader(regression_dataset)):
        assert not passes_batches_through(dataloader)
    assert passes_batches_through(stream)
    assert [batch.flatten().tolist() for batch in iterate(skipping)] == [
        [4.0, 5.0],
        [6.0, 7.0],
        [8.0, 9.0],
        [10.0, 11.0],
    ]


def test_an_empty_loader_yields_nothing_and_is_released() -> None:
    accelerator = Accelerator(cpu=True)
    empty = TensorDataset(torch.zeros(0, 2))
    dataloader = accelerator.prepare_data_loader(
        DataLoader(empty, batch_size=2), device_placement=False
    )
    assert passes_batches_through(dataloader)
    assert list(iterate(dataloader)) == []
    assert accelerator.gradient_state.active_dataloader is None
    assert dataloader.iteration == 0  # as accelerate: an epoch without batches is not counted


def test_an_epoch_cut_short_releases_the_loader(regression_dataset: TensorDataset) -> None:
    accelerator = Accelerator(cpu=True)
    dataloader = _prepared(accelerator, regression_dataset)
    with epoch_batches(dataloader, limit=3) as batches:
        assert len(list(batches)) == 3
        assert accelerator.gradient_state.active_dataloader is dataloader
    assert accelerator.gradient_state.active_dataloader is None


@pytest.mark.parametrize("with_eval", [False, True])
def test_the_trainer_takes_the_short_path_on_the_cpu(
    regression_dataset: TensorDataset, small_eval_dataset: TensorDataset, with_eval: bool
) -> None:
    model = torch.nn.Linear(4, 1)
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=()
    )
    eval_dataset = small_eval_dataset if with_eval else None
    trainer.train(regression_dataset, num_epochs=1, eval_dataset=eval_dataset)
    assert passes_batches_through(trainer.train_dataloader)
    assert not with_eval or passes_batches_through(trainer.eval_dataloader)

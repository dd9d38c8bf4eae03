"""The data a run iterates: dataloader settings, evaluation sets, and iterating the batches.

**Dataloader settings.** The default keyword arguments of the train and eval dataloaders the
trainer builds, and how user keyword arguments combine with them.

**Evaluation sets.** ``train(..., eval_dataset=...)`` and ``evaluate(...)`` take either one
dataset (or ``DataLoader``), whose metrics keep their plain names (``eval_loss_epoch``,
``accuracy``), or a mapping ``{"val": ..., "ood": ...}`` of named sets. Each named set is
evaluated in turn with the run history's prefix extended by ``"<name>_"``, so everything
recorded while it is evaluated, by the trainer and by every callback, is named after it
(``val_eval_loss_epoch``, ``ood_accuracy``) without any callback knowing about sets.

**Iterating the batches.** accelerate's ``DataLoaderShard.__iter__`` does some work per batch
even where it has nothing to do (``send_to_device``; a ``hasattr(dataloader, "state_dict")``
that raises and catches an ``AttributeError`` for every plain ``DataLoader``). Where none of
it applies, ``iterate`` runs the same epoch without it. ``epoch_batches`` is how the loop
iterates one epoch of a prepared dataloader.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sized
from typing import Any

import torch
from accelerate.data_loader import DataLoaderShard
from accelerate.utils import synchronize_rng_states
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from pytorch_accel._checks import fail
from pytorch_accel._stored_items import items_are_stored

__all__ = [
    "EVAL_SET_NAME_PATTERN",
    "LIMIT_BATCHES_ENV_VAR",
    "OLD_LIMIT_BATCHES_ENV_VAR",
    "default_dataloader_kwargs",
    "default_num_workers",
    "epoch_batches",
    "eval_set_prefix",
    "items_are_stored",
    "iterate",
    "loader_settings",
    "merge_dataloader_kwargs",
    "named_eval_sets",
    "num_batches",
    "passes_batches_through",
    "seed_worker",
    "worker_init_fn",
]


def default_num_workers(
    dataset: object, num_local_processes: int, *, read_items: bool = True
) -> int:
    """Return a sensible number of loader workers for one process.

    0 where the items are already in memory: a ``TensorDataset``, or a dataset whose first
    item, read twice, comes back as the same objects (tensors and arrays: views of the same
    memory), as with a list of tokenised samples or a ``Dataset`` that indexes tensors it
    holds (``items_are_stored``). Loading such items costs microseconds, less than a
    worker's hand-over of each batch (about 1 ms) and its start at every ``train()`` call
    (tens of ms). 0 also for an ``IterableDataset`` (each worker would yield the whole stream
    unless it shards itself: pass ``num_workers`` then). Otherwise, where each read builds
    its item anew (decoding a file, transforms), one worker per spare CPU of the process, at
    most 4, leaving one CPU for the training loop.

    The choice depends only on the dataset and the machine, never on timings, so every
    process of a run makes the same one.

    Args:
        dataset: The dataset to load.
        num_local_processes: Processes sharing this machine's CPUs.
        read_items: Whether the first item may be read (``items_are_stored``); without it
            only a ``TensorDataset`` or a stream counts as in memory.

    Returns:
        The number of workers.
    """
    in_memory = isinstance(dataset, (TensorDataset, IterableDataset))
    if in_memory or (read_items and items_are_stored(dataset)):
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min(4, (cpus or 1) // max(1, num_local_processes) - 1))


def num_batches(dataloader: Sized) -> int | None:
    """Return the dataloader's batches per epoch, or ``None`` when it has no length.

    A dataloader over an ``IterableDataset`` defines ``__len__`` but raises ``TypeError``.
    """
    try:
        return len(dataloader)
    except TypeError:
        return None


def seed_worker(worker_id: int) -> None:
    """Seed NumPy in a dataloader worker from the seed torch gave that worker.

    torch seeds Python's ``random`` and itself per worker, but not NumPy, so NumPy-based
    augmentations would repeat across workers without this.

    Args:
        worker_id: The worker's index (unused: torch's per-worker seed already differs).
    """
    import numpy as np

    np.random.seed(torch.initial_seed() % 2**32)


worker_init_fn = seed_worker
"""pytorch-accelerated's name for the workers' set-up function, which is ``seed_worker`` here.

Its version returned ``torch.seed() + worker_id`` without seeding anything (``torch.seed()``
re-seeds torch at random), which made every run's workers draw differently.
"""


def default_dataloader_kwargs(
    dataset: object,
    batch_size: int,
    *,
    shuffle: bool,
    num_local_processes: int,
    device: torch.device | None = None,
    collate_fn: Callable[..., Any] | None = None,
    read_items: bool = True,
) -> dict[str, Any]:
    """Return the default keyword arguments of a train or eval dataloader.

    Args:
        dataset: The dataset to load.
        batch_size: Samples per batch on each process.
        shuffle: Whether to shuffle (train) or not (eval).
        num_local_processes: Processes sharing this machine's CPUs.
        device: The device the batches go to. Memory is pinned only for a CUDA device (on
            a CPU run it would cost time and pinned memory for nothing); without a device,
            whenever CUDA is available.
        collate_fn: The collate function, if not the default.
        read_items: Whether ``default_num_workers`` may read the dataset's first item;
            ``False`` where the user's ``num_workers`` overrides the default anyway.

    Returns:
        ``shuffle``, ``batch_size``, ``pin_memory``, ``num_workers``, and, with workers,
        ``persistent_workers`` and ``worker_init_fn``; ``collate_fn`` if given.
    """
    num_workers = default_num_workers(dataset, num_local_processes, read_items=read_items)
    pin_memory = torch.cuda.is_available() if device is None else device.type == "cuda"
    kwargs: dict[str, Any] = {
        "shuffle": shuffle and not isinstance(dataset, IterableDataset),  # a stream has no order
        "batch_size": batch_size,
        "pin_memory": pin_memory,
        "num_workers": num_workers,
    }
    if num_workers > 0:
        kwargs.update(persistent_workers=True, worker_init_fn=seed_worker)
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    return kwargs


def merge_dataloader_kwargs(
    defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Combine default and user dataloader kwargs; the user's win.

    A user ``sampler`` removes the default ``shuffle``; a user ``batch_sampler`` also removes
    ``batch_size``; ``num_workers=0`` removes the worker-only defaults.

    Args:
        defaults: The defaults, from ``default_dataloader_kwargs``.
        overrides: The user's kwargs, or ``None``.

    Returns:
        The kwargs to build the ``DataLoader`` with.
    """
    overrides = dict(overrides or {})
    merged = dict(defaults)
    if "sampler" in overrides or "batch_sampler" in overrides:
        merged.pop("shuffle", None)
    if "batch_sampler" in overrides:
        merged.pop("batch_size", None)
    if overrides.get("num_workers", merged.get("num_workers", 0)) == 0:
        merged.pop("persistent_workers", None)
        merged.pop("worker_init_fn", None)
    merged.update(overrides)
    return merged


# Evaluation sets

EVAL_SET_NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
"""A set's name: a letter, then letters, digits, ``_``, ``.`` or ``-`` (it starts metric names)."""


def loader_settings(dataloader: DataLoader[Any]) -> dict[str, Any]:
    """The settings a user-built ``DataLoader`` holds, as the run config records them."""
    names = ("batch_size", "num_workers", "pin_memory", "drop_last", "collate_fn")
    return {name: getattr(dataloader, name) for name in names}


def named_eval_sets(where: str, argument: str, data: Any) -> dict[str | None, Any]:
    """Return the evaluation sets in ``data`` by name: ``{None: data}`` for one unnamed set.

    Args:
        where: The entry point, for messages.
        argument: The argument's name, for messages.
        data: A dataset or ``DataLoader``, or a mapping of set names to them.

    Returns:
        The sets in the mapping's order; the datasets themselves are checked by the caller.

    Raises:
        ValueError: If the mapping is empty or a name is not a usable metric-name prefix.
        TypeError: If a name is not a string.
    """
    if not isinstance(data, Mapping):
        return {None: data}
    if not data:
        fail(
            ValueError,
            where,
            argument,
            data,
            "a dataset or a non-empty mapping of set names to datasets",
            f"Pass e.g. {argument}={{'val': val_dataset, 'test': test_dataset}}.",
        )
    for name in data:
        _check_name(where, argument, name)
    return dict(data)


def eval_set_prefix(name: str | None) -> str:
    """Return the run-history prefix of a set's metrics: ``""`` unnamed, else ``"<name>_"``."""
    return "" if name is None else f"{name}_"


def _check_name(where: str, argument: str, name: object) -> None:
    if not isinstance(name, str) or not EVAL_SET_NAME_PATTERN.fullmatch(name):
        fail(
            ValueError if isinstance(name, str) else TypeError,
            where,
            f"{argument}'s key",
            name,
            "a name that starts with a letter (letters, digits, _ . -)",
            "Its metrics are named '<name>_...': use e.g. 'val' or 'ood-test'.",
        )
    if name == "train":  # its metrics would land in the training series (train_accuracy)
        fail(
            ValueError,
            where,
            f"{argument}'s key",
            name,
            "a name other than 'train'",
            "'train_' is the prefix of training metrics (MetricsCallback(train=True) records "
            "train_accuracy): name the set e.g. 'train-set'.",
        )


# Iterating the batches


@contextlib.contextmanager
def epoch_batches(
    dataloader: Iterable[Any], limit: int | None
) -> Generator[Iterator[Any], None, None]:
    """Iterate at most ``limit`` batches; always close the iterator and release the loader.

    accelerate only forgets a dataloader it saw to the end; a loop cut short would otherwise
    leave it as the active one.

    Args:
        dataloader: A dataloader, usually one prepared by accelerate.
        limit: The most batches to yield, or ``None`` for all of them.

    Yields:
        An iterator over the batches (see ``iterate``).
    """
    iterator = iterate(dataloader)
    try:
        yield iterator if limit is None else itertools.islice(iterator, limit)
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()
        end = getattr(dataloader, "end", None)
        if callable(end):
            end()


def iterate(dataloader: Iterable[Any]) -> Iterator[Any]:
    """Return an iterator over ``dataloader``'s batches, as ``iter(dataloader)`` would.

    A ``DataLoaderShard`` whose batches pass through unchanged (``passes_batches_through``)
    is iterated without accelerate's per-batch work, with the same batches, random draws and
    gradient-state bookkeeping.

    Args:
        dataloader: The dataloader to iterate.

    Returns:
        An iterator over its batches.
    """
    if passes_batches_through(dataloader):
        return _pass_through(dataloader)
    return iter(dataloader)


def passes_batches_through(dataloader: Any) -> bool:
    """Return whether accelerate would hand ``dataloader``'s batches over untouched.

    That is a ``DataLoaderShard`` without device placement, that skips no batches itself
    (a ``SkipBatchSampler`` skips by index, before loading) and whose dataloader keeps no state.
    """
    return (
        type(dataloader) is DataLoaderShard
        and dataloader.device is None
        and not dataloader.use_stateful_dataloader
        and dataloader.skip_batches == 0
        and not hasattr(dataloader.base_dataloader, "state_dict")
    )


_END = object()


def _pass_through(dataloader: DataLoaderShard) -> Generator[Any, None, None]:
    """``DataLoaderShard.__iter__`` for a dataloader whose batches pass through unchanged.

    The same steps in the same order: synchronise the random states, register with the
    gradient state, set the epoch, and look one batch ahead so that ``end_of_dataloader`` is
    set before the last batch is yielded.
    """
    if dataloader.rng_types is not None:
        synchronize_rng_states(dataloader.rng_types, dataloader.synchronized_generator)
    dataloader.begin()
    dataloader.set_epoch(dataloader.iteration)
    base = iter(dataloader.base_dataloader)
    current = next(base, _END)
    if current is _END:
        dataloader.end()
        return
    for following in base:
        yield current
        current = following
    dataloader.end_of_dataloader = True
    yield current
    dataloader.iteration += 1
    dataloader.end()


LIMIT_BATCHES_ENV_VAR = "PYTORCH_ACCEL_LIMIT_BATCHES"
"""The environment variable that makes new trainers use at most that many batches per epoch."""

OLD_LIMIT_BATCHES_ENV_VAR = "PT_ACC_LIMIT_BATCHES"
"""pytorch-accelerated's name of ``LIMIT_BATCHES_ENV_VAR`` (read with a deprecation warning)."""

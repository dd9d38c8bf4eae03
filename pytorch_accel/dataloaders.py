"""Default dataloader settings and how user keyword arguments combine with them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import IterableDataset, TensorDataset

__all__ = [
    "default_dataloader_kwargs",
    "default_num_workers",
    "merge_dataloader_kwargs",
    "num_batches",
    "seed_worker",
    "worker_init_fn",
]

_MAX_DEFAULT_WORKERS = 4


def _available_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_num_workers(dataset: object, num_local_processes: int) -> int:
    """Return a sensible number of loader workers for one process.

    In-memory tensor datasets load fastest in the main process (0 workers). An
    ``IterableDataset`` gets 0 too: with workers, each one would yield the whole stream unless
    the dataset splits itself with ``torch.utils.data.get_worker_info()`` (pass ``num_workers``
    yourself when it does). Otherwise each process gets one worker per spare CPU, at most 4,
    leaving one CPU for the training loop.

    Args:
        dataset: The dataset to load.
        num_local_processes: Processes sharing this machine's CPUs.

    Returns:
        The number of workers.
    """
    if isinstance(dataset, (TensorDataset, IterableDataset)):
        return 0
    per_process = _available_cpus() // max(1, num_local_processes)
    return max(0, min(_MAX_DEFAULT_WORKERS, per_process - 1))


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

    Returns:
        ``shuffle``, ``batch_size``, ``pin_memory``, ``num_workers``, and, with workers,
        ``persistent_workers`` and ``worker_init_fn``; ``collate_fn`` if given.
    """
    num_workers = default_num_workers(dataset, num_local_processes)
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

"""How the trainer iterates the batches of a prepared dataloader.

accelerate's ``DataLoaderShard.__iter__`` does some work per batch even where it has nothing to
do: it offers each batch to ``send_to_device`` when there is a device to move it to, and looks
for a ``state_dict`` on the dataloader (to snapshot a stateful one) with a ``hasattr`` that
fails, raising and catching an ``AttributeError``, for every plain ``DataLoader``. Where none
of that applies (no device placement, no stateful dataloader, nothing skipped by the shard
itself), ``iterate`` runs the same epoch without that per-batch work; everything else is left
to accelerate.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Generator, Iterable, Iterator
from typing import Any

from accelerate.data_loader import DataLoaderShard
from accelerate.utils import synchronize_rng_states

__all__ = ["epoch_batches", "iterate", "passes_batches_through"]


@contextlib.contextmanager
def epoch_batches(
    dataloader: Iterable[Any], limit: int | None
) -> Generator[Iterator[Any], None, None]:
    """Iterate at most ``limit`` batches; always close the iterator and release the loader.

    accelerate only forgets a dataloader it saw to the end; a loop cut short (a batch limit,
    ``max_num_train_steps``, a stop) would otherwise leave it as the active one.

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
    gradient-state bookkeeping; any other dataloader is iterated by ``iter``.

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

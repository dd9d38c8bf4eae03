"""The position of a train stream that can save it, restored on a resume without replaying.

A stream (a train dataloader over an ``IterableDataset``) has no index to skip to, so a run
resumed mid-pass replays the pass, unless the stream can save its position: a dataset with
``state_dict()`` and ``load_state_dict(state)`` read in the main process (``num_workers=0``;
in several processes, through accelerate's ``IterableDatasetShard``, which forwards them), or
torchdata's ``StatefulDataLoader`` over such a dataset, with or without workers.

accelerate's dataloaders load ahead of the batch trained on, so ``StreamPosition`` takes the
state before each batch the inner dataloader loads, keeps the last few by count, and gives a
save the one its position means; a resume loads it before the pass's iterator is created.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator, Mapping
from typing import Any

from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard, IterableDatasetShard
from torch.utils.data import DataLoader, IterableDataset

__all__ = [
    "StreamPosition",
    "check_stateful_dataloader_request",
    "stream_position",
    "track_stream_position",
]

_ATTRIBUTE = "_pytorch_accel_stream"
"""Where the inner dataloader keeps its ``StreamPosition``."""


def _has_state(obj: object) -> bool:
    return all(callable(getattr(obj, name, None)) for name in ("state_dict", "load_state_dict"))


class StreamPosition:
    """The saved positions of a train stream (``source``: its dataset or ``StatefulDataLoader``).

    Kept by the number of inner batches loaded; ``per_batch`` inner batches make a trainer's
    batch (the number of processes when the main process dispatches them, else 1).
    """

    def __init__(self, source: Any, per_batch: int) -> None:
        self.source, self.per_batch = source, per_batch
        self._history: collections.deque[tuple[int, Any]] = collections.deque(
            maxlen=2 * per_batch + 4
        )
        self._offset = self._next_offset = 0
        self._finished = False

    def begin_pass(self) -> None:
        """Start counting a new pass's inner batches (from a resumed position, if one was set)."""
        self._history.clear()
        self._offset, self._next_offset, self._finished = self._next_offset, 0, False

    def record(self, count: int) -> None:
        """Keep the position after ``count`` inner batches of this iterator (before the next)."""
        self._history.append((count, copy.deepcopy(self.source.state_dict())))

    def finish(self) -> None:
        """Note that the pass ended: its last position holds for any later count."""
        self._finished = True

    def state_at(self, batches_done: int) -> Any:
        """Return the position after ``batches_done`` batches of the pass (``None``: loads none).

        Raises:
            RuntimeError: If that position is no longer kept (never with the trainer's loop).
        """
        if not self._history:
            return None
        wanted = batches_done * self.per_batch - self._offset
        for count, state in reversed(self._history):
            if count == wanted:
                return state
        last_count, last_state = self._history[-1]
        if self._finished and wanted > last_count:  # the last, short round of a pass
            return last_state
        raise RuntimeError(
            f"Trainer.save_training_state: the stream's position after {batches_done} batches "
            f"is not kept (kept: {[count for count, _ in self._history]}); save between steps."
        )

    def resume_at(self, batches_done: int, state: Any) -> None:
        """Put the stream at a saved position: its next pass starts after ``batches_done``."""
        if state is not None:
            self.source.load_state_dict(state)
        self._next_offset = batches_done * self.per_batch


class _RecordingIterator:
    """An inner dataloader's iterator that records the stream's position before each batch."""

    def __init__(self, inner: Iterator[Any], position: StreamPosition) -> None:
        self._inner, self._position, self._count = inner, position, 0
        position.begin_pass()

    def __iter__(self) -> _RecordingIterator:
        return self

    def __next__(self) -> Any:
        self._position.record(self._count)
        try:
            batch = next(self._inner)
        except StopIteration:
            self._position.finish()
            raise
        self._count += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


_RECORDING_CLASSES: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    """A subclass of the inner dataloader's class whose iterators record the position."""
    if cls not in _RECORDING_CLASSES:
        inner_iter = cls.__iter__  # type: ignore[attr-defined]

        def __iter__(self: Any) -> Iterator[Any]:  # noqa: N807
            return _RecordingIterator(inner_iter(self), getattr(self, _ATTRIBUTE))

        _RECORDING_CLASSES[cls] = type(
            cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__}
        )
    return _RECORDING_CLASSES[cls]


def track_stream_position(prepared: Any) -> StreamPosition | None:
    """Have a prepared train dataloader over a stream record its position, if it can save it.

    Returns ``None`` for a map-style dataset (resumed by index), or a stream without
    ``state_dict``/``load_state_dict`` or read by workers of a plain ``DataLoader`` (replayed).
    """
    if type(prepared) not in (DataLoaderShard, DataLoaderDispatcher):
        return None
    inner = prepared.base_dataloader
    dataset = getattr(inner, "dataset", None)
    if not isinstance(inner, DataLoader) or not isinstance(dataset, IterableDataset):
        return None
    if (
        isinstance(dataset, IterableDatasetShard)
        and inner.num_workers == 0
        and _has_state(dataset.dataset)
    ):
        # each process reads the whole stream and keeps its part of each round: the position
        # is the stream's, which the shard forwards (not with workers: each worker's shard
        # completes its last round with samples of its own first, which a resume cannot)
        forwarding: Any = dataset
        forwarding.state_dict = forwarding.dataset.state_dict
        forwarding.load_state_dict = forwarding.dataset.load_state_dict
    if not _has_state(dataset):
        return None
    stateful_loader = bool(prepared.use_stateful_dataloader) and _has_state(inner)
    if not stateful_loader and inner.num_workers > 0:
        return None
    dispatched = type(prepared) is DataLoaderDispatcher and not prepared.split_batches
    per_batch = prepared.state.num_processes if dispatched else 1
    position = StreamPosition(inner if stateful_loader else dataset, per_batch)
    setattr(inner, _ATTRIBUTE, position)
    inner.__class__ = _recording_class(type(inner))
    return position


def stream_position(prepared: Any) -> StreamPosition | None:
    """Return the ``StreamPosition`` a prepared train dataloader records, if any."""
    inner = getattr(prepared, "base_dataloader", None)
    found = getattr(inner, _ATTRIBUTE, None) if isinstance(inner, DataLoader) else None
    return found if isinstance(found, StreamPosition) else None


def check_stateful_dataloader_request(where: str, kwargs: Mapping[Any, Any]) -> None:
    """Refuse ``use_stateful_dataloader=True`` without torchdata, before any run starts."""
    if not getattr(kwargs.get("dataloader_config"), "use_stateful_dataloader", False):
        return
    try:
        import torchdata.stateful_dataloader  # type: ignore[import-untyped]  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"{where}: accelerator_kwargs asks for torchdata's StatefulDataLoader "
            "(DataLoaderConfiguration(use_stateful_dataloader=True)), but torchdata is not "
            "installed. Install it with `pip install pytorch-accel[stateful]` (or "
            "`pip install torchdata`), or leave use_stateful_dataloader out: a stream with "
            "state_dict/load_state_dict resumes in constant time without it (num_workers=0)."
        ) from error

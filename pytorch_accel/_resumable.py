"""The loop's resume seam: the train dataloader that can restart mid-epoch, and epoch entry.

Every ``train()`` prepares its train dataloader as one that could resume mid-epoch
(``make_resumable``), since a training state may be saved at any step, and enters each epoch
through ``enter_epoch``; only a resumed epoch reaches the training-state code, through the
``ResumePoint`` (``_checkpointing.resume``) it is handed.

An epoch's order is drawn by its sampler at the epoch's first index request, from the global
torch generator or the one accelerate shares between processes. ``EpochRandomness`` records
those states then, so a resumed run replays them and gets the same permutation; accelerate's
``SkipBatchSampler`` skips the batches already trained on by index.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from accelerate.data_loader import DataLoaderShard, SkipBatchSampler, skip_first_batches

from pytorch_accel.dataloaders import epoch_batches

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer
    from pytorch_accel.tracking import LossTracker

__all__ = [
    "EpochEntry",
    "EpochRandomness",
    "PendingResume",
    "RandomStates",
    "ResumableLoader",
    "enter_epoch",
    "make_resumable",
]


@dataclass(frozen=True)
class RandomStates:
    """The global CPU generator's state and those of the samplers' own generators."""

    cpu: torch.Tensor
    generators: tuple[torch.Tensor, ...]

    def to_dict(self) -> dict[str, Any]:
        """Return the states as plain containers of tensors (safe to save and load)."""
        return {"cpu": self.cpu, "generators": list(self.generators)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RandomStates:
        """Rebuild from ``to_dict``'s output."""
        return cls(state["cpu"], tuple(state["generators"]))


class EpochRandomness:
    """Wraps a batch sampler; records (or replays) the random states each epoch's order uses."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.generators = _sampler_generators(batch_sampler)
        self.epoch_states: RandomStates | None = None
        self.replay: RandomStates | None = None

    def current_states(self) -> RandomStates:
        """Return the random states as they are now."""
        return RandomStates(
            torch.get_rng_state(), tuple(generator.get_state() for generator in self.generators)
        )

    def apply(self, states: RandomStates) -> None:
        """Set the global CPU generator and the samplers' generators to ``states``.

        States without generators (saved by another number of processes) set the CPU one only.
        """
        torch.set_rng_state(states.cpu)
        if not states.generators:
            return
        for generator, state in zip(self.generators, states.generators, strict=True):
            generator.set_state(state)

    def __iter__(self) -> Iterator[Any]:
        # The batches pass through C-level chaining: no Python frame per batch.
        return itertools.chain.from_iterable(self._begin_epoch())

    def _begin_epoch(self) -> Iterator[Any]:
        """Replay or record the random states at the epoch's first index request."""
        if self.replay is not None:
            self.apply(self.replay)
            self.replay = None
        self.epoch_states = self.current_states()
        yield self.batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    @property
    def sampler(self) -> Any:
        """The sampler inside (for ``set_epoch``), also through accelerate's shard."""
        inner = self.batch_sampler
        sampler = getattr(inner, "sampler", None)
        if sampler is None:
            sampler = getattr(getattr(inner, "batch_sampler", None), "sampler", None)
        if sampler is None:
            raise AttributeError("sampler")
        return sampler

    def __getattr__(self, name: str) -> Any:
        # ``batch_size``, ``num_processes``, ``split_batches``: what accelerate looks up.
        if name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)


class _ForwardingSkipBatchSampler(SkipBatchSampler):  # type: ignore[misc]
    """accelerate's ``SkipBatchSampler``, answering look-ups as the batch sampler it wraps.

    It reads ``skip_batches`` when an epoch's iterator is created; accelerate looks up
    ``batch_size``, ``num_processes`` (for ``gather_for_metrics``) and ``sampler``.
    """

    def __iter__(self) -> Iterator[Any]:
        # As accelerate's, but skipping in C (``islice``): no Python frame per batch.
        return itertools.islice(self.batch_sampler, self.skip_batches, None)

    def __getattr__(self, name: str) -> Any:
        if name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)


@dataclass(frozen=True)
class ResumableLoader:
    """A prepared train dataloader with its skip and randomness controls."""

    dataloader: Any
    skip: SkipBatchSampler
    randomness: EpochRandomness


def make_resumable(prepared: Any) -> ResumableLoader | None:
    """Rebuild accelerate's prepared train dataloader so it can resume mid-epoch.

    accelerate's ``skip_first_batches`` (skipping nothing yet) gives a dataloader whose
    ``SkipBatchSampler`` can be told how many batches to skip; its sampler is wrapped in
    ``EpochRandomness``. Batches, order and random draws are the prepared dataloader's.

    Returns:
        The dataloader and its controls, or ``None`` for dispatched batches and streams. (Under
        a ``StatefulDataLoader`` a map-style dataset is skipped by index too, in a plain one.)
    """
    if type(prepared) is not DataLoaderShard:
        return None
    rebuilt = skip_first_batches(prepared, 0)
    # Not carried over by skip_first_batches:
    rebuilt._non_blocking, rebuilt._drop_last = prepared._non_blocking, prepared._drop_last
    skip = rebuilt.batch_sampler
    if type(skip) is not SkipBatchSampler:
        return None
    skip.__class__ = _ForwardingSkipBatchSampler
    randomness = EpochRandomness(skip.batch_sampler)
    skip.batch_sampler = randomness
    return ResumableLoader(rebuilt, skip, randomness)


def _sampler_generators(batch_sampler: Any) -> tuple[torch.Generator, ...]:
    """Find the torch generators of the samplers nested in ``batch_sampler`` (each once)."""
    found: list[torch.Generator] = []
    node, seen = batch_sampler, 0
    while node is not None and seen < 8:
        generator = getattr(node, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
        node = getattr(node, "batch_sampler", None) or getattr(node, "sampler", None)
        seen += 1
    return tuple(found)


@dataclass(frozen=True)
class EpochEntry:
    """How an epoch starts: from its first batch, or where a resumed run left it.

    Attributes:
        batches_done: The batches of the epoch already trained on, which are skipped.
        random_state: The CPU random state to set once the first remaining batch is loaded.
        resumable: The train dataloader's skip and randomness controls, if it has them.
        replays: Whether the batches done are loaded again and dropped (a stream).
    """

    batches_done: int = 0
    random_state: torch.Tensor | None = None
    resumable: ResumableLoader | None = field(default=None, repr=False)
    replays: bool = False

    def restore_random_state(self) -> None:
        """Set the saved random state now (for an epoch that loads no batch)."""
        if self.random_state is not None:
            torch.set_rng_state(self.random_state)

    @contextlib.contextmanager
    def batches(self, dataloader: Iterable[Any], limit: int | None) -> Iterator[Iterator[Any]]:
        """Iterate the epoch's batches from ``batches_done`` on, at most ``limit`` in all."""
        if limit is not None and not self.replays:
            limit = max(0, limit - self.batches_done)
        try:
            with epoch_batches(dataloader, limit) as batches:
                if self.replays:  # in C: no Python frame per dropped batch
                    collections.deque(itertools.islice(batches, self.batches_done), maxlen=0)
                if self.random_state is not None:
                    batches = _restoring_after_first(batches, self.random_state)
                yield batches
        finally:
            if self.resumable is not None:
                self.resumable.skip.skip_batches = 0


class PendingResume(Protocol):
    """A loaded training state waiting for its epoch (``_checkpointing.resume.ResumePoint``)."""

    def enter_epoch(
        self, resumable: ResumableLoader | None, trainer: Trainer, loss_tracker: LossTracker
    ) -> EpochEntry:
        """Apply the state at the start of its epoch; return how the epoch starts."""


def enter_epoch(
    resume: PendingResume | None,
    resumable: ResumableLoader | None,
    trainer: Trainer,
    loss_tracker: LossTracker,
) -> EpochEntry:
    """Apply a pending resume (``None``: none) at the start of an epoch; return how it starts."""
    if resume is None:
        return EpochEntry(resumable=resumable)
    return resume.enter_epoch(resumable, trainer, loss_tracker)


def _restoring_after_first(
    batches: Iterator[Any], random_state: torch.Tensor
) -> Generator[Any, None, None]:
    """Yield ``batches``, setting the CPU random state once the first one is loaded (or none is).

    Creating the iterator draws from it; the resumed run continues from the saved state.
    """
    first = next(batches, _NO_BATCH)
    torch.set_rng_state(random_state)
    if first is not _NO_BATCH:
        yield first
        yield from batches


_NO_BATCH = object()

"""A train dataloader that can restart mid-epoch: same order, no data loaded for skipped batches.

An epoch's order is drawn by its sampler when the epoch's first batch of indices is requested:
``RandomSampler`` draws a seed from the global torch generator (one process) or from the
generator accelerate shares between processes. ``EpochRandomness`` records those random states
at that moment, so a resumed run can replay them and get the same permutation; accelerate's
``SkipBatchSampler`` then skips the batches already trained on by index arithmetic.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.data_loader import DataLoaderShard, SkipBatchSampler, skip_first_batches

__all__ = ["EpochRandomness", "RandomStates", "ResumableLoader", "make_resumable"]


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
    """Wraps a batch sampler; records (or replays) the random states each epoch's order uses.

    Args:
        batch_sampler: The batch sampler to wrap (accelerate's shard of it, with several
            processes).
    """

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
        """Set the global CPU generator and the samplers' generators to ``states``."""
        torch.set_rng_state(states.cpu)
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

    It reads ``skip_batches`` when an epoch's iterator is created (the trainer sets it before).

    accelerate reads ``batch_size`` and ``num_processes`` of a dataloader's batch sampler to
    know how many samples the last batches repeat (``gather_for_metrics`` drops them), and
    ``sampler`` to call ``set_epoch``.
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

    Uses accelerate's ``skip_first_batches`` (with nothing skipped yet) to get a dataloader
    whose ``SkipBatchSampler`` can be told, before an epoch starts, how many batches to skip;
    the sampler inside it is wrapped in ``EpochRandomness``. Batches, order and random draws are
    the same as the prepared dataloader's.

    Args:
        prepared: The dataloader returned by ``accelerator.prepare_data_loader``.

    Returns:
        The resumable dataloader and its controls, or ``None`` for dataloaders accelerate does
        not shard this way (dispatched batches, stateful dataloaders).
    """
    if type(prepared) is not DataLoaderShard or prepared.use_stateful_dataloader:
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

"""Where a resumed run picks up, and the train dataloader that can restart mid-epoch.

A resumed run enters the loop at two seams: ``ResumePoint.enter_run`` at the run's start (which
epoch; the callbacks of a state saved between epochs) and ``enter_epoch`` at that epoch's start
(the batches done, running loss, gradients, random states); the batch loop knows nothing of it.

A callback's ``state_dict()``/``load_state_dict(state)`` is its **shared** state, saved by the
main process and loaded on every process; ``rank_state_dict()``/``load_rank_state_dict(state)``
its **per-process** state, saved by every process and loaded back on the same one.

An epoch's order is drawn by its sampler at the epoch's first index request, from the global
torch generator or the one accelerate shares between processes. ``EpochRandomness`` records
those states then, so a resumed run replays them and gets the same permutation; accelerate's
``SkipBatchSampler`` skips the batches already trained on by index.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import warnings
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from accelerate.data_loader import DataLoaderShard, SkipBatchSampler, skip_first_batches
from torch import nn

from pytorch_accel._checkpointing.streams import stream_position
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.dataloaders import epoch_batches
from pytorch_accel.tracking import LossTracker

if TYPE_CHECKING:
    from pytorch_accel.callback import CallbackHandler
    from pytorch_accel.trainer import Trainer

__all__ = [
    "PER_PROCESS",
    "SHARED",
    "EpochEntry",
    "EpochRandomness",
    "Position",
    "RandomStates",
    "ResumableLoader",
    "ResumePoint",
    "StateKind",
    "callback_states",
    "enter_epoch",
    "gradients",
    "make_resumable",
    "restore_callback_states",
    "restore_gradients",
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
class Position:
    """Where in ``train()`` a state was saved, as the point a resumed run continues from.

    Attributes:
        epoch_index: The epoch of the ``train()`` call (0-based) the run continues in.
        batches_done: Micro-batches of that epoch already trained on (0: it has not begun).
        in_run: Saved during ``train()``, rather than before or after one.
    """

    epoch_index: int
    batches_done: int
    in_run: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the position as a plain dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Position:
        """Rebuild from ``to_dict``'s output."""
        return cls(int(state["epoch_index"]), int(state["batches_done"]), bool(state["in_run"]))


@dataclass
class ResumePoint:
    """A loaded training state, waiting to be applied where the saved run was."""

    directory: Path
    position: Position
    callbacks: dict[str, Any]
    rank_state: dict[str, Any]
    random_states: RandomStates

    @property
    def epoch_states(self) -> RandomStates | None:
        """The random states the saved epoch's order was drawn from (mid-epoch saves)."""
        saved = self.rank_state["loader"]["epoch_states"]
        return None if saved is None else RandomStates.from_dict(saved)

    def enter_run(self, handler: CallbackHandler) -> int:
        """Return the epoch the run continues in; restore the callbacks if saved between epochs.

        A state saved mid-epoch restores its callbacks in ``enter_epoch`` instead, after the
        epoch's start event (which may reset per-epoch state).
        """
        if self.position.batches_done == 0:
            self.restore_callbacks(handler)
        return self.position.epoch_index

    def restore_callbacks(self, callbacks: Iterable[TrainerCallback]) -> None:
        """Load the callbacks' shared states, then this process's own ones."""
        restore_callback_states(callbacks, self.callbacks, self.directory)
        per_process = self.rank_state.get("callbacks")
        if per_process is not None:  # states saved before per-process states existed lack it
            restore_callback_states(callbacks, per_process, self.directory, PER_PROCESS)


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


def enter_epoch(
    resume: ResumePoint | None,
    resumable: ResumableLoader | None,
    trainer: Trainer,
    loss_tracker: LossTracker,
) -> EpochEntry:
    """Apply a pending resume (``None``: none) at the start of an epoch; return how it starts."""
    if resume is None:
        return EpochEntry(resumable=resumable)
    loader: Any = trainer.train_dataloader if resumable is None else resumable.dataloader
    if hasattr(loader, "iteration"):  # accelerate's epoch count, for set_epoch
        loader.iteration = resume.rank_state["loader"]["iteration"]
    if resume.position.batches_done == 0:
        _prime_epoch_randomness(resume, resumable)
        return EpochEntry(resumable=resumable)
    resume.restore_callbacks(trainer.callback_handler)
    loss_tracker.load_state_dict(resume.rank_state["loss_tracker"], trainer.device)
    trainer.logged_metrics.load_state_dict(resume.rank_state.get("logged"), trainer.device)
    restore_gradients(trainer.model, resume.rank_state["gradients"])
    if resumable is None:  # a stream: from its saved position, or replayed from its start
        epoch_states = resume.epoch_states
        if epoch_states is not None:  # the draws of the pass's new iterator, as saved
            torch.set_rng_state(epoch_states.cpu)
        done, stream = resume.position.batches_done, stream_position(loader)
        saved = resume.rank_state["loader"].get("stream")
        if stream is not None and isinstance(saved, dict):
            stream.resume_at(done, saved["state"])
            return EpochEntry(done, resume.random_states.cpu)
        return EpochEntry(done, resume.random_states.cpu, replays=True)
    resumable.randomness.replay = resume.epoch_states
    resumable.skip.skip_batches = resume.position.batches_done
    return EpochEntry(resume.position.batches_done, resume.random_states.cpu, resumable)


def _prime_epoch_randomness(resume: ResumePoint, resumable: ResumableLoader | None) -> None:
    """Set the random states an epoch resumed at its start draws its order from.

    With persistent workers the saved run's next epoch reused its iterator; the resumed run's
    new one first draws the workers' base seed, so the order's draw is replayed.
    """
    if resumable is None:
        torch.set_rng_state(resume.random_states.cpu)
        return
    resumable.randomness.apply(resume.random_states)
    loader = resumable.dataloader
    if resume.position.in_run and loader.num_workers > 0 and loader.persistent_workers:
        resumable.randomness.replay = resume.random_states


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


def gradients(model: nn.Module) -> list[torch.Tensor | None] | None:
    """Return the model's gradients on the CPU (``None`` if no parameter has one)."""
    grads = [None if p.grad is None else p.grad.detach().cpu() for p in model.parameters()]
    return grads if any(grad is not None for grad in grads) else None


def restore_gradients(model: nn.Module, grads: list[torch.Tensor | None] | None) -> None:
    """Put saved gradients back on the model's parameters (on their devices)."""
    if grads is None:
        return
    for parameter, grad in zip(model.parameters(), grads, strict=True):
        parameter.grad = None if grad is None else grad.to(parameter.device, parameter.dtype)


class StateKind(NamedTuple):
    """The pair of methods a callback defines for one kind of state."""

    save: str
    load: str
    label: str


SHARED = StateKind("state_dict", "load_state_dict", "state")
"""A state shared by all processes (saved by the main process)."""

PER_PROCESS = StateKind("rank_state_dict", "load_rank_state_dict", "per-process state")
"""A state of each process (saved by every process)."""


def _callback_keys(callbacks: Iterable[TrainerCallback], kind: StateKind) -> dict[str, Any]:
    """Key each callback with ``kind``'s methods by class name (``Name#2`` for a second one)."""
    keys: dict[str, Any] = {}
    for callback in callbacks:
        if not all(callable(getattr(callback, name, None)) for name in (kind.save, kind.load)):
            continue
        name = type(callback).__name__
        key, count = name, 1
        while key in keys:
            count += 1
            key = f"{name}#{count}"
        keys[key] = callback
    return keys


def callback_states(
    callbacks: Iterable[TrainerCallback], kind: StateKind = SHARED
) -> dict[str, Any]:
    """Return the ``kind`` state of every callback that has one, by key."""
    keyed = _callback_keys(callbacks, kind)
    return {key: getattr(callback, kind.save)() for key, callback in keyed.items()}


def restore_callback_states(
    callbacks: Iterable[TrainerCallback],
    states: Mapping[str, Any],
    source: Path,
    kind: StateKind = SHARED,
) -> None:
    """Load each saved ``kind`` state into the callback with the same key; warn of the rest."""
    keyed = _callback_keys(callbacks, kind)
    for key, state in states.items():
        callback = keyed.pop(key, None)
        if callback is None:
            warnings.warn(
                f"The training state {str(source)!r} holds the {kind.label} of a {key} "
                "callback that this trainer does not have; it is ignored.",
                stacklevel=3,
            )
            continue
        getattr(callback, kind.load)(state)
    for key in keyed:
        warnings.warn(
            f"The training state {str(source)!r} has no {kind.label} for the {key} callback; "
            "it starts fresh.",
            stacklevel=3,
        )

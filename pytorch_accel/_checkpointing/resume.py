"""Where a resumed run picks up: the position saved, and what is restored at its seams.

A resumed run enters the loop at two seams: ``ResumePoint.enter_run`` at the run's start (which
epoch; the callbacks of a state saved between epochs) and ``enter_epoch`` (``_resumable``) at
that epoch's start, which calls ``enter_resumed_epoch`` here (the batches done, running loss,
gradients, random states); the batch loop knows nothing of it.

A callback's ``state_dict()``/``load_state_dict(state)`` is its **shared** state, saved by the
main process and loaded on every process; ``rank_state_dict()``/``load_rank_state_dict(state)``
its **per-process** state, saved by every process and loaded back on the same one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from pytorch_accel._checkpointing.streams import stream_position
from pytorch_accel._resumable import EpochEntry, RandomStates, ResumableLoader
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.tracking import LossTracker

if TYPE_CHECKING:
    from pytorch_accel.callback import CallbackHandler
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = [
    "PER_PROCESS",
    "SHARED",
    "Position",
    "ResumePoint",
    "StateKind",
    "callback_states",
    "enter_resumed_epoch",
    "gradients",
    "restore_callback_states",
    "restore_gradients",
]


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

    def enter_epoch(
        self, resumable: ResumableLoader | None, trainer: Trainer, loss_tracker: LossTracker
    ) -> EpochEntry:
        """Apply this state at the start of its epoch (``_resumable.enter_epoch``'s seam)."""
        return enter_resumed_epoch(self, resumable, trainer, loss_tracker)

    def restore_callbacks(self, callbacks: Iterable[TrainerCallback]) -> None:
        """Load the callbacks' shared states, then this process's own ones."""
        restore_callback_states(callbacks, self.callbacks, self.directory)
        per_process = self.rank_state.get("callbacks")
        if per_process is not None:  # states saved before per-process states existed lack it
            restore_callback_states(callbacks, per_process, self.directory, PER_PROCESS)


def enter_resumed_epoch(
    resume: ResumePoint,
    resumable: ResumableLoader | None,
    trainer: Trainer,
    loss_tracker: LossTracker,
) -> EpochEntry:
    """Apply a pending resume at the start of its epoch; return how the epoch starts."""
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

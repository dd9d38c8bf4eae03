"""A run that failed (or stopped) on one process alone, named on the others.

When one process fails alone (an error in its step), the others cannot learn it without a
collective: they learn it at their next one, which fails once the failed process has exited
(its connections close). ``announce_failure`` leaves the failed process's error in the process
group's store first, so that ``lost_peer_error`` can name it on every other process.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from pytorch_accel.distributed import group_size

__all__ = ["announce_failure", "lost_peer_error", "unagreed_stop_error"]

_FAILURE_KEY = "pytorch_accel/failed/"
"""The store key under which a failed process leaves its error (its rank appended)."""

_LOST_PEER_SIGNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
)
"""What gloo's errors say when a process at the other end of a collective has gone."""


def announce_failure(error: BaseException) -> None:
    """Leave this process's error in the process group's store, for ``lost_peer_error``.

    Called on the way out of a failed run (no collective); does nothing in one process, and
    never raises (a store that cannot be reached only costs the others the error's name).
    """
    if group_size() == 1:
        return
    with contextlib.suppress(Exception):
        store = dist.distributed_c10d._get_default_store()
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        store.set(f"{_FAILURE_KEY}{dist.get_rank()}", text[:1000])


def lost_peer_error(where: str, error: BaseException) -> RuntimeError | None:
    """The clear error for a collective that failed because another process ended, or ``None``.

    ``error`` is what this process's collective raised (gloo: "Connection reset by peer"); the
    error names the processes that failed and their errors where they announced them
    (``announce_failure``).

    Args:
        where: The entry point, e.g. ``"Trainer.train"``.
        error: The exception that ended this process's run.
    """
    size = group_size()
    text = str(error).lower()
    if size == 1 or not (
        isinstance(error, dist.DistError)
        or (isinstance(error, RuntimeError) and any(sign in text for sign in _LOST_PEER_SIGNS))
    ):
        return None
    rank, failures = dist.get_rank(), []
    with contextlib.suppress(Exception):
        store = dist.distributed_c10d._get_default_store()
        for other in range(size):
            key = f"{_FAILURE_KEY}{other}"
            if other != rank and store.check([key]):
                failures.append(f"process {other}: {store.get(key).decode(errors='replace')}")
    cause = (
        "; ".join(failures) + " (its traceback is in its own output)"
        if failures
        else "another process ended (its own output says why)"
    )
    return RuntimeError(
        f"{where}: process {rank} stopped because the run failed on another process: {cause}. "
        f"This process lost it during a collective ({type(error).__name__}), so it cannot go "
        "on; fix the other process's error and start the run again."
    )


def unagreed_stop_error(where: str, step: str, rank: int, error: BaseException) -> RuntimeError:
    """The error for a ``StopTrainingError`` raised inside a step on one of several processes.

    Such a stop (``calculate_train_batch_loss`` raising it) is this process's alone: the
    others go on with the step's collectives, so unwinding with the epoch's collectives would
    mismatch them (gloo aborts). This process fails instead, with no collective; the others
    fail at their next one (``lost_peer_error``).

    Args:
        where: The entry point, e.g. ``"Trainer.train"``.
        step: ``"train"`` or ``"eval"``.
        rank: This process's rank.
        error: The stop.
    """
    return RuntimeError(
        f"{where}: StopTrainingError({str(error)!r}) was raised inside a {step} step (e.g. by "
        f"calculate_{step}_batch_loss) on process {rank}, where the processes cannot stop "
        "together: the others go on with the step's collectives. Raise StopTrainingError "
        "from a callback instead (e.g. on_train_step_end): every process agrees on it "
        "there; or pass train(skip_failing_batches=...) to skip a bad batch on every "
        "process."
    )

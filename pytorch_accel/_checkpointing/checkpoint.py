"""The portable checkpoint file of ``Trainer.save_checkpoint``: one file, with its digest.

It holds ``model_state_dict``, ``optimizer_state_dict``, ``scheduler_state_dict`` and the
user's entries, with its digest in its ZIP comment (``files.atomic_save_digested``), so
pytorch-accelerated and ``torch.load`` read it as it is.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._checkpointing.files import atomic_save_digested, load_safely, read_checked
from pytorch_accel._checkpointing.fit import misfit
from pytorch_accel._checkpointing.sharded import (
    full_optimizer_state,
    is_sharded,
    load_full_states,
    sharded_model_tensors,
)

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = [
    "load_checkpoint_file",
    "model_state_dict",
    "read_tensors_file",
    "restore_checkpoint",
    "write_checkpoint",
]


_SHA256_KEY = "pytorch_accel_sha256"
"""The entry in which earlier development versions saved a SHA-256 checksum: refused."""


def load_checkpoint_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict safely (``weights_only=True``), with tensors on the CPU.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is truncated, corrupt or not a checkpoint dict.
    """
    source = Path(path)
    checkpoint = read_tensors_file(source, "load_checkpoint", "checkpoint")
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(
            f"load_checkpoint: {str(source)!r} is not a checkpoint written by save_checkpoint "
            "(no 'model_state_dict' key)."
        )
    return checkpoint


def read_tensors_file(path: str | os.PathLike[str], where: str, kind: str = "weights") -> Any:
    """Load a file of tensors and plain containers once, verified, with ``files.load_safely``.

    ``where`` and ``kind`` (``"checkpoint"``, ``"weights"``) are for messages.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is truncated, corrupt, holds other objects, or holds the
            SHA-256 checksum of an earlier development version, which is not verified.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{where}: no {kind} file at {str(source)!r}.")
    loaded = load_safely(read_checked(source, where)[0], source, where, ValueError)
    if isinstance(loaded, dict) and _SHA256_KEY in loaded:
        raise ValueError(
            f"{where}: {str(source)!r} has a record that this version does not verify: a "
            f"{_SHA256_KEY!r} entry (a SHA-256 checksum, written by an earlier development "
            "version). Nothing was loaded from it; save it again with this version "
            "(Trainer.save_checkpoint), or without that entry (torch.save)."
        )
    return loaded


def model_state_dict(accelerator: Accelerator, model: nn.Module) -> dict[str, Any]:
    """The unwrapped model's state dict, gathered by sharded engines (on every process)."""
    sharded = (DistributedType.FSDP, DistributedType.DEEPSPEED)
    if accelerator.distributed_type in sharded:
        return accelerator.get_state_dict(model)  # type: ignore[no-any-return]
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    return bare.state_dict()  # type: ignore[no-any-return]


def write_checkpoint(
    trainer: Trainer,
    path: str | os.PathLike[str],
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write a checkpoint file atomically (``Trainer.save_checkpoint``), from every process.

    It holds the states of the trainer's model, ``optimizer`` and ``scheduler`` (unless
    ``None``), the entries of ``extra`` and those the callbacks' ``on_save_checkpoint`` add
    (fired on every process); the main process writes it.

    Raises:
        TypeError: If an entry would not load back with ``weights_only=True``.
    """
    accelerator, model = trainer.accelerator, trainer.model
    _check_entries(path, extra or {}, "checkpoint_kwargs[{key!r}]")
    checkpoint = {"model_state_dict": model_state_dict(accelerator, model)}
    if optimizer is not None and is_sharded(accelerator):  # gathered, numbered as unsharded
        checkpoint["optimizer_state_dict"] = full_optimizer_state(model, optimizer)
    elif optimizer is not None:
        checkpoint["optimizer_state_dict"] = optimizer.state_dict()
    if scheduler is not None:
        checkpoint["scheduler_state_dict"] = scheduler.state_dict()
    checkpoint.update(extra or {})
    before = dict(checkpoint)
    trainer.callback_handler.call_event(
        "on_save_checkpoint", trainer, checkpoint=checkpoint, path=Path(path)
    )
    added = {key: value for key, value in checkpoint.items() if before.get(key) is not value}
    _check_entries(path, added, "the entry {key!r} a callback's on_save_checkpoint added")
    if accelerator.is_main_process:
        atomic_save_digested(checkpoint, path)
    accelerator.wait_for_everyone()


def _check_entries(path: str | os.PathLike[str], entries: Mapping[str, Any], what: str) -> None:
    """Raise if an entry of a checkpoint would not load back with ``weights_only=True``."""
    for key, value in entries.items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            load_safely(buffer.getvalue(), Path(str(path)), "save_checkpoint", error=ValueError)
        except Exception as error:
            raise TypeError(
                f"save_checkpoint: {what.format(key=key)} is a {type(value).__name__}, which "
                "load_checkpoint could not read back safely (weights_only=True). Keep entries to "
                "tensors, numbers, strings and lists, tuples and dicts of them (e.g. str(path) "
                f"for a Path). ({error})"
            ) from error


def restore_checkpoint(
    trainer: Trainer,
    path: str | os.PathLike[str],
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
) -> dict[str, Any]:
    """Load a checkpoint file into the trainer; return the whole dict (``load_checkpoint``).

    The optimizer and scheduler are loaded unless ``None``, once everything was checked: a
    file that does not fit changes nothing. A sharded model takes its shard of the full states.
    Then the callbacks' ``on_load_checkpoint`` sees the dict.

    Raises:
        ValueError: If the file's model, optimizer or scheduler state does not fit, naming the
            file and the mismatch.
    """
    accelerator, model = trainer.accelerator, trainer.model
    accelerator.wait_for_everyone()
    checkpoint = load_checkpoint_file(path)
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    sharded = is_sharded(accelerator)
    tensors = sharded_model_tensors(model) if sharded else None
    parts: list[tuple[str, Any, Any]] = [("model", bare, checkpoint["model_state_dict"])]
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is not None and f"{name}_state_dict" in checkpoint:
            parts.append((name, target, checkpoint[f"{name}_state_dict"]))
    for name, target, state in parts:
        problem = misfit(name, target, state, tensors)
        if problem:
            raise ValueError(
                f"load_checkpoint: {os.fspath(path)!r} does not fit this {name}: {problem}. "
                "Nothing was loaded."
            )
    if sharded:
        loaded = dict((name, state) for name, _, state in parts)
        load_full_states(model, loaded["model"], optimizer, loaded.get("optimizer"))
        parts = [part for part in parts if part[0] == "scheduler"]
    for _, target, state in parts:
        target.load_state_dict(state)
    trainer.callback_handler.call_event(
        "on_load_checkpoint", trainer, checkpoint=checkpoint, path=Path(path)
    )
    return checkpoint

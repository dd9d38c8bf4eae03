"""Crash-safe checkpoint files: written atomically, read without unpickling code.

``write_checkpoint`` and ``restore_checkpoint`` do the work of ``Trainer.save_checkpoint`` and
``Trainer.load_checkpoint``: a portable file of the model's, optimizer's and scheduler's states.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

__all__ = [
    "atomic_save",
    "fsync_directory",
    "load_checkpoint_file",
    "model_state_dict",
    "read_tensors_file",
    "restore_checkpoint",
    "write_checkpoint",
]


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save ``obj`` with ``torch.save`` so that ``path`` is either the old file or the new one.

    The object is written to a temporary file in the same directory, flushed to disk, then
    renamed over ``path``. A failure at any point leaves the previous file intact and removes
    the temporary one.

    Args:
        obj: What to save (tensors, dicts, numbers, strings).
        path: The destination file.

    Returns:
        The destination path.
    """
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.with_name(f".{destination.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(destination.parent)
    return destination


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (renames, new files) to disk, where the platform allows."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on this platform (e.g. Windows)
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def load_checkpoint_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict safely (``weights_only=True``: no arbitrary code is unpickled).

    Args:
        path: The checkpoint file.

    Returns:
        The checkpoint dict, with tensors on the CPU.

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
    """Load a file of tensors and plain containers, with ``weights_only=True`` (no code runs).

    Args:
        path: The file.
        where: The entry point, for messages (e.g. ``"load_checkpoint"``).
        kind: What the file is, for messages (``"checkpoint"``, ``"weights"``).

    Returns:
        The loaded object, with tensors on the CPU.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is truncated, corrupt or holds other objects.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{where}: no {kind} file at {str(source)!r}.")
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"{where}: could not read {str(source)!r}: it is truncated, corrupt, or holds "
            f"objects other than tensors and plain containers ({error})."
        ) from error


def model_state_dict(accelerator: Accelerator, model: nn.Module) -> dict[str, Any]:
    """The unwrapped model's state dict, without ``torch.compile``'s ``_orig_mod.`` prefix.

    Sharded engines (FSDP, DeepSpeed) gather it through the accelerator, on every process.

    Args:
        accelerator: The accelerator that prepared ``model``.
        model: The model, as prepared (wrapped or not).

    Returns:
        The state dict, with the keys of the bare model.
    """
    sharded = (DistributedType.FSDP, DistributedType.DEEPSPEED)
    if accelerator.distributed_type in sharded:
        return accelerator.get_state_dict(model)  # type: ignore[no-any-return]
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    return bare.state_dict()  # type: ignore[no-any-return]


def write_checkpoint(
    accelerator: Accelerator,
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the states of ``model``, ``optimizer`` and ``scheduler`` to ``path`` atomically.

    The file holds ``model_state_dict``, ``optimizer_state_dict`` and ``scheduler_state_dict``
    (for those given), then the entries of ``extra``. The main process writes it; every
    process must call this (sharded models are gathered by all of them).

    Args:
        accelerator: The accelerator that prepared ``model``.
        path: The file to write.
        model: The model, as prepared.
        optimizer: Its state is saved, unless ``None``.
        scheduler: Its state is saved, unless ``None``.
        extra: More entries (tensors, numbers, strings, containers).
    """
    checkpoint = {"model_state_dict": model_state_dict(accelerator, model)}
    if optimizer is not None:
        checkpoint["optimizer_state_dict"] = optimizer.state_dict()
    if scheduler is not None:
        checkpoint["scheduler_state_dict"] = scheduler.state_dict()
    checkpoint.update(extra or {})
    if accelerator.is_main_process:
        atomic_save(checkpoint, path)
    accelerator.wait_for_everyone()


def restore_checkpoint(
    accelerator: Accelerator,
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
) -> dict[str, Any]:
    """Load a file of ``write_checkpoint`` into the model, and the optimizer and scheduler given.

    Args:
        accelerator: The accelerator that prepared ``model``.
        path: The checkpoint file.
        model: The model, as prepared.
        optimizer: Receives ``optimizer_state_dict`` if the file has one; ``None``: skipped.
        scheduler: Receives ``scheduler_state_dict`` if the file has one; ``None``: skipped.

    Returns:
        The whole checkpoint dict.

    Raises:
        ValueError: If the file's model state does not fit ``model``.
    """
    accelerator.wait_for_everyone()
    checkpoint = load_checkpoint_file(path)
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    try:
        bare.load_state_dict(checkpoint["model_state_dict"])
    except RuntimeError as error:
        raise ValueError(
            f"load_checkpoint: {os.fspath(path)!r} does not fit this model: {error}"
        ) from error
    if optimizer is not None and "optimizer_state_dict" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    if scheduler is not None and "scheduler_state_dict" in checkpoint:
        scheduler.load_state_dict(checkpoint["scheduler_state_dict"])
    return checkpoint

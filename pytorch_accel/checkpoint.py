"""Crash-safe checkpoint files: written atomically, read without unpickling code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_save", "fsync_directory", "load_checkpoint_file", "read_tensors_file"]


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

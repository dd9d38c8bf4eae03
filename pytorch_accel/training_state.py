"""Training-state directories: written atomically, complete only with a manifest, verified on load.

A training state is a directory written by ``accelerator.save_state`` (model, optimizer,
gradient scaler, every rank's random states, and the trainer's own state, registered once with
``register_for_checkpointing``) plus one file per rank for what differs between ranks. It is
written under a hidden temporary name, every file is flushed to disk, then the manifest (file
sizes and SHA-256 digests) is written and the directory renamed into place. A directory without
a manifest is an interrupted save: it is never loaded, and ``latest_training_state`` skips it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelerate.utils import load as accelerate_safe_load

from pytorch_accel.checkpoint import fsync_directory

__all__ = [
    "MANIFEST_NAME",
    "TrainingStateError",
    "find_training_states",
    "latest_training_state",
    "load_pickled",
    "publish",
    "rank_state_name",
    "read_manifest",
    "temporary_directory",
    "verify_training_state",
    "write_manifest",
]

MANIFEST_NAME = "pytorch_accel_state.json"
"""The file that marks a training-state directory as complete."""

_FORMAT = "pytorch-accel-training-state"
_VERSION = 1
_CHUNK = 1 << 22
_PICKLED_SUFFIXES = (".bin", ".pkl", ".pt")


class TrainingStateError(ValueError):
    """A training-state directory is incomplete, corrupt, or does not fit this run."""


def rank_state_name(rank: int) -> str:
    """Return the name of the file holding process ``rank``'s own trainer state."""
    return f"trainer_rank_{rank}.pt"


def temporary_directory(final: Path) -> Path:
    """Return the hidden directory a save of ``final`` is written to before the rename."""
    return final.with_name(f".{final.name}.incomplete")


def write_manifest(directory: Path, info: Mapping[str, Any]) -> None:
    """Flush every file of ``directory`` to disk, then write the manifest that completes it.

    Args:
        directory: The (temporary) directory holding the saved files.
        info: What the manifest records besides the files (world size, counters).
    """
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        files[path.relative_to(directory).as_posix()] = _describe(path)
    manifest = {"format": _FORMAT, "version": _VERSION, **info, "files": files}
    target = directory / MANIFEST_NAME
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_directory(directory)


def publish(temporary: Path, final: Path) -> None:
    """Rename a completed ``temporary`` directory to ``final``, replacing an older one.

    The older directory is moved aside first and deleted only after the new one is in place.
    """
    previous = final.with_name(f".{final.name}.previous")
    shutil.rmtree(previous, ignore_errors=True)
    if final.exists():
        os.replace(final, previous)
    os.replace(temporary, final)
    fsync_directory(final.parent)
    shutil.rmtree(previous, ignore_errors=True)


def read_manifest(directory: Path, where: str) -> dict[str, Any]:
    """Return the manifest of a complete training state.

    Raises:
        FileNotFoundError: If ``directory`` does not exist.
        TrainingStateError: If it has no readable manifest (an interrupted save, or not a
            training state).
    """
    if not directory.is_dir():
        raise FileNotFoundError(f"{where}: no training state directory at {str(directory)!r}.")
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrainingStateError(
            f"{where}: {str(directory)!r} is not a complete training state: its manifest "
            f"{MANIFEST_NAME} is missing or unreadable ({error}). It is an interrupted save or "
            "was not written by Trainer.save_training_state; resume from an earlier one "
            '(resume_from="latest" picks the newest complete one).'
        ) from error
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise TrainingStateError(
            f"{where}: {str(path)!r} is not a pytorch-accel training-state manifest."
        )
    if manifest.get("version") != _VERSION:
        raise TrainingStateError(
            f"{where}: {str(path)!r} has format version {manifest.get('version')!r}; this "
            f"version of pytorch-accel reads version {_VERSION}."
        )
    return manifest


def verify_training_state(directory: Path, world_size: int, where: str) -> dict[str, Any]:
    """Check a training state before anything is loaded from it; return its manifest.

    Every file must have the size and SHA-256 digest the manifest records, and every pickled
    file must load with ``weights_only=True`` (tensors and plain containers only), so that
    accelerate's own loaders, some of which unpickle freely, only ever see vetted files.

    Raises:
        TrainingStateError: Naming the file and what is wrong with it, or the world size.
    """
    manifest = read_manifest(directory, where)
    saved_world = manifest.get("world_size")
    if saved_world != world_size:
        raise TrainingStateError(
            f"{where}: {str(directory)!r} was saved by {saved_world} processes, but this run "
            f"has {world_size}. Resume with the same number of processes (e.g. `accelerate "
            f"launch --num_processes {saved_world}`)."
        )
    for name, expected in manifest["files"].items():
        _verify_file(directory / name, expected, where)
    return manifest


def find_training_states(save_dir: Path) -> list[Path]:
    """Return the complete training states directly inside ``save_dir``, oldest first.

    Directories are ordered by the time their save completed (recorded in the manifest), then
    by name. Hidden directories (saves in progress) and directories without a valid manifest
    are skipped.
    """
    if not save_dir.is_dir():
        return []
    found = []
    for path in save_dir.iterdir():
        if not path.is_dir() or path.name.startswith("."):
            continue
        try:
            manifest = read_manifest(path, "find_training_states")
        except (OSError, TrainingStateError):
            continue
        found.append((int(manifest.get("saved_at_ns", 0)), _natural_key(path.name), path))
    return [path for *_, path in sorted(found)]


def latest_training_state(save_dir: str | os.PathLike[str]) -> Path | None:
    """Return the newest complete training state in ``save_dir``, or ``None`` if there is none.

    Args:
        save_dir: The directory ``SaveTrainingStateCallback`` writes to.
    """
    states = find_training_states(Path(save_dir))
    return states[-1] if states else None


def load_pickled(path: Path, where: str) -> Any:
    """Load a pickled state file safely (``weights_only=True``, NumPy arrays allowed).

    Raises:
        TrainingStateError: If it holds anything else, or cannot be read.
    """
    try:
        return accelerate_safe_load(path, map_location="cpu")
    except Exception as error:
        raise TrainingStateError(
            f"{where}: could not read {str(path)!r} safely: it is corrupt, or holds objects "
            f"other than tensors, NumPy arrays and plain containers ({error})."
        ) from error


def _verify_file(path: Path, expected: Mapping[str, Any], where: str) -> None:
    if not path.is_file():
        raise TrainingStateError(f"{where}: {str(path)!r} is listed in the manifest but missing.")
    actual = _describe(path)
    if actual["size"] != expected.get("size"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is truncated or was changed: {actual['size']} bytes, the "
            f"manifest records {expected.get('size')}."
        )
    if actual["sha256"] != expected.get("sha256"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is corrupt: its SHA-256 digest differs from the manifest's."
        )
    if path.suffix in _PICKLED_SUFFIXES:
        load_pickled(path, where)


def _describe(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        os.fsync(handle.fileno())
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def _natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))

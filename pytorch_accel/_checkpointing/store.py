"""Training-state directories: written atomically, complete only with a manifest, verified on load.

A training state is a directory: the model and optimizer (``sharded``), the trainer's shared
state, and every process's random states and own state. It is written under a
hidden temporary name, every file flushed to disk, then the manifest (file sizes and digests,
``files.Digest``) is written and the directory renamed into place. A directory without a
manifest is an interrupted save: never loaded, skipped by ``latest_training_state``.

Replacing a state takes two renames (the old one aside, the new one in); a process killed
between them leaves no directory under the state's name, and its new version (complete, under
the temporary name) or else its old one stands in for it (``complete_state``) until
``tidy_save_dir`` puts it back. A state is deleted by renaming it aside first.

Symbolic links are operated on, never followed: a state that is a link is deleted or replaced
by removing the link. A link to another state of the same directory is an alias, not a state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pytorch_accel._checkpointing.files import (
    TrainingStateError,
    atomic_write,
    describe,
    fsync_directory,
    load_safely,
    read_verified,
)
from pytorch_accel._checkpointing.sharded import fsdp_version
from pytorch_accel.tracking import get_logger

__all__ = [
    "MANIFEST_NAME",
    "TrainingStateError",
    "complete_state",
    "discard",
    "find_training_states",
    "hidden",
    "latest_training_state",
    "newest_resumable",
    "newest_training_state",
    "prepare_saving",
    "publish",
    "rank_state_name",
    "read_manifest",
    "refuse_fsdp1",
    "remove_training_state",
    "resumes_on",
    "tidy_save_dir",
    "verify_training_state",
    "write_manifest",
]

MANIFEST_NAME = "pytorch_accel_state.json"
"""The file that marks a training-state directory as complete."""

_FORMAT = "pytorch-accel-training-state"
_VERSION = 2
_PICKLED_SUFFIXES = (".bin", ".pkl", ".pt")
_LOADED_SUFFIXES = (*_PICKLED_SUFFIXES, ".safetensors")
_PER_RANK = (("random_states", ".pkl"), ("trainer_rank", ".pt"))


def refuse_fsdp1(accelerator: Any, where: str) -> None:
    """Refuse training states under FSDP version 1: resuming from one is not exact (FSDP2's is)."""
    if fsdp_version(accelerator) == 1:
        raise RuntimeError(
            f"{where}: training states are not supported under FSDP version 1 (a run resumed "
            "from one does not continue exactly). Use FSDP version 2: "
            "FullyShardedDataParallelPlugin(fsdp_version=2) (or FSDP_VERSION=2); "
            "save_checkpoint and load_checkpoint work under both."
        )


def prepare_saving() -> None:
    """Import torch's state-dict module now (seconds), not in the step of a run's first save."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401


def rank_state_name(rank: int) -> str:
    """Return the name of the file holding process ``rank``'s own trainer state."""
    return f"trainer_rank_{rank}.pt"


def hidden(final: Path, role: str = "incomplete") -> Path:
    """Return the hidden directory ``.NAME.<role>`` of the state ``final``.

    Roles: ``incomplete`` (a save being written), ``previous`` (an older state being replaced),
    ``deleting`` (a state being deleted).
    """
    return final.with_name(f".{final.name}.{role}")


def write_manifest(
    directory: Path, info: Mapping[str, Any], records: Mapping[str, Any] | None = None
) -> None:
    """Flush every file of ``directory`` to disk, then write the manifest that completes it.

    ``info``: what it records besides the files; ``records``: digests recorded while the files
    were written (``write_digested``); the other files (those the callbacks' events wrote too)
    are read back and digested here.

    Raises:
        TrainingStateError: If the directory holds a symbolic link (never followed).
    """
    files, records = {}, records or {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise TrainingStateError(
                f"Trainer.save_training_state: {str(path)!r} is a symbolic link, and a training "
                "state holds files only (nothing is read through a link). Write the file itself "
                "into the state (in on_save_training_state)."
            )
        if not path.is_file():
            continue
        name = path.relative_to(directory).as_posix()
        files[name] = records[name] if name in records else describe(path)[0]
    manifest = {"format": _FORMAT, "version": _VERSION, **info, "files": files}
    atomic_write(directory / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True))


def publish(temporary: Path, final: Path) -> None:
    """Rename a completed ``temporary`` directory to ``final``, moving an older one aside first."""
    previous = hidden(final, "previous")
    discard(previous)
    if _present(final):  # a link (even a broken one) is moved aside and removed, not followed
        os.replace(final, previous)
    os.replace(temporary, final)
    fsync_directory(final.parent)
    discard(previous)


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
            f"version of pytorch-accel reads version {_VERSION} (version 1 held the files of "
            "accelerate's save_state, which it no longer writes). Save the state again with "
            "this version, or resume it with the version that wrote it."
        )
    return manifest


def verify_training_state(directory: Path, world_size: int, where: str) -> dict[str, Any]:
    """Check a training state before anything is loaded from it; return its manifest.

    Every file must be listed, with the size and digest recorded, every file of a state of its
    world size present, and every pickled file must load with ``weights_only=True``. The files
    at the top level are deserialised here, from the verified bytes, into the manifest's
    ``"loaded"`` (by file name; ``.safetensors`` files too); those in folders (DCP's) are
    verified as they are read (``sharded.read_sharded``). A state saved mid-epoch resumes only
    on as many processes as saved it; one saved between epochs on any number.

    Raises:
        TrainingStateError: Naming the file and what is wrong with it, or the world size.
    """
    manifest = read_manifest(directory, where)
    saved_world = manifest.get("world_size")
    if not resumes_on(manifest, world_size):
        newest, _ = newest_resumable(directory.parent, world_size)
        instead = (
            f"the newest state beside it that does is {str(newest)!r}"
            if newest is not None
            else f"there is none beside it in {str(directory.parent)!r}"
        )
        raise TrainingStateError(
            f"{where}: {str(directory)!r} was saved by {saved_world} processes in the middle "
            f"of an epoch, but this run has {world_size}: only a state saved between epochs "
            f"resumes on another number of processes, and {instead}. Resume with "
            f"{saved_world} processes (e.g. `accelerate launch --num_processes {saved_world}`), "
            "or from a state saved between epochs."
        )
    world_size = saved_world if isinstance(saved_world, int) else world_size
    listed = manifest["files"]
    if not isinstance(listed, dict):
        raise TrainingStateError(f"{where}: the manifest of {str(directory)!r} lists no files.")
    for name in listed:
        _refuse_outside(directory, name, where)
    for path in sorted(p for p in directory.rglob("*") if p.is_file() or p.is_symlink()):
        name = path.relative_to(directory).as_posix()
        if name != MANIFEST_NAME and name not in listed:
            raise TrainingStateError(
                f"{where}: {str(path)!r} is not listed in the manifest of {str(directory)!r}: "
                "it was added after the save, and nothing is loaded from a state holding a file "
                "that was not checked. Remove the file, or resume from another state."
            )
    required = [
        f"{stem}_{rank}{suffix}" for rank in range(world_size) for stem, suffix in _PER_RANK
    ]
    missing = [name for name in required if name not in listed]
    if missing:
        raise TrainingStateError(
            f"{where}: {str(directory)!r} is incomplete: every training state of {world_size} "
            f"process(es) has {missing[0]!r}, and this one does not (not in its manifest "
            "either). Resume from another state."
        )
    loaded = {}
    for name, expected in listed.items():
        path = directory / name
        if "/" in name:
            continue
        data = read_verified(path, expected, where, keep=path.suffix in _LOADED_SUFFIXES)
        if path.suffix in _PICKLED_SUFFIXES:
            loaded[name] = load_safely(data, path, where)
        elif path.suffix == ".safetensors":
            loaded[name] = _safetensors(data, path, where)
    return {**manifest, "loaded": loaded}


def _safetensors(data: bytes, path: Path, where: str) -> dict[str, Any]:
    from safetensors.torch import load

    try:  # in one order on every process (safetensors' own differs between processes)
        return dict(sorted(load(data).items()))
    except Exception as error:
        raise TrainingStateError(f"{where}: could not read {str(path)!r}: {error}") from error


def _refuse_outside(directory: Path, name: str, where: str) -> None:
    """Refuse a manifest entry that is not a plain file inside ``directory``, before reading.

    An absolute name, a ``..`` part or a symbolic link on the way would read outside the state.
    """
    parts = PurePosixPath(name).parts
    outside = not parts or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name
    path = directory
    for part in () if outside else parts:
        path = path / part
        outside = outside or path.is_symlink()
    if outside:
        raise TrainingStateError(
            f"{where}: the manifest of {str(directory)!r} lists {name!r}, which is not a file "
            "inside the state (an absolute path, a '..' part or a symbolic link): nothing is "
            "read outside a training state. Resume from another state."
        )


def complete_state(final: Path) -> Path:
    """Return ``final``, or the hidden state standing in for it after an interrupted replace.

    That is the new state (complete, under its temporary name), or else the old one (moved
    aside); ``final`` if there is none. Nothing is moved or deleted here.
    """
    if final.exists():
        return final
    for candidate in (hidden(final), hidden(final, "previous")):
        if _has_manifest(candidate):
            return candidate
    return final


def find_training_states(save_dir: Path) -> list[Path]:
    """Return the complete training states directly inside ``save_dir``, oldest first.

    Ordered by the time their save completed (recorded in the manifest), then by name.
    Directories without a valid manifest (interrupted saves) are skipped; a state whose
    replacement was interrupted is found under its hidden stand-in (``.NAME.incomplete`` or
    ``.NAME.previous``).
    """
    return [path for *_, path, _ in sorted(_timed_states(save_dir))]


def newest_training_state(save_dirs: Iterable[Path]) -> Path | None:
    """Return the newest complete training state in any of ``save_dirs`` (``None``: none).

    A symbolic link is never picked: it may point at another run's state.
    """
    found = [state for save_dir in save_dirs for state in _timed_states(save_dir, links=False)]
    return max(found)[2] if found else None


def resumes_on(manifest: Mapping[str, Any], world_size: int) -> bool:
    """Whether the state of ``manifest`` resumes on ``world_size`` processes.

    On as many processes as saved it always; on another number only between epochs.
    """
    saved_world = manifest.get("world_size")
    between_epochs = (manifest.get("position") or {}).get("batches_done", 1) == 0
    return saved_world == world_size or (between_epochs and isinstance(saved_world, int))


def newest_resumable(save_dir: Path, world_size: int) -> tuple[Path | None, list[Path]]:
    """The newest state in ``save_dir`` that resumes on ``world_size`` processes (not a link).

    Returns it (``None``: none) and the newer states passed over, newest first.
    """
    passed: list[Path] = []
    for *_, path, manifest in sorted(_timed_states(save_dir, links=False), reverse=True):
        if resumes_on(manifest, world_size):
            return path, passed
        passed.append(path)
    return None, passed


def _timed_states(
    save_dir: Path, links: bool = True
) -> list[tuple[int, tuple[Any, ...], Path, dict[str, Any]]]:
    if not save_dir.is_dir():
        return []
    entries = [path for path in save_dir.iterdir() if links or not path.is_symlink()]
    names = {path.name for path in entries if path.is_dir() and not _alias(path)}
    names |= {name for path in entries if (name := _stood_in_for(path.name))}
    found = []
    for name in names:
        if name.startswith("."):
            continue
        path = complete_state(save_dir / name)
        if not links and path.is_symlink():
            continue
        try:
            manifest = read_manifest(path, "find_training_states")
        except (OSError, TrainingStateError):
            continue
        found.append((int(manifest.get("saved_at_ns", 0)), _natural_key(name), path, manifest))
    return found


def remove_training_state(path: Path) -> None:
    """Delete a training state (a link as a link), renamed aside first: a kill leaves no part."""
    if not _present(path):
        return
    if path.is_symlink():
        get_logger().info(
            f"Removed the training state {str(path)!r}, a symbolic link: the directory it "
            f"points to, {os.readlink(path)!r}, is left in place."
        )
    doomed = hidden(path, "deleting")
    discard(doomed)
    os.replace(path, doomed)
    discard(doomed)


def discard(path: Path) -> None:
    """Delete what is at ``path`` (a link as a link, a directory with its contents), if any."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def tidy_save_dir(save_dir: Path, is_state_name: Callable[[str], bool]) -> None:
    """Repair and clean what killed saves and deletions left in ``save_dir`` (from one process).

    A state whose replacement was interrupted is put back under its name (``complete_state``).
    Then hidden ``.incomplete``, ``.previous`` and ``.deleting`` entries are deleted, and the
    directories named like states (``is_state_name``) without a manifest; a link under a
    state's name is the user's, and is left alone.
    """
    if not save_dir.is_dir():
        return
    for path in list(save_dir.iterdir()):
        name = _stood_in_for(path.name)
        if name and not (save_dir / name).exists():
            stand_in = complete_state(save_dir / name)
            if stand_in != save_dir / name:
                discard(save_dir / name)  # a broken link under the state's name
                os.replace(stand_in, save_dir / name)
    for path in list(save_dir.iterdir()):
        debris = _stood_in_for(path.name) or path.name.endswith(".deleting")
        interrupted = is_state_name(path.name) and not _has_manifest(path)
        link = path.is_symlink()
        if (debris and (link or path.is_dir())) or (interrupted and path.is_dir() and not link):
            discard(path)


def _stood_in_for(hidden: str) -> str | None:
    """The state name a hidden ``.NAME.incomplete`` or ``.NAME.previous`` belongs to."""
    match = re.fullmatch(r"\.(.+)\.(incomplete|previous)", hidden)
    return match.group(1) if match else None


def _present(path: Path) -> bool:
    """Whether there is anything at ``path``, a broken symbolic link included."""
    return path.is_symlink() or path.exists()


def _alias(path: Path) -> bool:
    """Whether ``path`` is a symbolic link to another entry of its own directory."""
    return path.is_symlink() and path.resolve().parent == path.parent.resolve()


def _has_manifest(directory: Path) -> bool:
    try:
        read_manifest(directory, "")
    except (OSError, TrainingStateError):
        return False
    return True


def latest_training_state(save_dir: str | os.PathLike[str]) -> Path | None:
    """Return the newest complete training state in ``save_dir``, or ``None`` if there is none."""
    return newest_training_state([Path(save_dir)])


def _natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))

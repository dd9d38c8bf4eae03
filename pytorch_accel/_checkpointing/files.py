"""The one writer of every file the package writes, and the one loader of what it reads back.

``atomic_write``: a temporary file beside the destination, flushed to disk and renamed over it,
so a reader sees the old file or the new one. ``read_verified`` and ``load_safely``: the bytes
are read once, checked against their recorded SHA-256 digest, and those same bytes are
deserialised with ``weights_only=True`` (tensors, NumPy arrays and plain containers; no code).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import torch
from accelerate.utils import load as accelerate_safe_load

__all__ = [
    "TrainingStateError",
    "atomic_save",
    "atomic_write",
    "describe",
    "disk_full_error",
    "fsync_directory",
    "load_pickled",
    "load_safely",
    "read_verified",
    "write_error",
]

_CHUNK = 1 << 22


class TrainingStateError(ValueError):
    """A training-state directory is incomplete, corrupt, or does not fit this run."""


def atomic_write(
    path: str | os.PathLike[str], content: bytes | str | Callable[[IO[bytes]], Any]
) -> Path:
    """Write ``content`` to ``path`` so that ``path`` is either the old file or the new one.

    The content goes to a temporary file in the same directory, flushed to disk, then renamed
    over ``path``, and the directory is flushed. A failure leaves the previous file intact and
    removes the temporary one; temporary files that killed processes left beside ``path`` are
    removed first.

    Args:
        path: The destination file; its directory is created if needed.
        content: Bytes, text (written as UTF-8), or a function that writes to a binary file.

    Returns:
        The destination path.

    Raises:
        OSError: With ``errno.ENOSPC`` when the disk is full, naming the file.
    """
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{destination.name}.tmp-"
    for stale in destination.parent.glob(f"{glob.escape(prefix)}*"):
        pid = stale.name[len(prefix) :]
        if pid.isdigit() and not _process_alive(int(pid)):
            stale.unlink(missing_ok=True)
    temporary = destination.with_name(f"{prefix}{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            if isinstance(content, (bytes, str)):
                handle.write(content.encode() if isinstance(content, str) else content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, destination)
    except (OSError, RuntimeError) as error:
        full = disk_full_error(error, destination)
        if full is None:
            raise
        raise full from error
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(destination.parent)
    return destination


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save ``obj`` with ``torch.save`` through ``atomic_write``; return the destination path."""
    return atomic_write(path, lambda handle: torch.save(obj, handle))


def disk_full_error(error: BaseException, path: Path, kind: str = "file") -> OSError | None:
    """An ``ENOSPC`` error naming ``path`` if ``error`` arose from a full disk, else ``None``.

    torch and safetensors wrap the ``OSError`` of a full disk, say so only in their message, or
    not at all (torch's ``iostream error``): then the disk's free space tells.
    """
    seen: BaseException | None = error
    while seen is not None:
        full = isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)
        full = full or "No space left on device" in str(seen) or "os error 28" in str(seen)
        if full or (seen is error and _free_space(path.parent) < _CHUNK):
            return OSError(
                errno.ENOSPC,
                f"could not write {str(path)!r}: the disk is full. The previous {kind}, if any, "
                "is intact; free some space and save again",
            )
        seen = seen.__cause__ or seen.__context__
    return None


def write_error(error: OSError, path: Path, where: str, elsewhere: str) -> OSError:
    """``error``, raised while writing ``path``, as an ``OSError`` naming the file and the fix.

    For the files written as a run goes (metrics, logs, tracker runs), whose raw errors
    (``[Errno 28] No space left on device``) name no file.

    Args:
        error: What writing, opening, flushing or closing ``path`` raised.
        path: The file (or directory) being written.
        where: Who writes it, e.g. ``"RunRecordCallback"``.
        elsewhere: How to write it somewhere else, e.g. ``"pass another csv_path"``.

    Returns:
        An ``OSError`` with ``error``'s errno (``ENOSPC`` for a full disk), to raise from it.
    """
    if disk_full_error(error, path) is not None:
        code, reason, fix = errno.ENOSPC, "the disk is full", "free some space"
    else:
        code, reason = error.errno or errno.EIO, error.strerror or str(error)
        fix = "check that its directory exists and is writable"
    return OSError(code, f"{where}: could not write {str(path)!r}: {reason}; {fix}, or {elsewhere}")


def _free_space(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return _CHUNK


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


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


def describe(path: Path, keep: bool = False) -> tuple[dict[str, Any], bytes]:
    """Read a file once: its ``{"size": ..., "sha256": ...}``, and its bytes if ``keep``.

    The file is flushed to disk too (a state's files, before its manifest is written).
    """
    digest, size, chunks = hashlib.sha256(), 0, []
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            chunks += [chunk] * keep
        os.fsync(handle.fileno())
    return {"size": size, "sha256": digest.hexdigest()}, b"".join(chunks)


def read_verified(path: Path, expected: Mapping[str, Any], where: str, keep: bool = True) -> bytes:
    """Read a file once and return its bytes (if ``keep``), if they are as recorded.

    Raises:
        TrainingStateError: If the file is missing, or its size or SHA-256 digest differ from
            ``expected`` (``{"size": ..., "sha256": ...}``).
    """
    try:
        actual, data = describe(path, keep)
    except FileNotFoundError:
        raise TrainingStateError(
            f"{where}: {str(path)!r} is listed in the manifest but missing."
        ) from None
    if actual["size"] != expected.get("size"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is truncated or was changed: {actual['size']} bytes, the "
            f"manifest records {expected.get('size')}."
        )
    if actual["sha256"] != expected.get("sha256"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is corrupt: its SHA-256 digest differs from the manifest's."
        )
    return data


def load_safely(
    data: bytes, path: Path, where: str, error: type[ValueError] = TrainingStateError
) -> Any:
    """Deserialise bytes read from ``path`` with ``weights_only=True`` (NumPy arrays allowed).

    Raises:
        TrainingStateError: If they hold anything else, or cannot be read (or ``error``, with
            the message of a checkpoint file).
    """
    try:
        return accelerate_safe_load(io.BytesIO(data), map_location="cpu")
    except Exception as cause:
        if error is TrainingStateError:
            problem = "safely: it is corrupt, or holds objects other than tensors, NumPy arrays"
        else:
            problem = ": it is truncated, corrupt, or holds objects other than tensors"
        text = f"could not read {str(path)!r}{' ' * problem.startswith('s')}{problem}"
        raise error(f"{where}: {text} and plain containers ({cause}).") from cause


def load_pickled(path: Path, where: str) -> Any:
    """Read a file once and deserialise it with ``load_safely``."""
    return load_safely(path.read_bytes(), path, where)

"""Every file the package writes, and every pickled file it reads back.

``atomic_write`` is the one writer: a temporary file beside the destination, hashed as it is
written, flushed to disk and renamed over the destination, so a reader sees the old file or
the new one. ``read_verified`` and ``load_safely`` are the one loader: the bytes are read once,
checked against their SHA-256 digest, and those same bytes are deserialised with
``weights_only=True`` (tensors, NumPy arrays and plain containers; no code runs).
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
    "check_loadable",
    "disk_full_error",
    "fsync_directory",
    "load_pickled",
    "load_safely",
    "read_verified",
    "sha256_of",
]

_CHUNK = 1 << 22

Content = bytes | str | Callable[[IO[bytes]], Any]
"""What ``atomic_write`` writes: bytes, text (UTF-8), or a function writing to a binary file."""


class TrainingStateError(ValueError):
    """A training-state directory is incomplete, corrupt, or does not fit this run."""


class _HashingFile(io.RawIOBase):
    """A binary file that hashes what is written through it."""

    def __init__(self, handle: IO[bytes]) -> None:
        super().__init__()
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def atomic_write(path: str | os.PathLike[str], content: Content) -> dict[str, Any]:
    """Write ``content`` to ``path`` so that ``path`` is either the old file or the new one.

    The content goes to a temporary file in the same directory (hashed as it is written),
    flushed to disk, then renamed over ``path``, and the directory is flushed. A failure at any
    point leaves the previous file intact and removes the temporary one; temporary files that
    killed processes left beside ``path`` are removed first.

    Args:
        path: The destination file; its directory is created if needed.
        content: Bytes, text (written as UTF-8), or a function that writes to a binary file.

    Returns:
        ``{"size": ..., "sha256": ...}`` of the bytes written.

    Raises:
        OSError: With ``errno.ENOSPC`` when the disk is full, naming the file.
    """
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(destination)
    temporary = destination.with_name(f"{_temporary_prefix(destination)}{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            hashing = _HashingFile(handle)
            if isinstance(content, str):
                hashing.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                hashing.write(content)
            else:
                content(hashing)  # type: ignore[arg-type]
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
    return {"size": hashing.size, "sha256": hashing.digest.hexdigest()}


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save ``obj`` with ``torch.save`` through ``atomic_write``; return the destination path."""
    atomic_write(path, lambda handle: torch.save(obj, handle))
    return Path(path)


def disk_full_error(error: BaseException, path: Path, kind: str = "file") -> OSError | None:
    """An ``ENOSPC`` error naming ``path`` if ``error`` arose from a full disk, else ``None``.

    torch and safetensors wrap the ``OSError`` of a full disk, say so only in their message, or
    not at all (torch's ``iostream error``): then the disk's free space tells.
    """
    seen: BaseException | None = error
    while seen is not None:
        full = isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)
        full = full or "No space left on device" in str(seen) or "os error 28" in str(seen)
        if full or (seen is error and _almost_no_space(path.parent)):
            return OSError(
                errno.ENOSPC,
                f"could not write {str(path)!r}: the disk is full. The previous {kind}, if any, "
                "is intact; free some space and save again",
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _almost_no_space(directory: Path) -> bool:
    try:
        return shutil.disk_usage(directory).free < _CHUNK
    except OSError:
        return False


def _temporary_prefix(destination: Path) -> str:
    return f".{destination.name}.tmp-"


def _remove_stale_temporaries(destination: Path) -> None:
    """Delete temporary files of ``destination`` whose writing process is no longer alive."""
    prefix = _temporary_prefix(destination)
    for path in destination.parent.glob(f"{glob.escape(prefix)}*"):
        pid = path.name[len(prefix) :]
        if pid.isdigit() and not _process_alive(int(pid)):
            path.unlink(missing_ok=True)


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


def sha256_of(path: Path) -> dict[str, Any]:
    """Return ``{"size": ..., "sha256": ...}`` of a file, read in chunks (and flush it to disk)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        os.fsync(handle.fileno())
    return {"size": size, "sha256": digest.hexdigest()}


def read_verified(path: Path, expected: Mapping[str, Any], where: str, keep: bool = True) -> bytes:
    """Read a file once and return its bytes, if they have the recorded size and digest.

    Args:
        path: The file.
        expected: Its ``{"size": ..., "sha256": ...}`` as recorded.
        where: The entry point, for messages.
        keep: Return the bytes (else only check them, holding one chunk at a time).

    Raises:
        TrainingStateError: If the file is missing, or its size or digest differ.
    """
    digest, size, chunks = hashlib.sha256(), 0, []
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                chunks += [chunk] * keep
    except FileNotFoundError:
        raise TrainingStateError(
            f"{where}: {str(path)!r} is listed in the manifest but missing."
        ) from None
    if size != expected.get("size"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is truncated or was changed: {size} bytes, the "
            f"manifest records {expected.get('size')}."
        )
    if digest.hexdigest() != expected.get("sha256"):
        raise TrainingStateError(
            f"{where}: {str(path)!r} is corrupt: its SHA-256 digest differs from the manifest's."
        )
    return b"".join(chunks)


def load_safely(data: bytes, path: Path, where: str) -> Any:
    """Deserialise bytes read from ``path`` with ``weights_only=True`` (NumPy arrays allowed).

    Raises:
        TrainingStateError: If they hold anything else, or cannot be read.
    """
    try:
        return accelerate_safe_load(io.BytesIO(data), map_location="cpu")
    except Exception as error:
        raise TrainingStateError(
            f"{where}: could not read {str(path)!r} safely: it is corrupt, or holds objects "
            f"other than tensors, NumPy arrays and plain containers ({error})."
        ) from error


def load_pickled(path: Path, where: str) -> Any:
    """Read a file once and deserialise it with ``load_safely``."""
    return load_safely(path.read_bytes(), path, where)


def check_loadable(entries: Mapping[str, Any], where: str) -> None:
    """Raise if an entry would not load back with ``weights_only=True`` (checked on save).

    Args:
        entries: The user's extra checkpoint entries (``checkpoint_kwargs``).
        where: The entry point, for the message.

    Raises:
        TypeError: Naming the entry and its type.
    """
    for key, value in entries.items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
        except Exception as error:
            raise TypeError(
                f"{where}: checkpoint_kwargs[{key!r}] is a {type(value).__name__}, which "
                "load_checkpoint could not read back safely (weights_only=True). Keep entries to "
                "tensors, numbers, strings and lists, tuples and dicts of them (e.g. str(path) "
                f"for a Path). ({error})"
            ) from error

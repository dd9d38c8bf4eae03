"""The one writer of every file the package writes, and the one loader of what it reads back.

``atomic_write``: a temporary file beside the destination, flushed and renamed over it. One
integrity scheme for every file saved: its size and CRC-32 (``Digest``), computed while it is
written, recorded in a training state's manifest (``write_digested``) or in a checkpoint
file's ZIP comment (``atomic_save_digested``), which ``torch.load`` ignores. What is read back
is read once, checked against its record, and those same bytes are deserialised with
``weights_only=True`` (``read_verified``, ``read_checked``, ``load_safely``).
"""

from __future__ import annotations

import errno
import glob
import io
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch
from accelerate.utils import load as accelerate_safe_load

__all__ = [
    "DIGEST",
    "Digest",
    "TrainingStateError",
    "atomic_save_digested",
    "atomic_write",
    "describe",
    "disk_full_error",
    "fsync_directory",
    "load_pickled",
    "load_safely",
    "read_checked",
    "read_verified",
    "write_digested",
    "write_error",
]

_CHUNK = 1 << 22

DIGEST = "crc32"
"""The digest every file is recorded with: CRC-32 (zlib), as ZIP and gzip guard their data."""


class TrainingStateError(ValueError):
    """A training-state directory is incomplete, corrupt, or does not fit this run."""


class Digest:
    """The size and CRC-32 of bytes fed in pieces: the one integrity scheme of saved files.

    CRC-32 (``DIGEST``) detects accidental corruption at several GB/s (not someone who can
    write the files).
    """

    def __init__(self) -> None:
        self.size, self._crc = 0, 0

    def update(self, data: Any) -> None:
        """Feed bytes (or any buffer)."""
        view = memoryview(data)
        self.size += view.nbytes
        self._crc = zlib.crc32(view, self._crc)

    def record(self) -> dict[str, Any]:
        """``{"size": ..., "crc32": <hex digest>}``, as manifests record a file."""
        return {"size": self.size, DIGEST: f"{self._crc:08x}"}


def _unknown_record(expected: Any, path: Path, where: str, kept: str, fix: str) -> str | None:
    """The message for a record that is not a ``Digest`` record, or ``None`` if it is one.

    Earlier development versions recorded SHA-256 digests, which are not verified any more;
    ``kept``: where the record was (``"the manifest"``, ``"its ZIP comment"``); ``fix``: what
    to do about it.
    """
    if isinstance(expected, Mapping) and DIGEST in expected:
        return None
    found = sorted(map(str, expected)) if isinstance(expected, Mapping) else expected
    return (
        f"{where}: {str(path)!r} has a record in {kept} that this version does not verify: "
        f"{found!r}, where it expects 'size' and {DIGEST!r} (written by an earlier development "
        f"version, e.g. with 'sha256'). Nothing was loaded from it; {fix}."
    )


class _DigestingFile:
    """A binary file that digests what is written to it, in a worker thread, in order.

    Large pieces (tensor data, which outlives the write) are digested as they are; small ones
    (maybe a writer's reused buffer) are copied first. ``close`` waits for the digest.
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.digest = handle, Digest()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="pytorch_accel-digest")
        self._last: Future[None] | None = None

    def write(self, data: Any) -> int:
        piece = memoryview(data) if memoryview(data).nbytes >= _CHUNK else bytes(data)
        self._last = self._worker.submit(self.digest.update, piece)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        if self._last is not None:
            self._last.result()  # raises what digesting raised


def write_digested(path: Path, content: bytes | Callable[[IO[bytes]], Any]) -> dict[str, Any]:
    """Write a new file, flush it and return its ``Digest`` record, in one pass (not renamed).

    For a training state's files (its directory is renamed into place). ``content`` is bytes or
    a function that writes to a binary file.

    Raises:
        OSError: With ``errno.ENOSPC`` when the disk is full, naming the file.
    """
    try:
        with open(path, "wb") as handle:
            digesting = _DigestingFile(handle)
            try:
                if isinstance(content, bytes):
                    digesting.write(content)
                else:
                    content(digesting)  # type: ignore[arg-type]
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                digesting.close()
    except (OSError, RuntimeError) as error:
        full = disk_full_error(error, path)
        if full is None:
            raise
        raise full from error
    return digesting.digest.record()


def atomic_write(
    path: str | os.PathLike[str], content: bytes | str | Callable[[IO[bytes]], Any]
) -> Path:
    """Write ``content`` to ``path`` so that ``path`` is either the old file or the new one.

    ``content``: bytes, text (UTF-8) or a function that writes to a binary file. The directory
    is created if needed; temporary files that killed processes left are removed first.

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


_TRAILER = b"pytorch-accel-digest "
"""Starts the ZIP comment holding a checkpoint file's ``Digest`` record."""


def atomic_save_digested(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` through ``atomic_write``, with the file's ``Digest`` record in it.

    The record is the ZIP archive's comment, after the bytes it covers; the comment's length is
    written over the final two bytes, which the digest counts as zeros (``read_checked``).
    """

    def write(handle: IO[bytes]) -> None:
        digesting = _DigestingFile(handle)
        try:
            torch.save(obj, digesting)  # type: ignore[arg-type]
        finally:
            digesting.close()
        trailer = _TRAILER + json.dumps(digesting.digest.record(), sort_keys=True).encode()
        handle.seek(-2, os.SEEK_END)
        handle.write(struct.pack("<H", len(trailer)) + trailer)

    return atomic_write(path, write)


def read_checked(path: Path, where: str) -> tuple[bytes, bool]:
    """Read a file once; check it against the record in its ZIP comment, if it has one.

    Returns the file's bytes, and whether they carried a record (not ``torch.save``'s files).

    Raises:
        ValueError: If the bytes differ from their record, naming the file.
    """
    data = path.read_bytes()
    start = data.rfind(_TRAILER, max(0, len(data) - 1024))
    if start < 24 or struct.unpack("<H", data[start - 2 : start])[0] != len(data) - start:
        return data, False
    try:
        expected = json.loads(data[start + len(_TRAILER) :])
    except ValueError:
        expected = None
    if not isinstance(expected, dict):
        expected = {DIGEST: None}  # an unreadable record: a corrupt file
    unknown = _unknown_record(
        expected, path, where, "its ZIP comment", "save it again with this version"
    )
    if unknown is not None:
        raise ValueError(unknown)
    digest, view = Digest(), memoryview(data)
    digest.update(view[: start - 2])
    digest.update(b"\x00\x00")
    if digest.record() != expected:
        raise ValueError(
            f"{where}: {str(path)!r} is corrupt: its contents differ from the digest saved "
            "with it (a changed bit in its tensors or entries, or a truncated file). Load an "
            "earlier copy; this one was not used."
        )
    return data, True


def disk_full_error(error: BaseException, path: Path, kind: str = "file") -> OSError | None:
    """An ``ENOSPC`` error naming ``path`` if ``error`` arose from a full disk, else ``None``.

    torch and safetensors wrap a full disk's ``OSError`` or only say so in their message, if at
    all: then the disk's free space tells.
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

    ``where``: who writes it (``"RunRecordCallback"``); ``elsewhere``: how to write it
    elsewhere (``"pass another csv_path"``). The errno is ``error``'s (``ENOSPC``: disk full).
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
    """Read (and flush) a file once: its ``Digest`` record, and its bytes if ``keep``."""
    digest, chunks = Digest(), []
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            chunks += [chunk] * keep
        os.fsync(handle.fileno())
    return digest.record(), b"".join(chunks)


def read_verified(path: Path, expected: Mapping[str, Any], where: str, keep: bool = True) -> bytes:
    """Read a file once and return its bytes (if ``keep``), if they are as recorded.

    Raises:
        TrainingStateError: If the file is missing, or its size or CRC-32 differ from
            ``expected`` (a ``Digest`` record), or ``expected`` is not one (an earlier
            version's SHA-256).
    """
    unknown = _unknown_record(
        expected,
        path,
        where,
        "the manifest",
        "save the state again with this version, or resume from another state",
    )
    if unknown is not None:
        raise TrainingStateError(unknown)
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
    if actual[DIGEST] != expected[DIGEST]:
        raise TrainingStateError(
            f"{where}: {str(path)!r} is corrupt: its {DIGEST} digest differs from the manifest's."
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
            problem = " safely: it is corrupt, or holds objects other than tensors, NumPy arrays"
        else:
            problem = ": it is truncated, corrupt, or holds objects other than tensors"
        text = f"could not read {str(path)!r}{problem} and plain containers ({cause})."
        raise error(f"{where}: {text}") from cause


def load_pickled(path: Path, where: str) -> Any:
    """Read a file once and deserialise it with ``load_safely``."""
    return load_safely(path.read_bytes(), path, where)

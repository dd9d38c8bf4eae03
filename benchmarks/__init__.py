"""Benchmarks of the trainer against hand-written loops: ``python -m benchmarks.run``."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

__all__ = ["remove_scratch_directories", "scratch_directory"]

_SCRATCH: list[Path] = []


def scratch_directory(prefix: str, parent: str | None = None) -> Path:
    """Return a new temporary directory, removed with its contents when this process exits."""
    if not _SCRATCH:
        atexit.register(remove_scratch_directories)
    _SCRATCH.append(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))
    return _SCRATCH[-1]


def remove_scratch_directories() -> None:
    """Remove this process's scratch directories (at exit; call it before ``os._exit``)."""
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)

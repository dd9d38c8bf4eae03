"""Writing files safely, for callbacks written outside the package.

``atomic_write`` leaves a path either the old file or the new one (written to a temporary file,
flushed to disk, renamed into place); ``write_error`` turns an ``OSError`` into one naming the
file and the fix. The built-in callbacks write their files with these; they are defined with
the training-state files (``pytorch_accel._checkpointing.files``), the one home of atomic
writes.
"""

from __future__ import annotations

from pytorch_accel._checkpointing.files import atomic_write, write_error

__all__ = ["atomic_write", "write_error"]

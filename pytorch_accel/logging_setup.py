"""The package's logger, ``logging.getLogger("pytorch_accel")``: rank-aware, set up lazily.

Everything the built-in callbacks say goes through this one named logger, so that a user can
silence it (``logging.getLogger("pytorch_accel").setLevel(logging.WARNING)``), redirect it
(add a handler of their own) or format it (configure logging before training).

Nothing happens at import. When a run starts, the callbacks that log call ``setup_logging``,
which, the first time, keeps records from every process but the main one (a filter on the
logger) and sets the logger's level to ``INFO`` if nobody set one; and, each time, if neither
this logger nor the root logger has a handler (a plain script that configured no logging),
adds one that writes the bare message to standard output. A program that configured logging
(``logging.basicConfig(...)``, a handler on the root or on this logger) gets no extra handler:
its own handlers show the lines.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

__all__ = [
    "CONSOLE_HANDLER_NAME",
    "LOGGER_NAME",
    "MainProcessFilter",
    "get_logger",
    "is_main_process",
    "setup_logging",
]

LOGGER_NAME = "pytorch_accel"
"""The name of the package's logger."""

CONSOLE_HANDLER_NAME = "pytorch_accel.console"
"""The name of the handler ``setup_logging`` adds (``handler.get_name()``)."""


def get_logger() -> logging.Logger:
    """Return the package's logger (without setting anything up).

    Returns:
        ``logging.getLogger("pytorch_accel")``.
    """
    return logging.getLogger(LOGGER_NAME)


class MainProcessFilter(logging.Filter):
    """Let records through on the main process only (of the whole run, not of each machine).

    Before accelerate's state exists (no ``Accelerator`` created yet), the ``RANK`` variable of
    the launcher decides; without one, the process is the main one.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Return whether this process is the main one."""
        return is_main_process()


def is_main_process() -> bool:
    """Return whether this is the run's main process (rank 0).

    Returns:
        accelerate's ``is_main_process`` once an ``Accelerator`` exists, else ``RANK == 0``.
    """
    from accelerate.state import PartialState

    if PartialState._shared_state:  # initialised: ask accelerate (no collective involved)
        return bool(PartialState().is_main_process)
    rank = os.environ.get("RANK", "0")
    return not rank.isdigit() or int(rank) == 0


class _StandardOutputHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stdout`` is when a record is emitted (it may be redirected)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.set_name(CONSOLE_HANDLER_NAME)

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass


def setup_logging() -> logging.Logger:
    """Make the package's logger show its ``INFO`` lines on the main process (see the module).

    Idempotent and cheap: the callbacks that log call it when each run starts.

    Returns:
        The package's logger.
    """
    logger = get_logger()
    if not any(isinstance(existing, MainProcessFilter) for existing in logger.filters):
        logger.addFilter(MainProcessFilter())
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(_StandardOutputHandler())
    return logger

"""The package's logger (``pytorch_accel.tracking`` defines it; this import path is kept)."""

from __future__ import annotations

from pytorch_accel.tracking import (
    CONSOLE_HANDLER_NAME,
    LOGGER_NAME,
    MainProcessFilter,
    get_logger,
    is_main_process,
    setup_logging,
)

__all__ = [
    "CONSOLE_HANDLER_NAME",
    "LOGGER_NAME",
    "MainProcessFilter",
    "get_logger",
    "is_main_process",
    "setup_logging",
]

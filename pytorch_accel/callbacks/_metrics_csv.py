"""The per-epoch metrics CSV file: written atomically, read back for plotting.

Private: used by ``TrackingCallback`` (writing) and ``plot_metrics`` (reading).

The format: a header row ``epoch,<metric>,<metric>,...`` with the metric names in
alphabetical order, then one row per epoch in increasing order; a metric without a value in
an epoch has an empty cell. Floats are written with ``repr``, so they read back exactly.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["EPOCH_COLUMN", "read_metrics_csv", "write_metrics_csv"]

EPOCH_COLUMN = "epoch"
"""The name of the first column."""


def write_metrics_csv(rows: Mapping[int, Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``{epoch: {metric: value}}`` to ``path``, replacing the file atomically.

    The table goes to a temporary file in the same directory, which is then renamed over
    ``path``: a reader sees the old file or the new one, never a partial one.

    Args:
        rows: The metrics of each epoch.
        path: The CSV file; its directory is created if needed.

    Returns:
        The path written.
    """
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    names = sorted({name for row in rows.values() for name in row} - {EPOCH_COLUMN})
    temporary = destination.with_name(f".{destination.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow([EPOCH_COLUMN, *names])
            for epoch in sorted(rows):
                row = rows[epoch]
                writer.writerow([epoch, *(_cell(row.get(name)) for name in names)])
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)
    return destination


def read_metrics_csv(path: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Read a metrics CSV file into ``{metric: [(epoch, value), ...]}`` (numeric cells only).

    Args:
        path: A file written by ``write_metrics_csv`` (or any CSV with an ``epoch`` column).

    Returns:
        The numeric values of each metric column, in file order; empty and non-numeric
        cells are skipped.

    Raises:
        ValueError: If the file has no ``epoch`` column.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or EPOCH_COLUMN not in reader.fieldnames:
            raise ValueError(
                f"read_metrics_csv: {os.fspath(path)!r} has no {EPOCH_COLUMN!r} column; "
                "pass a file written by TrackingCallback."
            )
        series: dict[str, list[tuple[int, float]]] = {
            name: [] for name in reader.fieldnames if name != EPOCH_COLUMN
        }
        for row in reader:
            epoch = int(row[EPOCH_COLUMN])
            for name, points in series.items():
                value = _number(row.get(name))
                if value is not None:
                    points.append((epoch, value))
    return series


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def _number(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None

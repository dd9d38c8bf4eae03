"""The metrics CSV files: written atomically (or appended to), read back for plotting.

Private: used by ``TrackingCallback`` (writing) and ``plot_metrics`` (reading).

The format: a header row ``epoch,<metric>,<metric>,...`` with the metric names in
alphabetical order, then one row per epoch in increasing order; a metric without a value in
an epoch has an empty cell. Floats are written with ``repr``, so they read back exactly. The
step-level file is the same with a ``step`` column (the update count) instead of ``epoch``.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytorch_accel.files import atomic_write

__all__ = [
    "EPOCH_COLUMN",
    "STEP_COLUMN",
    "UPDATE_COLUMN",
    "append_metrics_row",
    "append_metrics_rows",
    "metrics_csv_index",
    "read_metrics_csv",
    "read_metrics_rows",
    "write_metrics_csv",
]

EPOCH_COLUMN = "epoch"
"""The name of the first column of the per-epoch file."""

STEP_COLUMN = "step"
"""The name of the first column of the step-level file."""

UPDATE_COLUMN = "update"
"""The per-epoch file's column of the run's update count at each epoch's end (not a metric),
written by ``TrackingCallback(epoch_x_axis="update")``."""


def write_metrics_csv(
    rows: Mapping[int, Mapping[str, Any]],
    path: str | os.PathLike[str],
    index_column: str = EPOCH_COLUMN,
) -> None:
    """Write ``{epoch: {metric: value}}`` (or by step) to ``path``, replacing it atomically."""
    names = sorted({name for row in rows.values() for name in row} - {index_column})
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow([index_column, *names])
    for epoch in sorted(rows):
        writer.writerow([epoch, *(_cell(rows[epoch].get(name)) for name in names)])
    atomic_write(Path(path), table.getvalue())


def append_metrics_row(
    path: str | os.PathLike[str], index: int, row: Mapping[str, Any], names: list[str]
) -> None:
    """Append the row of step ``index`` to a file written with the metric columns ``names``."""
    append_metrics_rows(path, [(index, row)], names)


def append_metrics_rows(
    path: str | os.PathLike[str],
    rows: Sequence[tuple[int, Mapping[str, Any]]],
    names: list[str],
) -> None:
    """Append ``(step, row)`` pairs, in order, to a file written with the metric columns ``names``.

    The file is opened once and the rows written in one write, each a complete line: a
    process killed during it leaves at most the last row cut short, which
    ``read_metrics_rows`` stops at.
    """
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    for index, row in rows:
        writer.writerow([index, *(_cell(row.get(name)) for name in names)])
    with open(path, "a", newline="", encoding="utf-8") as handle:
        handle.write(table.getvalue())


def read_metrics_csv(path: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Read a metrics CSV file into ``{metric: [(epoch, value), ...]}`` (numeric cells only).

    The pairs are ``(step, value)`` for the step-level file.

    Raises:
        ValueError: If the file has neither an ``epoch`` nor a ``step`` column.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        index = metrics_csv_index(reader.fieldnames)
        if index is None or reader.fieldnames is None:
            raise ValueError(
                f"read_metrics_csv: {os.fspath(path)!r} has no {EPOCH_COLUMN!r} column; "
                "pass a file written by TrackingCallback."
            )
        series: dict[str, list[tuple[int, float]]] = {
            name: [] for name in reader.fieldnames if name not in (index, UPDATE_COLUMN)
        }
        for row in reader:
            epoch = int(row[index])
            for name, points in series.items():
                value = _number(row.get(name))
                if value is not None:
                    points.append((epoch, value))
    return series


def read_metrics_rows(
    path: str | os.PathLike[str], index_column: str = EPOCH_COLUMN
) -> dict[int, dict[str, str]]:
    """Read back ``{index: {metric: cell}}`` (non-empty cells, as written) for a resumed run.

    Only the complete rows of increasing index are read: the reading stops at the first row
    that is not (a row cut short by a killed process, say). Empty if there is no such file or
    its first column is not ``index_column``.
    """
    if not os.path.isfile(path):
        return {}
    rows: dict[int, dict[str, str]] = {}
    last = -1
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        names = reader.fieldnames or []
        if not names or names[0] != index_column:
            return {}
        for row in reader:
            index = row[index_column]
            complete = None not in row and all(row.get(name) is not None for name in names)
            if not complete or not index.isdigit() or int(index) <= last:
                break
            last = int(index)
            rows[last] = {name: text for name, text in row.items() if name != index_column and text}
    return rows


def metrics_csv_index(fieldnames: Sequence[str] | None) -> str | None:
    """The index column of a metrics file's header: ``epoch``, ``step`` or ``None``."""
    columns = fieldnames or ()
    return next((name for name in (EPOCH_COLUMN, STEP_COLUMN) if name in columns), None)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else value


def _number(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None

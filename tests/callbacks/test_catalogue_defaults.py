"""Every callback's arguments and their defaults are stated in docs/callback-catalogue.md.

The table between the ``defaults`` markers of that page is generated from the callbacks'
signatures (``python tests/callbacks/test_catalogue_defaults.py`` rewrites it), and this test
fails when the two differ, so a changed default cannot go unstated.
"""

from __future__ import annotations

import enum
import inspect
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "callback-catalogue.md"
START, END = "<!-- defaults:start -->", "<!-- defaults:end -->"


def arguments(callback: type) -> str:
    """The constructor's arguments as ``name=default`` (``name`` when required).

    A path default that follows the trainer's run directory (a ``DefaultPath``) says so.
    """
    from pytorch_accel.outputs import DefaultPath

    if "__init__" not in {name for klass in callback.__mro__[:-1] for name in vars(klass)}:
        return "(none)"
    parts = []
    for parameter in list(inspect.signature(callback.__init__).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        shown = parameter.name
        if parameter.default is not parameter.empty:
            shown += f"={shown_default(parameter.default)}"
        follows = isinstance(parameter.default, DefaultPath)
        parts.append(f"`{shown}`" + (" (under `run_dir`)" if follows else ""))
    return ", ".join(parts) or "(none)"


def shown_default(value: object) -> str:
    """``repr(value)``, with enum members (``signal.SIGTERM``) as they are written in code."""
    if isinstance(value, tuple):
        inner = ", ".join(shown_default(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, enum.Enum):
        return f"{type(value).__module__}.{value.name}"
    return repr(value)


def table() -> str:
    from pytorch_accel import callbacks
    from pytorch_accel.callbacks import TrainerCallback

    rows = ["| Callback | Arguments and defaults |", "| --- | --- |"]
    for name in sorted(callbacks.__all__):
        value = getattr(callbacks, name)
        callback = inspect.isclass(value) and issubclass(value, TrainerCallback)
        if callback and value is not TrainerCallback:
            rows.append(f"| `{name}` | {arguments(value)} |")
    return "\n".join(rows)


def page_with_table(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def test_every_callbacks_defaults_are_stated_on_the_catalogue_page() -> None:
    text = PAGE.read_text()
    assert text == page_with_table(text), (
        "docs/callback-catalogue.md's defaults table is out of date: run "
        "`python tests/callbacks/test_catalogue_defaults.py`"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parents[1]))
    PAGE.write_text(page_with_table(PAGE.read_text()))

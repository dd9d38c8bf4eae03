"""Where callbacks write files: an interface of its own, beside the events of ``TrainerCallback``.

A callback that writes files implements one or both of two small protocols, by defining the
method (no base class needed):

- ``RedirectsOutputs.redirect_outputs``: ``train(dry_run=...)`` points its files into a
  directory of the dry run's meanwhile, so a dry run leaves the user's files as they were;
- ``PlacesOutputs.place_outputs``: with ``Trainer(output_dir=...)``, the files whose location
  the user left at its default (a ``DefaultPath``, recorded in a ``RunPaths``) go under the
  run directory.

The trainer reaches them through ``redirect_outputs`` and ``place_outputs`` here, which do
nothing for a callback that does not implement them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "DefaultPath",
    "PlacesOutputs",
    "RedirectsOutputs",
    "RunPaths",
    "place_outputs",
    "redirect_outputs",
    "redirected_paths",
]


@runtime_checkable
class RedirectsOutputs(Protocol):
    """A callback whose files a dry run can point elsewhere."""

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write this callback's files under ``directory`` while the returned context is open.

        ``train(dry_run=...)`` enters it for every callback, with a directory per callback, so
        a dry run leaves the user's files as they were. A callback that writes files implements
        it, usually with ``redirected_paths``; one that does not writes where it always does.

        Args:
            directory: An empty directory of this callback's own (it may not exist yet).

        Returns:
            A context manager; its ``__exit__`` puts the callback's own locations back.

        Example:
            ```python
            def redirect_outputs(self, directory):
                return redirected_paths(self, directory, "save_path")
            ```
        """


@runtime_checkable
class PlacesOutputs(Protocol):
    """A callback whose default file locations follow the trainer's run directory."""

    def place_outputs(self, run_dir: Path) -> None:
        """Put the files whose location the user left at its default under ``run_dir``.

        With ``Trainer(output_dir=...)``, the trainer calls it with ``trainer.run_dir`` at the
        start of every ``train()`` and ``evaluate()``, before any event; without ``output_dir``
        it is never called. A callback whose path arguments default to ``DefaultPath`` values
        records them in a ``RunPaths`` and places that: a path the
        user passed (or assigned since) stays where it is.

        Args:
            run_dir: The run's directory (it may not exist yet).

        Example:
            ```python
            def __init__(self, out_dir=DefaultPath("results")):
                self.out_dir = Path(out_dir)
                self._run_paths = RunPaths(out_dir=out_dir)

            def place_outputs(self, run_dir):
                self._run_paths.place(self, run_dir)
            ```
        """


def redirect_outputs(callback: object, directory: Path) -> contextlib.AbstractContextManager[None]:
    """``callback``'s files under ``directory`` while the context is open (if it has any)."""
    if isinstance(callback, RedirectsOutputs):
        return callback.redirect_outputs(directory)
    return contextlib.nullcontext()


def place_outputs(callback: object, run_dir: Path) -> None:
    """Put ``callback``'s files left at their default under ``run_dir`` (if it has any)."""
    if isinstance(callback, PlacesOutputs):
        callback.place_outputs(run_dir)


@contextlib.contextmanager
def redirected_paths(owner: object, directory: Path, *names: str) -> Iterator[None]:
    """Point ``owner``'s path attributes ``names`` into ``directory``, then put them back.

    For ``RedirectsOutputs.redirect_outputs``: each attribute holding a path (``None`` is left
    alone) becomes the same file name in ``directory``, of the same type.
    """
    saved = {name: getattr(owner, name) for name in names}
    for name, value in saved.items():
        if isinstance(value, (str, os.PathLike)):
            new = directory / Path(value).name
            setattr(owner, name, new if isinstance(value, Path) else os.fspath(new))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


class DefaultPath(str):
    """A path argument's default, which follows the trainer's run directory.

    Without ``Trainer(output_dir=...)`` it is the relative path it spells; with it,
    ``RunPaths.place`` puts it under ``trainer.run_dir``. A path the user passes (a plain
    ``str`` or ``Path``) is never moved, even when it spells the same name.
    """

    __slots__ = ()


class RunPaths:
    """Which of a callback's path attributes follow the run directory, for ``place_outputs``.

    Create it in the constructor with the path arguments as they were received: only the
    ``DefaultPath`` values follow the run directory.

    Args:
        **given: Each path attribute's name and the argument it was set from.
    """

    def __init__(self, **given: object) -> None:
        self._defaults = {
            name: Path(value) for name, value in given.items() if isinstance(value, DefaultPath)
        }
        self._placed: dict[str, Path] = dict(self._defaults)

    def follows_run_dir(self, name: str) -> bool:
        """Whether the attribute ``name`` was left at its default (a ``DefaultPath``)."""
        return name in self._defaults

    def place(self, owner: object, run_dir: Path) -> None:
        """Set each defaulted attribute of ``owner`` to its default path under ``run_dir``.

        An attribute that no longer holds the path this object last gave it (the user set it,
        or a dry run redirects it meanwhile) is left alone.
        """
        for name, default in self._defaults.items():
            current = getattr(owner, name)
            if not isinstance(current, (str, os.PathLike)) or Path(current) != self._placed[name]:
                continue
            placed = run_dir / default
            setattr(owner, name, placed if isinstance(current, Path) else os.fspath(placed))
            self._placed[name] = placed

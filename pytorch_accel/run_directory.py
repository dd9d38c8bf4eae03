"""One output directory per run: ``Trainer(output_dir=...)`` and ``train(run_name=...)``.

With an output root, each run has a directory ``<output_dir>/<run name>``
(``Trainer.run_dir``) under which the callbacks put the files whose paths the user left at
their defaults (``outputs.PlacesOutputs``). Without one, nothing here does anything.

- **The run name** is the main process's local time when the trainer is created
  (``2026-11-24_19-40-05``, ``-2``... when taken), shared with every process; or
  ``train(run_name=...)``, for that call and later ones. Stages of one trainer share it.
- **``train(resume_from="latest")``** without a ``run_name`` continues the run that holds the
  newest complete training state under ``output_dir``, so a relaunched job writes on in the
  directory of the run it resumes.
- **Another run's directory is never written to**: a ``train()`` that does not resume,
  in a directory that holds files this trainer did not write there (another trainer's run of
  the same ``run_name``), is refused on every process, as is a run directory that is a link
  out of the output root. The main process looks; every process raises the same error.
- **A dry run** chooses and creates nothing: meanwhile ``run_dir`` is a directory inside the
  dry run's temporary one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from pytorch_accel._checkpointing.store import newest_training_state
from pytorch_accel._checks import check_path
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.distributed import main_process_object
from pytorch_accel.outputs import place_outputs
from pytorch_accel.tracking import setup_logging

__all__ = ["RUN_NAME_FORMAT", "RunDirectory", "new_run_name"]

RUN_NAME_FORMAT = "%Y-%m-%d_%H-%M-%S"
"""The ``time.strftime`` format of the default run names (local time)."""

_HANDED_OUT: set[Path] = set()  # run directories named by this process, not created yet


def new_run_name(output_dir: Path) -> str:
    """A new run name: the local time, with ``-<n>`` if that directory exists or was handed out."""
    stamp = time.strftime(RUN_NAME_FORMAT)
    name, number = stamp, 1
    while (output_dir / name).exists() or (output_dir / name).absolute() in _HANDED_OUT:
        number += 1
        name = f"{stamp}-{number}"
    _HANDED_OUT.add((output_dir / name).absolute())
    return name


class RunDirectory:
    """The trainer's output root and current run name, and where its callbacks write.

    Args:
        output_dir: ``Trainer``'s ``output_dir`` (``None``: no run directories).
        accelerator: The trainer's accelerator (which process creates directories).
    """

    def __init__(self, output_dir: str | os.PathLike[str] | None, accelerator: Accelerator):
        check_path("Trainer", "output_dir", output_dir, allow_none=True, directory=True)
        self.output_dir = None if output_dir is None else Path(output_dir)
        self._accelerator = accelerator
        self._aside: Path | None = None  # a dry run's stand-in for the run directory
        self.name: str | None = None
        self._started: set[str] = set()  # the runs this trainer has trained in
        if self.output_dir is not None:
            main = accelerator.is_main_process
            self.name = main_process_object(new_run_name(self.output_dir) if main else None)

    @property
    def path(self) -> Path | None:
        """``<output_dir>/<name>`` (a dry run's directory meanwhile); ``None`` without a root."""
        if self._aside is not None:
            return self._aside
        if self.output_dir is None or self.name is None:
            return None
        return self.output_dir / self.name

    def start_training(
        self,
        callbacks: Iterable[Any],
        run_name: str | None,
        resume_from: str | os.PathLike[str] | None,
    ) -> None:
        """At the start of ``train()``: choose the run, create its directory, place the outputs."""
        if self.output_dir is None:
            return
        callbacks = list(callbacks)
        if self._aside is None:
            if run_name is not None:
                self.name = run_name
            elif resume_from is not None and os.fspath(resume_from) == "latest":
                self._continue_newest_run(callbacks)
            path = self.path
            assert path is not None
            assert self.name is not None
            refusal = None
            if self._accelerator.is_main_process:
                refusal = self._refusal(path, run_name, resume=resume_from is not None)
                if refusal is None:
                    path.mkdir(parents=True, exist_ok=True)
            refusal = main_process_object(refusal)  # every process raises the same error
            if refusal is not None:
                raise ValueError(refusal)
            self._started.add(self.name)
            setup_logging().info("run directory: %s", path)
        self.place(callbacks)

    def _refusal(self, path: Path, run_name: str | None, *, resume: bool) -> str | None:
        """Why ``train()`` must not write in ``path`` (``None``: it may); on the main process.

        A link out of the output root is refused; so is a directory holding files that this
        trainer did not write there, unless the call resumes (continuing that run).
        """
        assert self.output_dir is not None
        assert self.name is not None
        where = f"Trainer.train: run_name={self.name!r}"
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(self.output_dir.resolve()):
                return (
                    f"{where}: the run directory {str(path)!r} is a link to {str(target)!r}, "
                    f"outside the output directory {str(self.output_dir)!r}; outputs are never "
                    "written through a link out of it. Pass another run_name, or remove the "
                    "link."
                )
        if self.name in self._started or resume or not path.is_dir():
            return None
        if not any(path.iterdir()):
            return None  # an empty directory: nothing to overwrite
        named = "run_name" if run_name is not None else "the run name"
        return (
            f"{where}: the run directory {str(path)!r} already holds another run's files "
            "(training states, run record, metrics), which this run would overwrite. Pass "
            f"another {named} for a new run, resume_from='latest' (or a training state) to "
            "continue that run in its directory, or move or delete that directory first to "
            "start it again."
        )

    def place(self, callbacks: Iterable[Any]) -> None:
        """Call every callback's ``place_outputs`` with the run directory (if there is one)."""
        path = self.path
        if path is None:
            return
        for callback in callbacks:
            if isinstance(callback, TrainerCallback):
                place_outputs(callback, path)

    @contextlib.contextmanager
    def set_aside(self, directory: Path, callbacks: Iterable[Any]) -> Iterator[None]:
        """Make ``directory`` the run directory meanwhile (a dry run's), then the run's again."""
        if self.output_dir is None:
            yield
            return
        callbacks = list(callbacks)
        self._aside = directory
        try:
            yield
        finally:
            self._aside = None
            self.place(callbacks)

    def _continue_newest_run(self, callbacks: list[Any]) -> None:
        """Take the name of the run under the output root with the newest training state."""
        current = self.path
        assert self.output_dir is not None
        assert current is not None
        self.place(callbacks)
        states_dirs = [
            states
            for callback in callbacks
            if isinstance(callback, TrainerCallback)
            and (states := callback.training_states_dir()) is not None
        ]
        if not states_dirs or not states_dirs[0].is_relative_to(current):
            return  # no states, or an explicit save_dir: searched as given
        relative = states_dirs[0].relative_to(current)
        name = None
        if self._accelerator.is_main_process and self.output_dir.is_dir():
            runs = [run for run in self.output_dir.iterdir() if not run.name.startswith(".")]
            newest = newest_training_state(run / relative for run in runs if run.is_dir())
            name = None if newest is None else newest.relative_to(self.output_dir).parts[0]
        name = main_process_object(name)
        if name is not None and name != self.name:
            setup_logging().info(
                f"resume_from='latest': continuing the run {name!r}, which holds the newest "
                f"training state under {str(self.output_dir)!r}."
            )
            self.name = name

"""A run report that opens as one page: ``report.html``, written at each epoch end."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._metrics_csv import read_metrics_csv
from pytorch_accel.callbacks._report_html import Panel, ReportContent, group_panels, render
from pytorch_accel.callbacks._run_info import environment, jsonable, run_configuration
from pytorch_accel.callbacks.defaults import precision_text
from pytorch_accel.checks import fail
from pytorch_accel.files import atomic_write
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import reported_float

if TYPE_CHECKING:
    from pytorch_accel.tools.lr_finder import LRFinderResult
    from pytorch_accel.trainer import Trainer

__all__ = ["RunReportCallback"]

STEP_METRICS_FILE = "metrics_steps.csv"
"""The step-level metrics a ``RunRecordCallback`` (or ``TrackingCallback``) writes beside it."""


class RunReportCallback(TrainerCallback):
    """Write ``report.html``: the run on one page, self-contained, updated at each epoch end.

    The page holds the curves of every numeric metric in the run history by epoch (a
    metric's ``train_`` and ``eval_`` series on one panel), the step-level curves by update
    when a ``metrics_steps.csv`` lies beside the report (``RunRecordCallback`` and
    ``TrackingCallback(csv_path=...)`` write it), the learning-rate finder's curve when one is
    given, the run's status (running at epoch k of n, completed, stopped or failed), its
    config and its environment (versions, devices, processes, precision). The curves are
    inline SVG drawn without any dependency; the page has no script and loads nothing.

    Written by the main process only, at each ``on_training_run_epoch_end`` and at the run's
    end (also after a stop or an exception): the values are gathered on the training thread
    (plain numbers, no tensor read), and the page is drawn and written atomically in a
    background thread, so the next epoch does not wait for it. A failed write warns
    (``RuntimeWarning``) instead of stopping the run. Order ``120``: after
    ``RunRecordCallback`` has written the epoch's rows.

    Args:
        path: The page to write (in ``trainer.run_dir`` when left out and the trainer has an
            ``output_dir``).
        lr_finder: A ``find_lr`` result to draw (its smoothed loss by learning rate, with the
            suggestion marked).
        title: The page's title; default: the name of the page's directory.

    Raises:
        TypeError: If ``lr_finder`` is not an ``LRFinderResult``.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer, output_dir="runs",
                          callbacks=(*DEFAULT_CALLBACKS, RunRecordCallback(), RunReportCallback()))
        trainer.train(train_dataset, num_epochs=10, eval_dataset=eval_dataset)
        # runs/<run name>/report.html
        ```
    """

    order = 120
    may_stop_training = False

    def __init__(
        self,
        path: str | os.PathLike[str] = DefaultPath("report.html"),
        lr_finder: LRFinderResult | None = None,
        title: str | None = None,
    ) -> None:
        from pytorch_accel.tools.lr_finder import LRFinderResult

        if lr_finder is not None and not isinstance(lr_finder, LRFinderResult):
            fail(
                TypeError,
                "RunReportCallback",
                "lr_finder",
                lr_finder,
                "a result of find_lr or None",
                "Pass the value trainer.find_lr(...) returned.",
            )
        self.path = Path(path)
        self._run_paths = RunPaths(path=path)
        self.lr_finder = lr_finder
        self.title = title
        self._sections: dict[str, Any] = {}
        self._status = "not started"
        self._thread: threading.Thread | None = None

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write the page under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "path")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the page under ``run_dir`` if ``path`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Note the run's config and environment; write the page (no curves yet)."""
        if not trainer.accelerator.is_main_process:
            return
        setting = {
            "processes": trainer.accelerator.num_processes,
            "precision": precision_text(trainer),
        }
        self._sections = {
            "Run config": jsonable(run_configuration(trainer)),
            "Environment": {**setting, **jsonable(environment(trainer))},
        }
        self._status = "started"
        self._write(trainer)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Redraw the page with the epoch's values, in the background."""
        if not trainer.accelerator.is_main_process:
            return
        config = trainer.run_config
        epochs = None if config is None else config.num_epochs
        of = "" if epochs is None else f" of this run's {epochs}"
        self._status = (
            f"running: epoch {trainer.run_history.current_epoch} done{of}, "
            f"{trainer.num_updates} updates"
        )
        self._write(trainer)

    def on_stop_training_error(self, trainer: Trainer, **kwargs: Any) -> None:
        """Note the stop, for the page written at the run's end."""
        self._status = f"stopped after {trainer.num_updates} updates: {kwargs.get('error', '')}"

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Write the final page and wait for it."""
        if not trainer.accelerator.is_main_process:
            return
        if not self._status.startswith("stopped"):
            self._status = f"completed at update {trainer.num_updates}"
        self._write(trainer)
        self.wait()

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """Write the page with the failure, and wait for it."""
        if kwargs.get("where", "train") != "train" or not trainer.accelerator.is_main_process:
            return
        kind = "interrupted" if isinstance(exception, KeyboardInterrupt) else "failed"
        self._status = f"{kind} after {trainer.num_updates} updates: {exception!r}"
        self._write(trainer)
        self.wait()

    def wait(self) -> None:
        """Wait until the page being written, if any, is on disk."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def _write(self, trainer: Trainer) -> None:
        """Gather the values here; draw and write the page in a background thread."""
        self.wait()  # one write at a time, in order
        history = trainer.run_history
        epoch_series = {}
        for name in history.get_metric_names():
            values = [reported_float(value) for value in history.get_metric_values(name)]
            points = [(float(i), v) for i, v in enumerate(values, start=1) if v is not None]
            if points:
                epoch_series[name] = points
        title = self.title or self.path.resolve().parent.name or "training run"
        status, sections, path = self._status, dict(self._sections), self.path
        finder = self.lr_finder
        self._thread = threading.Thread(
            target=self._draw_and_write,
            args=(path, title, status, sections, epoch_series, finder),
            name="pytorch_accel-run-report",
            daemon=True,
        )
        self._thread.start()

    def _draw_and_write(
        self,
        path: Path,
        title: str,
        status: str,
        sections: dict[str, Any],
        epoch_series: dict[str, list[tuple[float, float]]],
        finder: LRFinderResult | None,
    ) -> None:
        try:
            panels = group_panels(epoch_series, "epoch")
            steps = path.parent / STEP_METRICS_FILE
            if steps.is_file():
                with contextlib.suppress(ValueError, OSError):  # a row being appended: later
                    step_series = {
                        name: [(float(x), y) for x, y in points]
                        for name, points in read_metrics_csv(steps).items()
                    }
                    panels += group_panels(step_series, "update")
            if finder is not None:
                pairs = zip(finder.lrs, finder.smoothed_losses, strict=False)
                curve = [(x, y) for x, y in pairs if math.isfinite(y)]
                panels.append(
                    Panel(
                        "learning-rate finder (smoothed loss)",
                        "learning rate",
                        {"loss": curve},
                        log_x=True,
                        marker=finder.suggestion,
                    )
                )
            page = render(ReportContent(title, status, panels, sections))
            atomic_write(path, page)
        except Exception as error:  # a report never stops the run
            warnings.warn(
                f"RunReportCallback: could not write {str(path)!r}: {error!r}",
                RuntimeWarning,
                stacklevel=1,
            )

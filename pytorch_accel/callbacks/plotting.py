"""Plot the metric curves of a run to a PNG file (needs matplotlib: the ``plot`` extra)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._metrics_csv import STEP_COLUMN, metrics_csv_index, read_metrics_csv
from pytorch_accel.checks import check_bool
from pytorch_accel.files import atomic_write
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import RunHistory, reported_float

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pytorch_accel.protocols import TrainerLike

__all__ = ["PlotMetricsCallback", "plot_metrics"]

_INSTALL_HINT = 'Plotting metrics needs matplotlib: pip install "pytorch-accel[plot]".'

Series = dict[str, list[tuple[int, float]]]


def plot_metrics(
    source: RunHistory | str | os.PathLike[str],
    path: str | os.PathLike[str] = "metrics.png",
    metric_names: Iterable[str] | None = None,
) -> Path:
    """Draw one small plot per metric, value against epoch, and save them as one image.

    From a run history, the i-th value of each metric is drawn at epoch i (metrics recorded
    once per epoch); from a CSV file written by ``TrackingCallback``, at its ``epoch`` column
    (or the step-level file's ``step`` column, the update count). Only numeric values are
    drawn. The image is written atomically, in the format of ``path``'s suffix. matplotlib is
    used without pyplot: no window opens and the global backend is untouched.

    Args:
        source: A run history (e.g. ``trainer.run_history``) or the path of a metrics CSV.
        path: The image file to write.
        metric_names: The metrics to draw; all numeric ones by default.

    Returns:
        The path written.

    Raises:
        ImportError: If matplotlib is not installed.
        ValueError: If there is no numeric metric to draw.

    Example:
        ```python
        trainer.train(train_dataset, num_epochs=10, eval_dataset=eval_dataset)
        plot_metrics(trainer.run_history, "curves.png")
        plot_metrics("metrics.csv", "curves.png", metric_names=["eval_loss_epoch"])
        ```
    """
    figure_class = _figure_class()
    series, x_label = _series(source)
    if metric_names is not None:
        series = {name: series.get(name, []) for name in metric_names}
    series = {name: points for name, points in series.items() if points}
    if not series:
        raise ValueError(
            "plot_metrics: there is no numeric metric to draw. Record metrics in the run "
            "history, or check metric_names against the recorded names."
        )
    figure = _draw(figure_class, series, x_label)
    destination = Path(path)
    file_format = destination.suffix.lstrip(".") or "png"
    atomic_write(destination, lambda handle: figure.savefig(handle, format=file_format))
    return destination


class PlotMetricsCallback(TrainerCallback):
    """Write a PNG of the run history's metric curves after each epoch and at the end of a run.

    Drawn by the main process with ``plot_metrics`` at each ``on_training_run_epoch_end``
    (unless ``every_epoch=False``) and at ``on_training_run_end`` (also after an early stop).
    Needs matplotlib (``pip install "pytorch-accel[plot]"``), checked when the callback is
    created. Order ``100``: it runs after the callbacks that record metrics.

    Args:
        path: The image file to write (in ``trainer.run_dir`` when left out and the trainer
            has an ``output_dir``).
        metric_names: The metrics to draw; all numeric ones by default.
        every_epoch: Also draw after each epoch, not only at the end of the run.

    Raises:
        ImportError: If matplotlib is not installed.
        TypeError: If ``every_epoch`` is not a bool.

    Example:
        ```python
        trainer = Trainer(model, loss_func, optimizer,
                          callbacks=(*DEFAULT_CALLBACKS, PlotMetricsCallback("curves.png")))
        ```
    """

    order = 100
    may_stop_training = False

    def __init__(
        self,
        path: str | os.PathLike[str] = DefaultPath("metrics.png"),
        metric_names: Iterable[str] | None = None,
        every_epoch: bool = True,
    ) -> None:
        _figure_class()  # fail now, not after hours of training
        fix = "Pass every_epoch=False to draw only at the end of the run."
        check_bool("PlotMetricsCallback", "every_epoch", every_epoch, fix=fix)
        self.path = Path(path)
        self._run_paths = RunPaths(path=path)
        self.metric_names = None if metric_names is None else list(metric_names)
        self.every_epoch = every_epoch

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write the plot under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "path")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the plot under ``run_dir`` if ``path`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def on_training_run_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Draw the curves so far, if ``every_epoch``."""
        if self.every_epoch:
            with contextlib.suppress(ValueError):  # metric_names not recorded yet: later
                self._draw(trainer)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Draw the curves, if any metric was recorded."""
        self._draw(trainer)

    def _draw(self, trainer: TrainerLike) -> None:
        if trainer.accelerator.is_main_process and trainer.run_history.get_metric_names():
            plot_metrics(trainer.run_history, self.path, self.metric_names)


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return Figure


def _series(source: RunHistory | str | os.PathLike[str]) -> tuple[Series, str]:
    if not isinstance(source, RunHistory):
        with open(source, newline="", encoding="utf-8") as handle:
            header = handle.readline().strip().split(",")
        x_label = "update" if metrics_csv_index(header) == STEP_COLUMN else "epoch"
        return read_metrics_csv(source), x_label
    series: Series = {}
    for name in sorted(source.get_metric_names()):
        values = [reported_float(value) for value in source.get_metric_values(name)]
        series[name] = [
            (epoch, value) for epoch, value in enumerate(values, start=1) if value is not None
        ]
    return series, "epoch"


def _draw(figure_class: type[Figure], series: Series, x_label: str) -> Figure:
    columns = min(3, len(series))
    rows = math.ceil(len(series) / columns)
    figure = figure_class(figsize=(4.0 * columns, 3.0 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax, (name, points) in zip(axes, series.items(), strict=False):
        epochs, values = zip(*points, strict=True)
        ax.plot(epochs, values, marker="o" if len(epochs) <= 50 else None)
        ax.set_title(name)
        ax.set_xlabel(x_label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    return figure

"""plot_metrics and PlotMetricsCallback write valid PNG files; the extras import lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_regression_dataset, make_trainer

from pytorch_accel.callbacks.plotting import PlotMetricsCallback, plot_metrics
from pytorch_accel.callbacks.trackers import TrackingCallback
from pytorch_accel.tracking import InMemoryRunHistory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000
    assert data[12:16] == b"IHDR"


def test_callback_writes_a_png_at_the_end_of_training(tmp_path: Path) -> None:
    path = tmp_path / "plots" / "curves.png"
    trainer = make_trainer(callbacks=(PlotMetricsCallback(path),))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=8,
    )
    assert_png(path)
    assert [p.name for p in path.parent.iterdir()] == ["curves.png"]  # no temporary file left


def test_plot_from_the_csv_of_tracking_callback(tmp_path: Path) -> None:
    csv_path = tmp_path / "metrics.csv"
    trainer = make_trainer(callbacks=(TrackingCallback(log_with=(), csv_path=csv_path),))
    trainer.train(make_regression_dataset(32), num_epochs=2, per_device_batch_size=8)
    written = plot_metrics(csv_path, tmp_path / "from_csv.png", metric_names=["train_loss_epoch"])
    assert written == tmp_path / "from_csv.png"
    assert_png(written)


def test_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    history = InMemoryRunHistory()
    history.update_metric("labels", "not a number")
    with pytest.raises(ValueError, match=r"no numeric metric"):
        plot_metrics(history, tmp_path / "empty.png")
    history.update_metric("loss", 1.0)
    with pytest.raises(ValueError, match=r"no numeric metric"):
        plot_metrics(history, tmp_path / "empty.png", metric_names=["lost"])
    assert not (tmp_path / "empty.png").exists()


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    with pytest.raises(ImportError, match=r'pip install "pytorch-accel\[plot\]"'):
        PlotMetricsCallback()
    with pytest.raises(ImportError, match=r'pip install "pytorch-accel\[plot\]"'):
        plot_metrics(InMemoryRunHistory())


def test_the_callback_modules_import_their_extras_lazily() -> None:
    code = (
        "import sys; import pytorch_accel.callbacks.metrics, pytorch_accel.callbacks.plotting, "
        "pytorch_accel.callbacks.trackers, pytorch_accel.callbacks.throughput; "
        "heavy = {'matplotlib', 'torchmetrics', 'tensorboard'}; "
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

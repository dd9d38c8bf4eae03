"""RunReportCallback: report.html, one self-contained page, written at each epoch end."""

from __future__ import annotations

import html
import importlib.util
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer, files
from pytorch_accel.callbacks import RunRecordCallback, RunReportCallback, TrainerCallback
from pytorch_accel.callbacks import run_report as run_report_module

CHROMIUM = Path("/usr/bin/chromium")
PICTURES_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate_pictures.py"


class ReadsPageAtEpochEnd(TrainerCallback):
    """Reads the page after the report's epoch-end write (a higher order)."""

    order = 130

    def __init__(self, report: RunReportCallback) -> None:
        self.report = report
        self.pages: list[str] = []

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.report.wait()
        self.pages.append(self.report.path.read_text())


def train_with_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[Trainer, RunReportCallback, ReadsPageAtEpochEnd, list[str]]:
    writers: list[str] = []  # the thread of each write of the page

    def recording_write(path: Any, content: Any) -> Path:
        writers.append(threading.current_thread().name)
        return files.atomic_write(path, content)

    monkeypatch.setattr(run_report_module, "atomic_write", recording_write)
    report = RunReportCallback(**options)
    reader = ReadsPageAtEpochEnd(report)
    record = RunRecordCallback(log_with=(), log_every_n_updates=2, plot=False)
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(record, report, reader),
        output_dir=tmp_path,
    )
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        eval_dataset=make_regression_dataset(8),
        per_device_batch_size=4,
        run_name="run",
    )
    return trainer, report, reader, writers


def test_the_report_is_one_page_with_every_curve_and_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, report, reader, writers = train_with_report(tmp_path, monkeypatch)
    assert report.path == tmp_path / "run" / "report.html"
    page = report.path.read_text()
    # written at the start, at each epoch end and at the end, always off the training thread
    assert len(writers) == 5
    assert all(name == "pytorch_accel-run-report" for name in writers)
    assert "running: epoch 1 done of this run&#x27;s 3, 8 updates" in reader.pages[0]
    assert "completed at update 24" in page
    # by epoch: train and eval losses on one panel; by update: the step-level loss
    assert "By epoch" in page
    assert "By update" in page
    loss_panel = page.split("<figcaption>loss</figcaption>", 1)[1].split("</figure>", 1)[0]
    assert ">train " in loss_panel
    assert ">eval " in loss_panel
    last_eval = trainer.run_history.get_latest_metric("eval_loss_epoch")
    assert f">eval {last_eval:.4g}<" in loss_panel
    assert page.count("<polyline") >= 3  # train and eval by epoch, train by update
    # the run's config and environment, self-contained (no script, nothing loaded)
    text = html.unescape(page)
    assert '"precision": "float32"' in text
    assert '"processes": 1' in text
    assert "num_epochs" in page
    assert "<script" not in page
    assert not re.search(r"(src|href)=", page)


def test_the_learning_rate_finder_is_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model()
    finder = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01))
    result = finder.find_lr(make_regression_dataset(64), per_device_batch_size=8, num_steps=12)
    _, report, _, _ = train_with_report(tmp_path, monkeypatch, lr_finder=result)
    page = report.path.read_text()
    assert "learning-rate finder" in page


@pytest.mark.bad_input
def test_a_bad_lr_finder_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"lr_finder must be a result of find_lr or None"):
        RunReportCallback(lr_finder="lr_find.png")  # type: ignore[arg-type]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium)")
def test_the_page_shows_the_curves_in_a_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_module = pytest.importorskip("PIL.Image")

    _, report, _, _ = train_with_report(tmp_path, monkeypatch)
    screenshot = tmp_path / "report.png"
    screenshot_page(report.path, screenshot)
    image = image_module.open(screenshot).convert("RGB")
    counts = {colour: count for count, colour in image.getcolors(maxcolors=1 << 24) or []}
    total = image.width * image.height
    assert total - counts.get((255, 255, 255), 0) > 0.02 * total  # not blank
    # the curves: the first two series' colours (#1f77b4 and #d62728) are drawn
    assert counts.get((31, 119, 180), 0) > 200
    assert counts.get((214, 39, 40), 0) > 200


def screenshot_page(page: Path, screenshot: Path) -> None:
    """Open ``page`` in headless Chromium and save a 1200x1600 screenshot.

    The same command as the docs' pictures: ``scripts/generate_pictures.screenshot``.
    """
    spec = importlib.util.spec_from_file_location("generate_pictures", PICTURES_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    pictures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pictures)
    pictures.screenshot(page, screenshot, shutil.which("chromium") or str(CHROMIUM))

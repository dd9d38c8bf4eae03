"""Generate the documentation's pictures from real runs: ``python scripts/generate_pictures.py``.

Every picture of docs/images is listed in :data:`PICTURES` (tests/test_docs_pictures.py checks
that the docs reference only those, and that each exists):

- ``run_report.png``: a tiny regression model trains for a few epochs with
  ``RunRecordCallback`` and ``RunReportCallback`` (after a learning-rate range test); its
  ``report.html`` is opened in headless Chromium (Debian's ``chromium`` package) and
  screenshotted.
- ``metrics.png``: the same run's curves, drawn by ``PlotMetricsCallback``.
- ``lr_finder.png``: the range test's plot, ``LRFinderResult.plot``.
- ``console.png``: the console output of the digits example (``make demo``'s script, 5 epochs),
  captured as text and shown by Chromium as a terminal page.

And, last, a picture of the docs themselves, which no page shows (:data:`DOCS_PICTURES`):
``docs_home.png``, the home page of the site ``mkdocs build`` makes with those pictures.

Nothing is drawn by hand: rerun it (``make pictures``) after changing what they show.
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    PlotMetricsCallback,
    RunRecordCallback,
    RunReportCallback,
)

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
PICTURES = ("run_report.png", "metrics.png", "lr_finder.png", "console.png")
DOCS_PICTURES = ("docs_home.png",)
CONSOLE_COMMAND = ("examples/train_digits.py", "--num_epochs", "5")


def regression_data(samples: int, seed: int) -> TensorDataset:
    """A noisy linear regression problem, 8 inputs to 1 output."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    weights = torch.linspace(-1.0, 1.0, 8).unsqueeze(1)
    targets = inputs @ weights + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def run_report(directory: Path, images: Path) -> Path:
    """Train the tiny model with a run record, a report and a plot; return the report's path.

    Also writes ``metrics.png`` and ``lr_finder.png`` into ``images``.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    trainer = Trainer(model, nn.MSELoss(), optimizer)
    finder = trainer.find_lr(regression_data(512, seed=0), per_device_batch_size=16, num_steps=60)
    finder.plot(path=str(images / "lr_finder.png"))
    trainer = Trainer(
        model,
        nn.MSELoss(),
        optimizer,
        callbacks=(
            *DEFAULT_CALLBACKS,
            RunRecordCallback(log_with=(), log_every_n_updates=8, plot=False),
            RunReportCallback(lr_finder=finder, title="tiny regression (generated)"),
            PlotMetricsCallback(images / "metrics.png"),
        ),
        output_dir=directory,
    )
    trainer.train(
        regression_data(512, seed=0),
        num_epochs=6,
        eval_dataset=regression_data(128, seed=1),
        per_device_batch_size=16,
        run_name="run",
    )
    return directory / "run" / "report.html"


def console_page(directory: Path) -> Path:
    """Run the digits example as a user would and write its console output as an HTML page."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, *CONSOLE_COMMAND],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    command = "$ python " + " ".join(CONSOLE_COMMAND)
    text = "\n".join([command, *(done.stderr + done.stdout).splitlines()])
    page = directory / "console.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'><style>"
        "body{margin:0;background:#1e1e1e}"
        "pre{margin:0;padding:14px 18px;color:#d4d4d4;font:14px/1.45 'DejaVu Sans Mono',monospace}"
        "</style><pre>" + html.escape(text) + "</pre>"
    )
    return page


def console_size(page: Path) -> tuple[int, int]:
    """The window that fits the console page: its longest line and its line count."""
    lines = html.unescape(page.read_text().split("<pre>", 1)[1]).splitlines()
    return 40 + 9 * max(len(line) for line in lines), 36 + 21 * len(lines)


def docs_home(directory: Path) -> Path:
    """Build the docs site with ``mkdocs build`` into ``directory``; return its home page."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    subprocess.run(
        [str(mkdocs), "build", "--site-dir", str(directory / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return directory / "site" / "index.html"


def screenshot(
    page: Path, image: Path, chromium: str, size: tuple[int, int] = (1200, 1600)
) -> None:
    """Save a screenshot of ``page`` (``size``: the window, 1200x1600 by default) by Chromium."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={image}",
                f"--window-size={size[0]},{size[1]}",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main() -> None:
    """Write every picture of :data:`PICTURES` into docs/images."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="the images' directory")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("generate_pictures: needs chromium (apt-get install -y chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        page = run_report(Path(directory), args.out)
        screenshot(page, args.out / "run_report.png", chromium)
        console = console_page(Path(directory))
        screenshot(console, args.out / "console.png", chromium, size=console_size(console))
        screenshot(docs_home(Path(directory)), args.out / "docs_home.png", chromium, (1100, 1000))
    for name in (*PICTURES, *DOCS_PICTURES):
        print(args.out / name, (args.out / name).stat().st_size, "bytes")


if __name__ == "__main__":
    main()

"""Generate the documentation's pictures from a real run: ``python scripts/generate_pictures.py``.

Trains a tiny regression model for a few epochs with ``RunRecordCallback`` and
``RunReportCallback`` (after a learning-rate range test), then opens the run's ``report.html``
in headless Chromium (Debian's ``chromium`` package) and saves the screenshot as
``docs/images/run_report.png``. Nothing is drawn by hand: rerun it after changing the report.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    RunRecordCallback,
    RunReportCallback,
)

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def regression_data(samples: int, seed: int) -> TensorDataset:
    """A noisy linear regression problem, 8 inputs to 1 output."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    weights = torch.linspace(-1.0, 1.0, 8).unsqueeze(1)
    targets = inputs @ weights + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def run_report(directory: Path) -> Path:
    """Train the tiny model with a run record and a report; return the report's path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    trainer = Trainer(model, nn.MSELoss(), optimizer)
    finder = trainer.find_lr(regression_data(512, seed=0), per_device_batch_size=16, num_steps=60)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        optimizer,
        callbacks=(
            *DEFAULT_CALLBACKS,
            RunRecordCallback(log_with=(), log_every_n_updates=8, plot=False),
            RunReportCallback(lr_finder=finder, title="tiny regression (generated)"),
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


def screenshot(page: Path, image: Path, chromium: str) -> None:
    """Save a 1200x1600 screenshot of ``page`` taken by headless Chromium."""
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
                "--window-size=1200,1600",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main() -> None:
    """Write docs/images/run_report.png."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="the images' directory")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("generate_pictures: needs chromium (apt-get install -y chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        page = run_report(Path(directory))
        screenshot(page, args.out / "run_report.png", chromium)
    print(args.out / "run_report.png")


if __name__ == "__main__":
    main()
